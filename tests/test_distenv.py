"""Rank mapping from launcher variables (no torch), its checks, the device
rule, the master's address and the port (one test on a real process group)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from hpcyolo.node import distenv
from hpcyolo.node.distenv import (DistEnv, NodeLayout, check_master, default_port, expand_hostlist, from_environ,
                                  sagemaker_layout)
from hpcyolo.node.local import free_port
from hpcyolo.node.netif import resolve_master
from hpcyolo_trainer.common.devices import device_for, visible_gpus
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.rendezvous import port_in_use_message

HOST = re.escape(socket.gethostname().split(".")[0])


@pytest.fixture(autouse=True)
def no_sagemaker(monkeypatch, tmp_path):
    """from_environ's default resource config path must not leak in from the machine."""
    monkeypatch.setattr(distenv, "SAGEMAKER_RESOURCE_CONFIG", str(tmp_path / "no-resourceconfig.json"))


@pytest.fixture
def fake_dns(monkeypatch):
    """Names resolve from a table (others fail), like /etc/hosts on a cluster."""
    table: dict[str, str] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host in table:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (table[host], 0))]
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        except OSError:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


@pytest.mark.parametrize("hostlist, hosts", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("gpu[007-009,011],login1", ["gpu007", "gpu008", "gpu009", "gpu011", "login1"]),
    ("nid[001000-001001]", ["nid001000", "nid001001"]),
    ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
])
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


# ---- the launchers ----

def slurm(**extra):
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "77"}
    env.update(extra)
    return env


def torchrun(**extra):
    env = {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "77"}
    env.update(extra)
    return env


def openmpi(**extra):
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"}
    env.update(extra)
    return env


def layout(d):
    return d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank, d.nnodes


def test_slurm_one_task_per_gpu(fake_dns):
    fake_dns["node1"] = "10.0.0.1"
    d = from_environ(slurm())
    assert layout(d) == (3, 1, 4, 2, 1, 2)
    assert (d.master_addr, d.master_port, d.source) == ("node1", default_port(77), "slurm")


def test_step_values_win_over_job_values():
    d = from_environ(slurm(SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="node2",
                           SLURM_STEP_TASKS_PER_NODE="2", SLURM_NODEID="0", MASTER_ADDR="node9", MASTER_PORT="20001"))
    assert (d.world_size, d.local_world_size, d.nnodes, d.master_addr, d.master_port) == (2, 2, 1, "node9", 20001)


def test_uneven_tasks_per_node(fake_dns):
    fake_dns["node1"] = "10.0.0.1"
    d = from_environ(slurm(SLURM_TASKS_PER_NODE="3(x1),1", SLURM_NODEID="1", SLURM_LOCALID="0"))
    assert d.local_world_size == 1


def test_slurm_ports(fake_dns):
    fake_dns["node1"] = "10.0.0.1"
    # An array task's port comes from its own SLURM_JOB_ID: array job 100's
    # task 1 (job 100) and the plain job 101 after it used to share one.
    task = from_environ(slurm(SLURM_JOB_ID="100", SLURM_ARRAY_JOB_ID="100", SLURM_ARRAY_TASK_ID="1"))
    plain = from_environ(slurm(SLURM_JOB_ID="101"))
    assert (task.master_port, plain.master_port) == (default_port(100), default_port(101))
    assert (task.job, plain.job) == ("slurm job 100", "slurm job 101")
    assert task.standard_vars()["HPCYOLO_JOB"] == "slurm job 100"
    assert from_environ(slurm(MASTER_PORT="20001", HPCYOLO_MASTER_PORT="20002")).master_port == 20002
    with pytest.raises(HpcyoloError, match=r"HPCYOLO_MASTER_PORT=70000 is not a TCP port"):
        from_environ(slurm(HPCYOLO_MASTER_PORT="70000"))


def test_ports_spread_over_a_wide_range():
    ports = {default_port(job) for job in range(100_000, 115_000)}
    assert len(ports) == 15_000 and min(ports) == 15_000 and max(ports) == 29_999  # below the ephemeral range


def test_torchrun_workers():
    d = from_environ(torchrun())
    assert layout(d) == (6, 2, 8, 4, 1, 2)
    assert (d.master_addr, d.master_port, d.source) == ("10.0.0.1", 29400, "torchrun")


def test_torchrun_inside_srun_one_task_per_node():
    # srun starts one torchrun per node: SLURM_* describe the agent (task 1 of 2).
    env = {**slurm(SLURM_PROCID="1", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="1(x2)"),
           **torchrun(HPCYOLO_MASTER_PORT="20002")}
    d = from_environ(env)
    assert layout(d) == (6, 2, 8, 4, 1, 2) and d.source == "torchrun"
    assert d.master_port == 29400  # torchrun's store port is never replaced


def test_hand_made_torch_variables_are_one_node():
    # What hpcyolo.node.local.launch sets (no TORCHELASTIC_RUN_ID, no GROUP_WORLD_SIZE).
    d = from_environ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "20000"})
    assert layout(d) == (1, 1, 2, 2, 0, 1) and d.source == "torchrun"


def test_openmpi_on_several_nodes():
    d = from_environ(openmpi(OMPI_COMM_WORLD_NODE_RANK="0"))  # NODE_RANK is no node index: ignored
    assert layout(d) == (5, 1, 8, 4, 1, 2)
    assert (d.master_addr, d.source) == ("10.0.0.1", "openmpi")


def test_openmpi_on_one_node_uses_loopback():
    env = openmpi(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="1")
    del env["MASTER_ADDR"]
    d = from_environ(env)
    assert layout(d) == (1, 1, 4, 4, 0, 1) and d.master_addr == "127.0.0.1"


def test_openmpi_on_several_nodes_needs_master_addr():
    env = openmpi()
    del env["MASTER_ADDR"]
    with pytest.raises(HpcyoloError, match=r"OpenMPI runs 8 ranks, 4 on this node: set MASTER_ADDR"):
        from_environ(env)


def test_openmpi_port_is_shared_by_the_job():
    ports = {from_environ(openmpi(OMPI_COMM_WORLD_RANK=str(r), PMIX_NAMESPACE="prterun-n1-4242@1")).master_port
             for r in range(8)}
    assert len(ports) == 1 and 15_000 <= ports.pop() < 30_000


def test_mpirun_inside_slurm_uses_the_openmpi_values():
    d = from_environ({**slurm(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="1(x2)",
                              SLURM_NODEID="1"), **openmpi()})
    assert layout(d) == (5, 1, 8, 4, 1, 2) and d.source == "openmpi"
    assert d.master_port == default_port(77)  # the job's port, as the sbatch script derives it


def test_single_process_default():
    d = from_environ({})
    assert layout(d) == (0, 0, 1, 1, 0, 1) and (d.master_addr, d.source) == ("127.0.0.1", "single process")


def test_bad_value_is_a_clear_error():
    with pytest.raises(HpcyoloError, match="SLURM_PROCID='x' is not an integer"):
        from_environ(slurm(SLURM_PROCID="x"))


def test_standard_vars():
    d = from_environ(torchrun())
    assert d.standard_vars() == {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                                 "GROUP_RANK": "1", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                                 "MASTER_PORT": "29400"}


# ---- SageMaker: one process per host ----

def resourceconfig(tmp_path, current="algo-2", hosts=("algo-1", "algo-2"), interface="eth0"):
    path = tmp_path / "resourceconfig.json"
    path.write_text(json.dumps({"current_host": current, "hosts": list(hosts), "network_interface_name": interface}))
    return path


def test_sagemaker_host_process_gets_the_node_layout(tmp_path, fake_dns):
    fake_dns["algo-1"] = "10.0.0.1"
    path = resourceconfig(tmp_path)
    node = from_environ({"SM_NUM_GPUS": "8", "TRAINING_JOB_NAME": "yolo-1"}, sagemaker_config=path)
    assert isinstance(node, NodeLayout)
    assert (node.node_rank, node.nnodes, node.nproc_per_node, node.master_addr) == (1, 2, 8, "algo-1")
    assert layout(node.dist_env(3)) == (11, 3, 16, 8, 1, 2)
    with pytest.raises(HpcyoloError, match=r"one process per host, but algo-2 needs 8 .*hpcyolo train or hpcyolo exec"):
        node.standard_vars()


def test_sagemaker_worker_started_with_local_rank(tmp_path, fake_dns):
    fake_dns["algo-1"] = "10.0.0.1"
    path = resourceconfig(tmp_path)
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LOCAL_RANK": "2", "TRAINING_JOB_NAME": "yolo-1"}
    d = from_environ(env, sagemaker_config=path)
    assert isinstance(d, DistEnv) and layout(d) == (6, 2, 8, 4, 1, 2) and d.source == "sagemaker"
    node = sagemaker_layout(env, path)
    assert d.master_port == node.master_port and 15_000 <= d.master_port < 30_000


def test_sagemaker_cpu_host_is_one_process(tmp_path, fake_dns):
    fake_dns["algo-1"] = "127.0.0.21"  # on lo: the master keeps its name
    d = from_environ({"SM_NUM_GPUS": "0", "SM_NUM_CPUS": "96"}, sagemaker_config=resourceconfig(tmp_path, "algo-1",
                                                                                               ["algo-1"], "lo"))
    assert isinstance(d, DistEnv) and layout(d) == (0, 0, 1, 1, 0, 1) and d.master_addr == "algo-1"
    node = sagemaker_layout({"HPCYOLO_NPROC": "4"}, resourceconfig(tmp_path, "algo-1", ["algo-1"]))
    assert node.nproc_per_node == 4


def test_sagemaker_comes_after_a_slurm_step(tmp_path, fake_dns):
    fake_dns["node1"] = "10.0.0.1"
    assert from_environ(slurm(), sagemaker_config=resourceconfig(tmp_path)).source == "slurm"


@pytest.mark.parametrize("text, message", [
    ("{not json", "not a SageMaker resource config"),
    ('{"hosts": ["algo-1"]}', "not a SageMaker resource config"),
    ('{"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]}', "current_host 'algo-3' is not one of hosts"),
])
def test_sagemaker_bad_resource_config(tmp_path, text, message):
    path = tmp_path / "resourceconfig.json"
    path.write_text(text)
    with pytest.raises(HpcyoloError, match=message) as e:
        from_environ({}, sagemaker_config=path)
    assert str(e.value).startswith(str(path))


def test_sagemaker_more_processes_than_gpus(tmp_path):
    with pytest.raises(HpcyoloError, match="algo-2: 8 processes on this node but CUDA_VISIBLE_DEVICES shows 2 GPUs"):
        from_environ({"HPCYOLO_NPROC": "8", "CUDA_VISIBLE_DEVICES": "0,1"}, sagemaker_config=resourceconfig(tmp_path))


# ---- Kubernetes: one process per pod ----

def pytorchjob(**extra):
    """A worker pod of a PyTorchJob with a master and 3 workers (training-operator v1)."""
    env = {"MASTER_ADDR": "yolo-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "2",
           "PYTHONUNBUFFERED": "0"}
    env.update(extra)
    return env


def test_pytorchjob_pod_with_one_gpu_is_the_worker(fake_dns):
    fake_dns["yolo-master-0"] = "10.0.0.1"
    d = from_environ(pytorchjob(CUDA_VISIBLE_DEVICES="0"))
    assert isinstance(d, DistEnv) and d.source == "pytorchjob"
    assert layout(d) == (2, 0, 4, 1, 2, 4) and (d.master_addr, d.master_port) == ("yolo-master-0", 23456)


def test_pytorchjob_pod_with_several_gpus_is_a_host(fake_dns):
    fake_dns["yolo-master-0"] = "10.0.0.1"
    node = from_environ(pytorchjob(CUDA_VISIBLE_DEVICES="0,1,2,3"))
    assert isinstance(node, NodeLayout) and (node.node_rank, node.nnodes, node.nproc_per_node) == (2, 4, 4)
    assert layout(node.dist_env(1)) == (9, 1, 16, 4, 2, 4) and node.dist_env(1).master_addr == "yolo-master-0"


def test_pytorchjob_torchrun_variables_win(fake_dns):
    # With nprocPerNode (and under Kubeflow Trainer), WORLD_SIZE may count processes: PET_* say the nodes.
    fake_dns["train-node-0-0.train"] = "10.0.0.1"
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
           "PET_MASTER_ADDR": "train-node-0-0.train", "PET_MASTER_PORT": "29400", "WORLD_SIZE": "8", "RANK": "1", "JOB_COMPLETION_INDEX": "1",
           "JOBSET_NAME": "train", "REPLICATED_JOB_NAME": "node", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    node = from_environ(env)
    assert isinstance(node, NodeLayout) and node.source == "pytorchjob"
    assert (node.node_rank, node.nnodes, node.nproc_per_node, node.master_addr, node.master_port) == (
        1, 2, 4, "train-node-0-0.train", 29400)
    assert node.job == "JOBSET_NAME train"


def test_pytorchjob_nproc_auto_counts_the_gpus(fake_dns):
    fake_dns["m"] = "10.0.0.1"
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "m",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    assert from_environ(env).nproc_per_node == 2


@pytest.mark.parametrize("env, message", [
    ({"PET_NNODES": "1:4", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "m"}, "PET_NNODES='1:4' is an elastic range"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "no MASTER_ADDR"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}, "node rank 2 is not below the 2 nodes"),
    ({"JOB_COMPLETION_INDEX": "1"}, "HPCYOLO_NNODES is not"),
    ({"JOB_COMPLETION_INDEX": "1", "HPCYOLO_NNODES": "2"}, "needs MASTER_ADDR"),
    ({"JOB_COMPLETION_INDEX": "0", "HPCYOLO_NNODES": "2", "JOBSET_NAME": "a", "REPLICATED_JOB_NAME": "b",
      "JOB_INDEX": "1"}, "replicas: 1"),
])
def test_kubernetes_bad_environment(env, message):
    with pytest.raises(HpcyoloError, match=re.escape(message)):
        from_environ(env)


def test_indexed_job_pod(fake_dns):
    fake_dns["yolo-0.yolo"] = "10.0.0.1"
    env = {"JOB_COMPLETION_INDEX": "3", "HPCYOLO_NNODES": "4", "MASTER_ADDR": "yolo-0.yolo", "MASTER_PORT": "29500"}
    d = from_environ({**env, "CUDA_VISIBLE_DEVICES": "0"})
    assert isinstance(d, DistEnv) and d.source == "indexed job"
    assert layout(d) == (3, 0, 4, 1, 3, 4) and (d.master_addr, d.master_port) == ("yolo-0.yolo", 29500)
    node = from_environ({**env, "HPCYOLO_NPROC": "2"})
    assert layout(node.dist_env(1)) == (7, 1, 8, 2, 3, 4)


def test_jobset_pod_finds_its_master_by_name(fake_dns):
    fake_dns["yolo-workers-0-0.yolo"] = "10.0.0.1"
    env = {"JOB_COMPLETION_INDEX": "1", "JOB_INDEX": "0", "HPCYOLO_NNODES": "2", "JOBSET_NAME": "yolo",
           "REPLICATED_JOB_NAME": "workers"}
    d = from_environ(env)
    assert isinstance(d, DistEnv) and d.source == "jobset" and layout(d) == (1, 0, 2, 1, 1, 2)
    assert d.master_addr == "yolo-workers-0-0.yolo" and d.job == "JOBSET_NAME yolo"
    assert d.master_port == from_environ({**env, "JOB_COMPLETION_INDEX": "0"}).master_port  # from the JobSet's name


def test_pod_worker_started_by_the_host_process_is_torchrun_like(fake_dns):
    # What launch_layout gives process 1 of the pod: the pod's RANK/WORLD_SIZE are replaced.
    fake_dns["yolo-master-0"] = "10.0.0.1"
    node = from_environ(pytorchjob(CUDA_VISIBLE_DEVICES="0,1"))
    d = from_environ({**pytorchjob(CUDA_VISIBLE_DEVICES="0,1"), **node.dist_env(1).standard_vars()})
    assert layout(d) == (5, 1, 8, 2, 2, 4) and d.master_addr == "yolo-master-0"


def test_sagemaker_interface_is_exported(tmp_path, fake_dns):
    fake_dns["algo-1"] = "10.0.0.1"
    d = from_environ({"TRAINING_JOB_NAME": "j"}, sagemaker_config=resourceconfig(tmp_path))
    assert d.standard_vars()["NCCL_SOCKET_IFNAME"] == "eth0" and d.standard_vars()["GLOO_SOCKET_IFNAME"] == "eth0"
    d = from_environ({"TRAINING_JOB_NAME": "j", "NCCL_SOCKET_IFNAME": "ens5"},
                     sagemaker_config=resourceconfig(tmp_path))
    assert "GLOO_SOCKET_IFNAME" not in d.standard_vars()


def test_sagemaker_resource_config_path_from_the_environment(tmp_path, fake_dns):
    fake_dns["algo-1"] = "10.0.0.1"
    env = {distenv.SAGEMAKER_CONFIG_ENV: str(resourceconfig(tmp_path))}
    assert from_environ(env).source == "sagemaker"


# ---- precedence ----

@pytest.mark.parametrize("launchers, source", [
    (["torchrun", "openmpi", "slurm", "pytorchjob", "jobset", "sagemaker"], "torchrun"),
    (["openmpi", "slurm", "pytorchjob", "jobset", "sagemaker"], "openmpi"),
    (["slurm", "pytorchjob", "jobset", "sagemaker"], "slurm"),
    (["pytorchjob", "jobset", "sagemaker"], "pytorchjob"),
    (["jobset", "sagemaker"], "jobset"),
    (["sagemaker"], "sagemaker"),
    ([], "single process"),
])
def test_precedence(tmp_path, fake_dns, launchers, source):
    fake_dns.update({"node1": "10.0.0.1", "algo-1": "10.0.0.2", "yolo-master-0": "10.0.0.3",
                     "yolo-workers-0-0.yolo": "10.0.0.4"})
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    jobset = {"JOB_COMPLETION_INDEX": "0", "HPCYOLO_NNODES": "2", "JOBSET_NAME": "yolo",
              "REPLICATED_JOB_NAME": "workers"}
    for name in reversed(launchers):  # the higher launcher's MASTER_ADDR wins, as when it starts the process
        env.update({"torchrun": torchrun, "openmpi": openmpi, "slurm": slurm, "pytorchjob": pytorchjob,
                    "jobset": lambda: jobset}.get(name, dict)())
    config = resourceconfig(tmp_path, "algo-1") if "sagemaker" in launchers else tmp_path / "none.json"
    assert from_environ(env, sagemaker_config=config).source == source


# ---- checks: each one fails when it should ----

def test_rank_beyond_the_world():
    with pytest.raises(HpcyoloError, match=rf"^{HOST}: rank 4 is not below the world size 4 \(from slurm\)$"):
        from_environ(slurm(SLURM_PROCID="4", SLURM_JOB_NODELIST="node1", SLURM_TASKS_PER_NODE="4"))


def test_local_rank_beyond_the_node():
    with pytest.raises(HpcyoloError, match=r"local rank 2 is not below the 2 processes on this node \(from torchrun\)"):
        from_environ(torchrun(LOCAL_RANK="2", LOCAL_WORLD_SIZE="2", GROUP_WORLD_SIZE="4"))


def test_more_processes_than_visible_gpus():
    with pytest.raises(HpcyoloError,
                       match=rf"^{HOST}: 4 processes on this node but CUDA_VISIBLE_DEVICES shows 2 GPUs; "):
        from_environ(torchrun(CUDA_VISIBLE_DEVICES="0,1"))


@pytest.mark.parametrize("visible", ["0,1,2,3", "3", "", "NoDevFiles", None])
def test_enough_gpus_or_one_per_task_or_none(visible):
    env = torchrun() if visible is None else torchrun(CUDA_VISIBLE_DEVICES=visible)
    assert from_environ(env).local_world_size == 4


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1", "::1", "127.0.1.1", "LOCALHOST", "[::1]"])
def test_localhost_master_on_several_nodes(addr):
    with pytest.raises(HpcyoloError, match=rf"^MASTER_ADDR={re.escape(addr)} is localhost but the job spans 2 nodes; "):
        from_environ(torchrun(MASTER_ADDR=addr))
    one_node = torchrun(MASTER_ADDR=addr, RANK="2", GROUP_RANK="0", GROUP_WORLD_SIZE="1", WORLD_SIZE="4")
    assert from_environ(one_node).master_addr == addr


def test_name_resolving_to_localhost_on_several_nodes(fake_dns):
    fake_dns["node1"] = "127.0.1.1"  # Debian's /etc/hosts line for the machine's own name
    with pytest.raises(HpcyoloError, match=r"MASTER_ADDR=node1 resolves to localhost \(127.0.1.1\) but the job spans"):
        from_environ(slurm())


def test_testbed_loopback_nodes_stay_valid(fake_dns):
    fake_dns.update({"node1": "127.0.0.11", "node2": "127.0.0.12"})
    assert from_environ(slurm()).master_addr == "node1"
    check_master("127.0.0.11", 2)


def test_unresolvable_master_is_a_warning(fake_dns, capsys):
    check_master("gpu07", 4)
    assert "hpcyolo: warning: cannot resolve MASTER_ADDR=gpu07" in capsys.readouterr().err
    check_master("gpu07", 1)  # one node: nothing to connect to
    assert capsys.readouterr().err == ""


# ---- the device rule ----

@pytest.mark.parametrize("env, local_rank, gpus, device", [
    ({}, 0, None, "cpu"),
    ({"CUDA_VISIBLE_DEVICES": ""}, 0, None, "cpu"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, 0, None, "cpu"),
    ({"CUDA_VISIBLE_DEVICES": "3"}, 2, None, "cuda:0"),  # --gpus-per-task=1
    ({"CUDA_VISIBLE_DEVICES": "GPU-5e1f"}, 3, None, "cuda:0"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, None, "cuda:2"),
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7", "LOCAL_WORLD_SIZE": "4"}, 3, None, "cuda:3"),
    ({"SM_NUM_GPUS": "8"}, 5, None, "cuda:5"),
    ({"SLURM_GPUS_ON_NODE": "1"}, 1, None, "cuda:0"),
    ({}, 1, 4, "cuda:1"),  # what torch sees wins
    ({}, 3, 1, "cuda:0"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 1, 0, "cpu"),
])
def test_device_for(env, local_rank, gpus, device):
    assert device_for(local_rank, env, gpus=gpus) == device


def test_device_for_local_rank_without_a_gpu():
    with pytest.raises(HpcyoloError, match=r"local rank 2 but only 2 GPUs are visible \(CUDA_VISIBLE_DEVICES=0,1\)"):
        device_for(2, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_device_for_more_processes_than_gpus():
    with pytest.raises(HpcyoloError, match=rf"^{HOST}: 4 processes on this node but CUDA_VISIBLE_DEVICES shows 2 GPUs"):
        device_for(0, {"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(HpcyoloError, match=r"4 processes on this node but only 2 GPUs are visible"):
        device_for(0, {"LOCAL_WORLD_SIZE": "4"}, gpus=2)


@pytest.mark.parametrize("value, count", [
    (None, None), ("", 0), ("0", 1), ("0,1,2,3", 4), ("2, 3", 2), ("0,-1,2", 1), ("NoDevFiles", 0),
    ("GPU-aa,GPU-bb", 2), ("MIG-1/2/3", 1),
])
def test_visible_gpus(value, count):
    assert visible_gpus({} if value is None else {"CUDA_VISIBLE_DEVICES": value}) == count


# ---- the master's address on the site's interface ----

def test_resolve_master_on_the_master_host_uses_the_interface():
    # The name does not resolve (no /etc/hosts line): the interface's address.
    assert resolve_master("fakehost", "lo", hostname="fakehost") == "127.0.0.1"
    assert resolve_master("fakehost", "lo,eth0", hostname="fakehost.cluster.example") == "127.0.0.1"
    assert resolve_master("fakehost", "=lo", hostname="fakehost") == "127.0.0.1"


def test_resolve_master_keeps_the_name():
    assert resolve_master("node1", None, hostname="node1") == "node1"  # no interface named
    assert resolve_master("node1", "lo", hostname="node2") == "node1"  # another host resolves it itself
    # Already on the interface's network (the testbed: node1 is 127.0.0.11 on lo).
    assert resolve_master("localhost", "lo", hostname="localhost") == "localhost"


def test_resolve_master_testbed(fake_dns):
    fake_dns["node1"] = "127.0.0.11"
    assert resolve_master("node1", "lo", hostname="node1") == "node1"


def test_resolve_master_unknown_interface():
    with pytest.raises(HpcyoloError, match=r"network interface 'nosuchif9' .* does not exist on fakehost; it has: lo"):
        resolve_master("fakehost", "nosuchif9", hostname="fakehost")


def test_from_environ_resolves_the_master_on_its_host(monkeypatch, fake_dns):
    monkeypatch.setattr(socket, "gethostname", lambda: "fakehost")
    env = slurm(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_NODELIST="fakehost",
                SLURM_TASKS_PER_NODE="4", NCCL_SOCKET_IFNAME="^docker", GLOO_SOCKET_IFNAME="lo")
    assert from_environ(env).master_addr == "127.0.0.1"
    assert from_environ({**env, "GLOO_SOCKET_IFNAME": "^lo"}).master_addr == "fakehost"  # an exclusion list
    # Two nodes: the master host's interface must not be loopback.
    with pytest.raises(HpcyoloError, match="MASTER_ADDR=127.0.0.1 is localhost but the job spans 2 nodes"):
        from_environ({**env, "SLURM_JOB_NODELIST": "fakehost,other", "SLURM_TASKS_PER_NODE": "4(x2)",
                      "SLURM_NTASKS": "8"})


# ---- the port ----

def test_port_in_use_message():
    assert port_in_use_message("node1", 16234) == (
        "MASTER_PORT 16234 on node1 is already in use (another job or launcher on that node?); "
        "set HPCYOLO_MASTER_PORT to a free port or resubmit")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_address_in_use_at_init_is_one_clear_line():
    # Rank 0 of 2 creates the store server on MASTER_PORT: taken, it fails at once (torch 2.13:
    # DistNetworkError "... code: -98, name: EADDRINUSE, message: address already in use").
    code = ("import sys\nfrom hpcyolo_trainer.common.errors import HpcyoloError\nfrom hpcyolo_trainer.parallel.dist import setup\n"
            "try:\n    setup(timeout_s=10)\nexcept HpcyoloError as e:\n    sys.exit(f'hpcyolo: error: {e}')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "TORCHELASTIC_"))}
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"hpcyolo: error: {port_in_use_message('127.0.0.1', port)}"
    assert "Traceback" not in r.stderr


EARLY = ("import os, sys, time\nfrom pathlib import Path\nfrom hpcyolo_trainer.common.rendezvous import listen_early\n"
         "listen_early(os.environ)\nassert 'torch' not in sys.modules\nPath(sys.argv[1]).write_text('')\n"
         "time.sleep(1.5)\nfrom hpcyolo.node.probe import run\nraise SystemExit(run())\n")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_rank_0_listens_before_torch_loads_and_its_store_serves_that_socket(tmp_path):
    """Rank 0 listens on MASTER_PORT before importing torch; rank 1 connects
    while rank 0 has not made its store yet (the kernel holds the connect),
    and the group forms on that socket: both all-reduce."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
               HPCYOLO_JOB="local early", HPCYOLO_DIST_TIMEOUT="60", CUDA_VISIBLE_DEVICES="")
    ready = tmp_path / "listening"
    zero = subprocess.Popen([sys.executable, "-c", EARLY, str(ready)], env={**env, "RANK": "0", "LOCAL_RANK": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and zero.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready.exists(), zero.communicate()[0]
    with socket.create_connection(("127.0.0.1", port), timeout=5):  # accepted: rank 0 listens, without torch
        pass
    one = subprocess.run([sys.executable, "-m", "hpcyolo.node.probe"], env={**env, "RANK": "1", "LOCAL_RANK": "1"},
                         capture_output=True, text=True, timeout=120)
    out0 = zero.communicate(timeout=120)[0]
    assert zero.returncode == 0 and one.returncode == 0, (out0, one.stdout, one.stderr)
    assert "all_reduce 3 (expected 3)" in out0 and "all_reduce 3 (expected 3)" in one.stdout


def test_rank_0_that_cannot_listen_early_says_so_in_one_line_before_torch_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), HPCYOLO_JOB="local taken")
        code = ("import os, sys\nfrom hpcyolo_trainer.common.rendezvous import listen_early\n"
                "from hpcyolo_trainer.common.errors import HpcyoloError\ntry:\n    listen_early(os.environ)\n"
                "except HpcyoloError as e:\n"
                "    sys.exit(f'hpcyolo: error: {e} (torch loaded: {\"torch\" in sys.modules})')\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert r.stderr.strip() == (f"hpcyolo: error: {port_in_use_message('127.0.0.1', port)} "
                                    f"(torch loaded: False)")
        # Under torchrun, or without a job identity, the store is not ours: nothing is bound early.
        for other in ({"TORCHELASTIC_RUN_ID": "x"}, {"HPCYOLO_JOB": ""}, {"RANK": "1"}, {"WORLD_SIZE": "1"}):
            r = subprocess.run([sys.executable, "-c", code], env={**env, **other}, capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, (other, r.stderr)


def test_env_layer_does_not_import_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, hpcyolo.node.distenv; print('torch' in sys.modules)"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
