"""Which device a process trains on, and whether a node's processes fit
its GPUs: from the environment alone (CUDA_VISIBLE_DEVICES, the launcher's
GPU counts), without torch, so that hpcyolo.node.distenv checks a layout on a
login node with the same rules the trainer places itself by."""

from __future__ import annotations

from typing import Mapping, MutableMapping

from .errors import HpcyoloError, shown


def env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except KeyError:
        raise HpcyoloError(f"environment: {name} is not set") from None
    except ValueError:
        raise HpcyoloError(f"environment: {name}={shown(env[name])} is not an integer") from None


def idle_threads_sleep(env: MutableMapping[str, str]) -> None:
    """Before torch loads: OpenMP's intra-op threads, between two parallel
    regions, spin briefly and then sleep (GOMP_SPINCOUNT=10000 for torch's
    libgomp, about 300,000 by default), unless the user set a wait policy or
    a spin count. A training step on the CPU is thousands of small parallel
    regions with Python in between: the idle threads' default spinning burnt
    a second core beside the one that trained, and on a CPU shared with
    loader workers or other jobs a region waited for a preempted spinner.
    Sleeping at once (OMP_WAIT_POLICY=PASSIVE) cost wall time instead: each
    region waited for its threads to wake (yolo26n, 2 threads, 1 loader
    worker, one epoch of 800 images on a 2-core VM, two runs each: default
    22-33 s wall, 38-48 s CPU; passive 27 s, 37-38 s; 10000 21-22 s, 35-36 s;
    benchmarks/bench_cpu.py compares with ultralytics)."""
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", "10000")


def short_hostname() -> str:
    import socket  # here: `hpcyolo render` imports this module (through distenv) and needs no socket

    return socket.gethostname().split(".")[0]


def visible_gpus(env: Mapping[str, str]) -> int | None:
    """How many GPUs CUDA_VISIBLE_DEVICES leaves, None when it is unset.
    CUDA reads the list up to the first invalid entry, so '', '-1' and
    Slurm's 'NoDevFiles' leave none."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    count = 0
    for item in value.split(","):
        item = item.strip()
        if not (item.isdigit() or item.startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return count


def check_gpus(procs_on_node: int, env: Mapping[str, str], host: str | None = None, gpus: int | None = None) -> None:
    # One visible GPU is --gpus-per-task (each task its own: cuda:0); none is the CPU.
    visible = visible_gpus(env) if gpus is None else gpus
    if visible is None or visible <= 1 or procs_on_node <= visible:
        return
    what = (f"CUDA_VISIBLE_DEVICES shows {visible} GPUs" if "CUDA_VISIBLE_DEVICES" in env
            else f"only {visible} GPUs are visible")
    raise HpcyoloError(f"{host or short_hostname()}: {procs_on_node} processes on this node but {what}; "
                       f"start one process per GPU")


def device_for(local_rank: int, env: Mapping[str, str], *, gpus: int | None = None) -> str:
    """The device of the process with this local rank: 'cuda:0' when it sees
    exactly one GPU (srun --gpus-per-task gives each task its own), else
    'cuda:LOCAL_RANK'; 'cpu' without GPUs. `gpus` is what the caller knows
    (torch.cuda.device_count()); without it, CUDA_VISIBLE_DEVICES, then
    SM_NUM_GPUS / SLURM_GPUS_ON_NODE, tell."""
    count = gpus if gpus is not None else gpu_hint(env)
    if not count:
        return "cpu"
    if count == 1:
        return "cuda:0"
    if "LOCAL_WORLD_SIZE" in env:
        check_gpus(env_int(env, "LOCAL_WORLD_SIZE"), env, gpus=count)
    if local_rank >= count:
        raise HpcyoloError(f"{short_hostname()}: local rank {local_rank} but only {count} GPUs are visible "
                           f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')})")
    return f"cuda:{local_rank}"


def gpu_hint(env: Mapping[str, str]) -> int:
    visible = visible_gpus(env)
    if visible is not None:
        return visible
    for name in ("SM_NUM_GPUS", "SLURM_GPUS_ON_NODE"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return 0
