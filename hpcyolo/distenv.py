"""Map a launcher's environment to torch's standard variables (no torch here).

Whatever started the process (srun with one task per GPU, torchrun, ...), the
trainer and any custom entrypoint read only RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; this module derives them.

Precedence, first match wins:
1. torchrun (TORCHELASTIC_RUN_ID, or RANK/LOCAL_RANK/WORLD_SIZE all set): the
   launcher already set them; under srun + torchrun the Slurm variables
   describe the torchrun agent, not the worker.
2. Slurm (SLURM_PROCID in a job step).
3. Nothing: a single process, rank 0 of 1, on 127.0.0.1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .errors import HpcyoloError

PORT_BASE, PORT_SPAN = 15000, 15000  # below Linux's ephemeral range (32768-60999)


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    source: str  # which launcher the values came from

    def standard_vars(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank), "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
        }


def default_port(job_id: int, array_job_id: int | None = None, array_task_id: int | None = None) -> int:
    """The port the sbatch script derives from the job id, or for an array
    task from the array's job id plus the task id (keep in step with
    templates/sbatch.sh.j2)."""
    key = job_id if array_job_id is None else array_job_id + (array_task_id or 0)
    return PORT_BASE + key % PORT_SPAN


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list to names: 'gpu[01-03,07],login1' ->
    gpu01 gpu02 gpu03 gpu07 login1 (what `scontrol show hostnames` prints)."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", hostlist):
        prefix, ranges, suffix = m.groups()
        if not ranges:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{i:0{len(lo)}d}{suffix}")
    return hosts


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except KeyError:
        raise HpcyoloError(f"environment: {name} is not set") from None
    except ValueError:
        raise HpcyoloError(f"environment: {name}={env[name]!r} is not an integer") from None


def from_environ(env: Mapping[str, str]) -> DistEnv:
    if "TORCHELASTIC_RUN_ID" in env or all(k in env for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return _from_torchrun(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    return DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                   master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                   master_port=int(env.get("MASTER_PORT", default_port(0))), source="single process")


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    return DistEnv(rank=_int(env, "RANK"), local_rank=_int(env, "LOCAL_RANK"), world_size=_int(env, "WORLD_SIZE"),
                   local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
                   node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
                   master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=_int(env, "MASTER_PORT"),
                   source="torchrun")


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    # The step's values first: a step may use fewer tasks than the job.
    ntasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    node_id = _int(env, "SLURM_NODEID")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
    master_addr = env.get("MASTER_ADDR") or (expand_hostlist(nodelist) or ["127.0.0.1"])[0]
    if "MASTER_PORT" in env:
        port = int(env["MASTER_PORT"])
    elif "SLURM_ARRAY_JOB_ID" in env:
        port = default_port(0, _int(env, "SLURM_ARRAY_JOB_ID"), _int(env, "SLURM_ARRAY_TASK_ID"))
    else:
        port = default_port(_int(env, "SLURM_JOB_ID"))
    return DistEnv(rank=_int(env, "SLURM_PROCID"), local_rank=_int(env, "SLURM_LOCALID"),
                   world_size=_int(env, ntasks), local_world_size=_tasks_on_node(per_node, node_id),
                   node_rank=node_id, master_addr=master_addr, master_port=port, source="slurm")


def _tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """SLURM_TASKS_PER_NODE is '2(x3),1': 2 tasks on each of 3 nodes, then 1."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise HpcyoloError(f"environment: cannot read SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_id] if node_id < len(counts) else counts[-1]
