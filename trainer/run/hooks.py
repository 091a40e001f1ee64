"""The side tasks around the training step, each from its own module: the
hang watchdog (watchdog.py), the ledger of hours (common/ledger.py), the
drills (drills.py), the slow-rank report (stragglers.py), the progress bar
(report/progress.py), TensorBoard (report/tboard.py), the trackers
(report/tracking.py), the plots (report/plots.py, on their own thread) and
the checkpoint cadence. `side_tasks` sets them up once, reading the
environment there, and lists the ones this run has: the loop calls each
`on_batch` hook with the batch it trains and each `after_step` hook after
the optimizer step, in order; none reads the environment per batch."""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..common import rundir
from ..common.ledger import Ledger
from ..common.preemption import LOCAL_RESTART_ENV, start_name
from ..report.background import Background
from ..report.tboard import StepLosses
from ..report.tracking import Tracking
from .drills import Drills
from .state import save_state
from .stragglers import Stragglers
from .watchdog import Off, Watchdog

# A folder: each rank appends `epoch batch height width` of every training
# batch to rank-R.txt in it, so tests can check that the ranks agree.
SHAPES_ENV = "HPCYOLO_STEP_SHAPES"
BOARD_EVERY = 10  # optimizer steps between the running training losses in TensorBoard
TRAIN_BATCH_PLOTS = 3  # ultralytics' train_batch0..2.jpg, of the run's first epoch


@dataclass
class SideTasks:
    """The side tasks this rank runs, and the hooks through which they see
    the loop: `on_batch(run, epoch, i, host_imgs, targets, imgs)` for each
    batch before its forward pass, `after_step(run, epoch, i)` after each
    optimizer step."""
    watch: Watchdog | Off = field(default_factory=Off)
    ledger: Ledger = field(default_factory=Ledger)  # where this start's time goes: rank 0 writes it
    drills: Drills | None = None
    stragglers: Stragglers | None = None
    board: StepLosses | None = None  # rank 0's TensorBoard events
    tracking: Tracking | None = None  # rank 0's MLflow and W&B runs
    drawings: Background | None = None  # rank 0's plots, drawn off the loop
    on_batch: list[Callable] = field(default_factory=list)
    after_step: list[Callable] = field(default_factory=list)

    def sinks(self) -> list:
        """Where an epoch's numbers and the run's plots go: TensorBoard, the trackers."""
        return [s for s in (self.board and self.board.writer, self.tracking) if s is not None]

    def close(self, finished: bool) -> None:
        """At the process's end, whatever ended it."""
        self.watch.close()
        self.ledger.mark("exit")
        self.ledger.write()
        if self.drawings is not None:
            self.drawings.wait()
        if self.board is not None:
            self.board.close()
        if self.tracking is not None:
            for line in self.tracking.close(finished=finished):
                print(line, flush=True)


def this_start() -> tuple[str, str]:
    """(job, restart) of this start of the job, as the batch script names its
    records (hpcyolo job end reads the hang verdict and the ledger by them)."""
    restart = os.environ.get("SLURM_RESTART_COUNT", os.environ.get(LOCAL_RESTART_ENV, "0"))
    return os.environ.get("SLURM_JOB_ID", "local"), start_name(restart, os.environ)


def health(side: SideTasks, cfg, d, model, folder: Path, hosts: list[str]) -> None:
    """The hang watchdog, the slow-rank report and the drills, where set."""
    if cfg.hang_factor > 0:
        from ..common.rendezvous import side_store
        from .watchdog import STORE_SECONDS

        store = functools.partial(side_store, STORE_SECONDS) if d.distributed else None
        side.watch = Watchdog(d.rank, hosts, rundir.hang_folder(folder, *this_start()), cfg.hang_factor,
                              cfg.hang_min, store, cold=cfg.hang_cold)
    if cfg.straggler_every > 0 and d.distributed:
        job, _ = this_start()
        side.stragglers = Stragglers(d, hosts, cfg.straggler_every, cfg.straggler_margin, record=lambda row: \
                                     rundir.append_row(folder / rundir.STRAGGLERS, rundir.STRAGGLER_COLUMNS,
                                                       {**row, "job": job}))
        side.stragglers.watch_waits(model)
    side.drills = Drills.from_env(d.rank, hosts[d.rank])


def attach(side: SideTasks, cfg, d) -> None:
    """The hooks of the side tasks this run has, in the order they act."""
    if side.drawings is not None:
        side.on_batch.append(draw_train_batch)
    if os.environ.get(SHAPES_ENV):
        side.on_batch.append(functools.partial(record_shape, Path(os.environ[SHAPES_ENV]) / f"rank-{d.rank}.txt"))
    side.after_step += [beat, ledger_step]
    if side.drills is not None:
        side.after_step.append(drill_after_step)
    if side.stragglers is not None:
        side.after_step.append(straggler_step)
    side.after_step.append(progress)
    if side.board is not None:
        side.after_step.append(board_losses)
    if cfg.save_every:
        side.after_step.append(save_cadence)


# -- on_batch ------------------------------------------------------------------

def draw_train_batch(run, epoch, i: int, host_imgs, targets, imgs) -> None:
    if run.pos.epoch == 0 and i < TRAIN_BATCH_PLOTS:
        # Copies: the loader's shared-memory batch is reused; a segmentation's targets are (rows, masks).
        kept = tuple(t.numpy().copy() for t in targets) if isinstance(targets, tuple) else targets.numpy().copy()
        run.side.drawings.submit(run.task.draw_train_batch, host_imgs.numpy().copy(), kept,
                                 run.data.names, run.folder / f"train_batch{i}.jpg")


def record_shape(path: Path, run, epoch, i: int, host_imgs, targets, imgs) -> None:
    """Append this batch's image size to the SHAPES_ENV folder."""
    with open(path, "a") as f:
        f.write(f"{run.pos.epoch} {i} {imgs.shape[2]} {imgs.shape[3]}\n")


# -- after_step ------------------------------------------------------------------

def beat(run, epoch, i: int) -> None:
    run.side.watch.beat(run.pos.global_step)


def ledger_step(run, epoch, i: int) -> None:
    run.side.ledger.step(run.pos.global_step)


def drill_after_step(run, epoch, i: int) -> None:
    run.side.drills.after_step(run.pos.global_step)


def straggler_step(run, epoch, i: int) -> None:
    for line in run.side.stragglers.step(epoch.meter.wait - epoch.waited, run.pos.global_step):
        print(line, flush=True)
    epoch.waited = epoch.meter.wait


def progress(run, epoch, i: int) -> None:
    epoch.progress.update(i + 1, run.pos.loss_sum / (i + 1))


def board_losses(run, epoch, i: int) -> None:
    if run.pos.global_step % BOARD_EVERY == 0:
        run.side.board.add(run.pos.epoch * run.data.batches + i + 1, run.pos.loss_sum / (i + 1))


def save_cadence(run, epoch, i: int) -> None:
    """A checkpoint every cfg.save_every optimizer steps."""
    if run.pos.global_step % run.cfg.save_every == 0:
        with run.side.watch.phase("checkpoint"), run.side.ledger.timed("checkpoint"):
            save_state(run)
        run.side.ledger.checkpointed(run.pos.global_step)


# -- around the forward pass -------------------------------------------------------

def forward_span(side: SideTasks, done: int):
    """Around a step's forward pass: its time for the straggler report, and
    the drills that act inside a step; nothing where neither is set."""
    if side.stragglers is None and side.drills is None:
        return nullcontext()
    return _forward_span(side, done)


@contextmanager
def _forward_span(side: SideTasks, done: int):
    with side.stragglers.forward() if side.stragglers is not None else nullcontext():
        if side.drills is not None:
            side.drills.in_step(done)
        yield
