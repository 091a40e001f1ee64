"""Distributed setup: one small function returning one small record.

The trainer reads only torch's standard variables (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT); hpcyolo's env layer sets them from
Slurm, and torchrun sets them itself.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpcyolo.distenv import device_for, port_in_use_message
from hpcyolo.errors import HpcyoloError


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(local_rank: int) -> torch.device:
    """cuda:0 when CUDA_VISIBLE_DEVICES leaves each task one GPU (srun
    --gpus-per-task), else cuda:LOCAL_RANK; the CPU without GPUs. The rule
    (and its checks) is hpcyolo.distenv.device_for's; torch says whether CUDA works."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(device_for(local_rank, os.environ, gpus=torch.cuda.device_count()))


def setup(timeout_s: int = 600) -> Dist:
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        _init_process_group(backend, timeout_s, device)
    return Dist(rank=rank, local_rank=local_rank, world_size=world, device=device)


def _init_process_group(backend: str, timeout_s: int, device: torch.device) -> None:
    """init_process_group; rank 0 failing to listen on MASTER_PORT (another
    job or launcher holds it) becomes one line naming host and port instead
    of a DistNetworkError traceback."""
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    except RuntimeError as e:  # torch.distributed.DistNetworkError is a RuntimeError
        text = str(e)
        if "address already in use" not in text.lower() and "EADDRINUSE" not in text:
            raise
        host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "?")
        raise HpcyoloError(port_in_use_message(host, port)) from None


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def print0(d: Dist, *args, **kwargs) -> None:
    if d.is_main:
        print(*args, **kwargs, flush=True)


def any_rank(d: Dist, flag: bool) -> bool:
    """True on every rank when any rank says True (one tiny all-reduce), so
    all ranks take the same branch and none is left waiting in a collective."""
    if not d.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather_objects(d: Dist, obj):
    """Every rank's `obj`, in rank order, on every rank."""
    if not d.distributed:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_module(d: Dist, module: torch.nn.Module) -> None:
    """Give every rank rank 0's parameters and buffers of `module`."""
    if d.distributed:
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, 0)


def warn0(d: Dist, message: str) -> None:
    if d.is_main:
        print(f"warning: {message}", file=sys.stderr, flush=True)
