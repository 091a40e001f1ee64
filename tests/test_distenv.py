"""Rank mapping from launcher variables (no torch)."""

from __future__ import annotations

import pytest

from hpcyolo.distenv import default_port, expand_hostlist, from_environ
from hpcyolo.errors import HpcyoloError


@pytest.mark.parametrize("hostlist, hosts", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("gpu[007-009,011],login1", ["gpu007", "gpu008", "gpu009", "gpu011", "login1"]),
    ("nid[001000-001001]", ["nid001000", "nid001001"]),
    ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
])
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


def slurm(**extra):
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "77"}
    env.update(extra)
    return env


def test_slurm_one_task_per_gpu():
    d = from_environ(slurm())
    assert (d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank) == (3, 1, 4, 2, 1)
    assert (d.master_addr, d.master_port, d.source) == ("node1", default_port(77), "slurm")


def test_step_values_win_over_job_values():
    d = from_environ(slurm(SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="node2", SLURM_STEP_TASKS_PER_NODE="2",
                           SLURM_NODEID="0", MASTER_ADDR="node9", MASTER_PORT="20001"))
    assert (d.world_size, d.local_world_size, d.master_addr, d.master_port) == (2, 2, "node9", 20001)


def test_uneven_tasks_per_node():
    assert from_environ(slurm(SLURM_TASKS_PER_NODE="3(x1),1", SLURM_NODEID="1")).local_world_size == 1


def test_torchrun_wins_over_slurm():
    d = from_environ(slurm(RANK="6", LOCAL_RANK="2", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4", GROUP_RANK="1",
                           MASTER_ADDR="node1", MASTER_PORT="29400", TORCHELASTIC_RUN_ID="77"))
    assert (d.rank, d.local_rank, d.world_size, d.node_rank, d.source) == (6, 2, 8, 1, "torchrun")


def test_single_process_default():
    d = from_environ({})
    assert (d.rank, d.world_size, d.master_addr) == (0, 1, "127.0.0.1")


def test_bad_value_is_a_clear_error():
    with pytest.raises(HpcyoloError, match="SLURM_PROCID='x' is not an integer"):
        from_environ(slurm(SLURM_PROCID="x"))
