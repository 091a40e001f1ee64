"""The run's state: what a checkpoint records to continue exactly where
it stopped (`Position`), what a step works on (`Parts`), and the checkpoint
itself, written and read back with every rank's random state."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..common import rundir
from ..common.preemption import mark_preempted
from ..optim.ema import ModelEMA
from ..optim.schedule import Schedule
from ..parallel.dist import Dist, gather_objects, warn0
from ..report.progress import Progress, Throughput
from . import checkpoint as ckpt


@dataclass
class Parts:
    """What a step works on: the model and everything that updates it."""
    model: torch.nn.Module
    ema: ModelEMA
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    accumulate: int  # batches per optimizer step after the warm-up (schedule.accumulate: during it)
    amp: bool
    amp_dtype: torch.dtype
    scaler: torch.amp.GradScaler
    loss_fn: torch.nn.Module  # the task's loss: (predictions, targets) -> (loss, items); its item names in .names
    writer: ckpt.Writer
    net: torch.nn.Module | None = None  # the model under DDP, once placed


@dataclass
class Position:
    """Where the run is: what a checkpoint records to continue exactly there."""
    epoch: int = 0  # the epoch being trained (0-based)
    batch: int = 0  # global batches of it done
    global_step: int = 0  # optimizer steps done
    best_fitness: float = -1.0
    best_epoch: int = 0  # the epoch (from 1) of best_fitness, as patience counts; 0: none yet
    epoch_seconds: float = 0.0  # training time of this epoch so far (before a stop too)
    epochs: int = 0  # the epochs planned: cfg.epochs, or with `time` the plan made at the last epoch's end
    run_seconds: float = 0.0  # the run's training time (RunClock) when checkpointed
    plan_seconds: float = 0.0  # the run's training time at the end of its last epoch (the plan's)
    end_seconds: float = 0.0  # the longest end of an epoch so far (validation), which `time` keeps room for
    loss_sum: torch.Tensor | None = None  # this rank's loss items summed over the epoch's batches


@dataclass
class Epoch:
    """The epoch being trained, as the step's side tasks see it (not checkpointed)."""
    progress: Progress
    meter: Throughput  # this process's part of the epoch: timing, never compared
    t0: float  # when the epoch started, less its time before a resume
    waited: float  # the loader wait the straggler report last read


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rank_state(state: dict, d: Dist) -> torch.Tensor:
    """Restore this rank's RNG state; return its partial loss sum of the
    epoch (each rank's is its own: rank 0's on every rank gave a wrong mean)."""
    rngs = state["rng"]
    sums = state.get("loss_sums") or [state["loss_sum"]] * len(rngs)  # checkpoints of hpcyolo 0.1.0
    if len(rngs) != d.world_size:
        warn0(d, f"checkpoint has the state of {len(rngs)} ranks, not {d.world_size}; reseeding, and this epoch's "
                 f"train losses are approximate")
        return sum(sums) / len(sums)
    rng = rngs[d.rank]
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return sums[d.rank]


def save_state(r, preempted: str = "") -> None:
    """Everything needed to continue exactly at r.pos (`r`: the Run); rank 0 snapshots it
    and writes it in the background. When stopping for preemption the write
    is waited for, then rank 0 leaves the marker the batch script looks for."""
    d, parts, pos = r.d, r.parts, r.pos
    ranks = gather_objects(d, (rng_state(), pos.loss_sum.cpu()))
    if d.is_main:
        state = {"model": parts.model.state_dict(), "ema": parts.ema.state_dict(),
                 "optimizer": parts.optimizer.state_dict(), "scaler": parts.scaler.state_dict(),
                 "rng": [rng for rng, _ in ranks], "loss_sums": [s for _, s in ranks],
                 "config": rundir.settings(r.cfg.to_dict()), "arch": parts.model.arch, "epoch": pos.epoch,
                 "batch": pos.batch, "global_step": pos.global_step, "best_fitness": pos.best_fitness,
                 "best_epoch": pos.best_epoch, "epoch_seconds": pos.epoch_seconds, "epochs": pos.epochs,
                 "run_seconds": pos.run_seconds, "plan_seconds": pos.plan_seconds, "end_seconds": pos.end_seconds}
        if getattr(parts.model, "kpt_shape", None):  # a keypoint model's, to build it again from the file
            state["kpt_shape"] = list(parts.model.kpt_shape)
        parts.writer.save(state, r.folder / rundir.CHECKPOINTS, r.cfg.keep, wait=bool(preempted),
                          steady=steady_tensors(parts.model, state))
        if preempted:
            mark_preempted(preempted)
    if preempted and d.distributed:
        torch.distributed.barrier()  # nobody exits before the checkpoint is on disk


def steady_tensors(model: torch.nn.Module, state: dict) -> list[torch.Tensor]:
    """What only optimizer_step changes, of a checkpoint's `state`: the
    parameters, the EMA (BatchNorm's statistics included: it never trains),
    the optimizer's state. The checkpoint writer copies them while the next
    batches' forward and backward passes run; train_epoch settles the copy
    before the step. (The EMA's and the optimizer's from `state` itself:
    no second state_dict() on the loop's time.)"""
    optimizer = (v for s in state["optimizer"]["state"].values() for v in s.values() if isinstance(v, torch.Tensor))
    return [*model.parameters(), *state["ema"]["module"].values(), *optimizer]


def reduce_mean(d: Dist, value: torch.Tensor) -> torch.Tensor:
    value = value.clone()
    if d.distributed:
        torch.distributed.all_reduce(value)
        value /= d.world_size
    return value.cpu()
