"""Distributed setup: one small function returning one small record.

The trainer reads only torch's standard variables (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT); hpcyolo's env layer sets them from
Slurm, and torchrun sets them itself.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..common.devices import device_for
from ..common.rendezvous import init_process_group
from . import flight, workers


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    control: object = None
    """Process group for the trainer's small per-step agreements on the CPU:
    a gloo group beside NCCL's, None where the default group is gloo already."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(local_rank: int) -> torch.device:
    """cuda:0 when CUDA_VISIBLE_DEVICES leaves each task one GPU (srun
    --gpus-per-task), else cuda:LOCAL_RANK; the CPU without GPUs. The rule
    (and its checks) is hpcyolo.node.distenv.device_for's; torch says whether CUDA works."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(device_for(local_rank, os.environ, gpus=torch.cuda.device_count()))


def setup(timeout_s: int = 600, loader_workers: int = 0, hangs: Path | None = None) -> Dist:
    """This rank's process group (where several) and device; the loader
    workers' server first where the run has loader workers; torch's flight
    recorder on (parallel/flight.py: `hangs` is where NCCL's own timeout dumps it)."""
    if loader_workers:
        workers.start()  # before the process group's threads: loader workers fork from a server without them
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    control = None
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        flight.enable(os.environ, backend, hangs)
        # Keyed by the job: a port clash is refused, never joined (hpcyolo_trainer.common.rendezvous).
        init_process_group(backend, timeout_s, device_id=device if device.type == "cuda" else None)
        if backend == "nccl":
            # Reading an NCCL result (.item()) waits for everything queued on
            # the GPU: a per-step agreement over NCCL would stop the CPU from
            # preparing the next step while this one computes.
            control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(rank=rank, local_rank=local_rank, world_size=world, device=device, control=control)


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# The process groups the trainer left (leave): kept from destruction until the process ends.
_left: list = []


def leave() -> None:
    """Leave the process group at the trainer's end, keeping the group
    object alive until the process ends (with os._exit: `has_left`).

    Destroyed here, the group's last reference would be DDP's reducer's,
    and the reducer's destructor holds the GIL while the group joins its
    gloo threads; a gloo thread releasing an earlier collective's tensors,
    which Python had let go of, waits for that GIL. Seen once: a rank of 3,
    on 2 cores, hung at the end of its run in ~ProcessGroupGloo (joining)
    under ~Reducer, its gloo thread in ~AsyncAllgatherWork waiting for the
    GIL. (A group object freed from Python releases the GIL first: `cleanup`
    is safe where no DDP holds the group.)"""
    if dist.is_initialized():
        _left.append(dist.group.WORLD)
        dist.destroy_process_group()


def has_left() -> bool:
    """Whether this process left a process group with `leave`."""
    return bool(_left)


def print0(d: Dist, *args, **kwargs) -> None:
    if d.is_main:
        print(*args, **kwargs, flush=True)


def max_over_ranks(d: Dist, value: int) -> int:
    """The largest of every rank's `value`, on every rank (one tiny
    all-reduce), so all ranks take the same branch and none is left waiting
    in a collective."""
    if not d.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int32)  # on the CPU, over gloo: no wait for the GPU
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=d.control)
    return int(t.item())


def lost_peer_line(e: BaseException) -> str | None:
    """One line for a collective that failed because another rank is gone
    (killed, crashed, its node lost), instead of a 40-line traceback; None for
    any other error. gloo says 'Connection reset/closed by peer', NCCL that
    its communicator was aborted or a remote rank failed."""
    text = str(e)
    signs = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused",
             "NCCL communicator was aborted", "remote process exited", "NCCL error")
    if not (isinstance(e, dist.DistError) or any(s in text for s in signs)):
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    first = first.split("] ", 1)[-1][:200]  # gloo prefixes its source file
    return (f"hpcyolo: rank {os.environ.get('RANK', '0')} on {socket.gethostname()}: another rank is gone, a "
            f"collective failed ({first}); stopping")


# A failing GPU or interconnect, as torch raises it (never an out-of-memory
# error: that is the model's size, the user's to change):
# - CUDA: torch.AcceleratorError (c10's C10_CUDA_CHECK, torch 2.8 on) with
#   the runtime's cudaError_t in `error_code`; these codes are the hardware's
#   or the driver's (an illegal address or instruction is a kernel's bug, the
#   code's): ECC uncorrectable (214), NVLink uncorrectable (220), launch
#   failure (719, what a GPU that fell off the bus gives), devices
#   unavailable (46), no device (100), system not ready (802), unknown (999);
# - NCCL: torch.distributed.DistBackendError from ProcessGroupNCCL's
#   C10D_NCCL_CHECK ("NCCL error in: FILE:LINE, " + ncclGetErrorString's words
#   + ", NCCL version ..." + a detail line): a system error (a socket, a
#   device) or an unhandled CUDA error;
# - older torch, other paths: a RuntimeError whose text says so (CUDA's and
#   NCCL's own words, below).
_CUDA_FAULT_CODES = {214: "uncorrectable ECC error", 220: "uncorrectable NVLink error", 719: "launch failure",
                     46: "devices unavailable", 100: "no CUDA device", 802: "system not ready", 999: "unknown error"}
_NCCL_FAULT_SIGNS = ("unhandled system error", "unhandled cuda error", "ncclSystemError", "ncclUnhandledCudaError")
_DEVICE_FAULT_SIGNS = ("uncorrectable ECC", "ECC error", "fallen off the bus", "GPU is lost",
                       "CUDA error: unknown error", "unspecified launch failure", "NVLink", "Xid", *_NCCL_FAULT_SIGNS)


def device_fault_line(e: BaseException) -> str | None:
    """One line for an error of this rank's own GPU or network (the node's
    fault, retried without the node), or None for anything else: by the
    exception's type and code where torch gives them, else by its words."""
    text = str(e)
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in text:
        return None
    accelerator = getattr(torch, "AcceleratorError", None)
    code = getattr(e, "error_code", None) if accelerator is not None and isinstance(e, accelerator) else None
    if code is not None:
        fault = code in _CUDA_FAULT_CODES
    elif isinstance(e, dist.DistBackendError) and text.startswith("NCCL error"):
        fault = any(sign in text for sign in _NCCL_FAULT_SIGNS)
    else:
        fault = any(sign in text for sign in _DEVICE_FAULT_SIGNS)
    if not fault:
        return None
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)[:200]
    said = f"{type(e).__name__} {code} ({_CUDA_FAULT_CODES[code]})" if code is not None else type(e).__name__
    return (f"hpcyolo: rank {os.environ.get('RANK', '0')} on {socket.gethostname()}: its device or network failed "
            f"({said}: {first}); stopping")


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
