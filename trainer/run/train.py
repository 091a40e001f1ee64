"""The DDP trainer: `main()` reads top to bottom.

set-up (run/setup.py, run/inputs.py) -> resume -> the loop: per epoch the
training steps (`train_epoch`, whose loop body is the step) and the epoch's
end (`end_epoch`: validate, checkpoint, results.csv, weights) -> `complete`.
The run's state is one `Run` (run/state.py); the side tasks (watchdog,
ledger, drills, stragglers, progress, TensorBoard, checkpoint cadence) hook
in after the step (run/hooks.py); the stop vote and the time budget are
the step's last word (run/stop.py). Only rank 0 prints, saves and plots.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..common import rundir
from ..common.heap import long_lived
from ..common.ledger import Ledger
from ..common.preemption import StopFlag
from ..common.settings import TrainConfig
from ..data.dataset import load_data_spec
from ..data.filescan import Prescan
from ..eval.evaluate import INTERRUPTED
from ..parallel.dist import Dist, broadcast_module, gather_objects, print0, setup
from ..report.background import Background
from ..report.progress import Progress, Throughput, describe, merge_figures
from ..report.tboard import EventWriter, StepLosses
from ..report.tracking import Tracking, check_installed
from ..tasks.task import Task
from ..tasks.task import load as load_task
from .hooks import SideTasks, attach, forward_span, health, this_start
from .inputs import Data, load_data, stop_workers, train_loader
from .outputs import epoch_metrics, numbers, save_weights, write_results
from .setup import (
    arithmetic,
    build,
    checkpoint_to_resume,
    layout,
    loader_workers,
    resume,
    say_ranks,
    seed_all,
    start_run,
)
from .state import Epoch, Parts, Position, reduce_mean, save_state
from .step import data_parallel, device_batch, forward_backward, optimizer_step, settle_buckets
from .stop import RunClock, finish, patience_spent, plan_epochs, resumed_plan, stop_if_asked, validation_stop


@dataclass
class Run:
    """The run's state, one object: its settings, its ranks, its folder and
    task, and as set-up fills them in its data, what the step works on, where
    it is (the checkpointed part) and its side tasks. The loop's functions
    take it, not the parts one by one."""
    cfg: TrainConfig
    d: Dist
    folder: Path  # the run directory
    task: Task
    stop: StopFlag
    data: Data | None = None
    parts: Parts | None = None
    pos: Position | None = None
    side: SideTasks = field(default_factory=SideTasks)
    clock: RunClock | None = None  # from the training loop's start
    time_up: bool = False  # the budget leaves no room for another step and the final validation
    speed: tuple | None = None  # the last trained epoch's throughput figures (not checkpointed)

    def apply_plan(self) -> None:
        """The learning-rate schedule and the end-to-end loss's weights follow the planned epochs."""
        if self.parts.schedule.epochs != self.pos.epochs:
            self.parts.schedule = self.parts.schedule.planned(self.pos.epochs)
        self.parts.loss_fn.set_epoch(self.pos.epoch, self.pos.epochs)

    def last_validation(self) -> bool:
        """Whether the epoch ending now is the run's last validation, the one
        ultralytics draws its plots of: the planned end, the time budget's, or
        patience's (its last epoch without a better fitness; with val off, as
        in ultralytics, no fitness is measured before the end and patience
        never stops the run)."""
        cfg, pos = self.cfg, self.pos
        return pos.epoch + 1 >= pos.epochs or self.time_up or \
            (cfg.val and cfg.patience > 0 and pos.epoch + 1 - pos.best_epoch >= cfg.patience)



def main(cfg: TrainConfig, stop: StopFlag | None = None, prescan: Prescan | None = None) -> int:
    run = Path(cfg.run_dir)
    settings = rundir.settings(cfg.to_dict())
    rundir.check_continues(run, settings)  # before anything is written, and before the rendezvous
    check_installed(settings)  # a tracker asked for and not installed: one line, before anything runs
    ledger = Ledger()
    ledger.mark("rendezvous")
    d = setup(cfg.dist_timeout, cfg.workers, rundir.hang_folder(run, *this_start()))
    ledger.mark("setup")
    if d.is_main:
        ledger.path = rundir.ledger_file(run, *this_start(), ".json")
    r = Run(cfg, d, run, load_task(cfg.task), stop or StopFlag(cfg.signal), side=SideTasks(ledger=ledger))
    with long_lived():
        prepare(r, settings, prescan)
    print0(d, f"training {r.parts.model.arch} on {len(r.data.train_set)} images ({r.data.nc} classes), "
              f"{d.world_size} rank(s) x {r.data.batch_per_rank} images, {r.data.batches} batches per epoch, "
              f"accumulate {r.parts.accumulate}, {r.cfg.workers} loader worker(s) per rank, device {d.device}")
    print0(d, f"arithmetic: {arithmetic(r.parts.amp, r.parts.amp_dtype, layout(r.cfg, d.device))}")
    code = None
    try:
        code = train_epochs(r)
        return code
    finally:
        r.side.close(finished=code == 0)


def prepare(r: Run, settings: dict, prescan: Prescan | None) -> None:
    """The run's data, model and training state, at its start or where it
    resumes, and its side tasks (r.cfg gets the loader workers this rank gets)."""
    cfg, d = r.cfg, r.d
    everyone = say_ranks(d)
    r.cfg = cfg = replace(cfg, workers=loader_workers(cfg.workers, d, everyone))
    seed_all(cfg.seed + d.rank)
    torch.backends.cudnn.benchmark = d.device.type == "cuda"

    # Rank 0's listing and stats of the dataset, made while this process imported torch (`prescan`).
    scan = prescan.take(cfg.data, cfg.fraction) if prescan is not None and d.is_main else None
    spec = scan.spec if scan else load_data_spec(cfg.data, listed=d.is_main)  # the other ranks: from the index
    r.task = r.task.with_data(spec)  # the task's parts as the data YAML's own keys shape them (pose: kpt_shape)
    # This run's newest valid checkpoint, or the weights to start from (or neither): checked before the
    # dataset's index in the run directory is brought up to date, so that a start refused here writes nothing.
    state, weights = checkpoint_to_resume(r.task, cfg, d, r.folder, settings,
                                          1 if cfg.single_cls else len(spec.names))
    # What cannot be trained on stops here, before a run directory exists.
    r.data = load_data(cfg, d, spec, scan.stats if scan else None, r.task)
    start_run(d, r.folder, settings)
    r.parts = build(r.task, cfg, d, r.data, state, weights)
    r.pos = resume(r.parts, state, d)
    r.pos.epochs = resumed_plan(cfg, state, r.pos)
    r.side.ledger.resumed(r.pos.global_step)
    r.apply_plan()
    r.parts.net = data_parallel(r.parts.model, d)
    health(r.side, cfg, d, r.parts.model, r.folder, [host for *_, host, _, _ in everyone])
    if state is not None and r.side.drills is not None:
        r.side.drills.val_signal = None  # a resumed run validates through
    if d.distributed and r.pos.global_step > 0:  # the run's first step builds the buckets the same way in any start
        settle_buckets(r.parts.net, r.parts.model, r.parts.loss_fn, cfg.imgsz, d.device, r.parts.amp,
                       r.parts.amp_dtype)
    if d.is_main and cfg.tensorboard:  # a requeued run's events from its resumed batch on replace the earlier ones
        done = r.pos.epoch * r.data.batches + r.pos.batch
        r.side.board = StepLosses(EventWriter(r.folder, None if state is None else done + 1), r.parts.loss_fn.names)
    if d.is_main and (cfg.mlflow or cfg.wandb):
        r.side.tracking = Tracking(r.folder, cfg.mlflow, cfg.wandb, {**cfg.to_dict(), "world_size": d.world_size})
    if d.is_main and cfg.plots:
        r.side.drawings = Background()
        if state is None and r.task.draw_labels is not None:  # a new run: its labels, as ultralytics' labels.jpg
            r.side.drawings.submit(r.task.draw_labels, r.data.train_set.labels, r.data.names, r.folder / "labels.jpg")
    attach(r.side, cfg, d)


def train_epochs(r: Run) -> int:
    """Train from r.pos to the planned end (or a stop); returns the exit code."""
    cfg, pos = r.cfg, r.pos
    r.clock = RunClock(pos.run_seconds)
    r.side.ledger.mark("loop")
    r.side.ledger.write()
    loader = train_loader(cfg, r.d, r.data, pos)
    batches = iter(loader)
    try:
        while pos.epoch < pos.epochs:
            if patience_spent(cfg, pos):
                print0(r.d, f"stopping early: no better fitness in the {pos.epoch - pos.best_epoch} epochs after "
                            f"epoch {pos.best_epoch} (patience {cfg.patience}); weights/best.pt holds the last "
                            f"epoch of that fitness")
                break
            planned = pos.epochs
            stopped = train_epoch(r, batches)
            if stopped is not None:
                return stopped
            if r.time_up:  # the batches the workers prepare will not be trained: free their CPU for validation
                stop_workers(batches)
            stopped = end_epoch(r)
            if stopped is not None:
                return stopped
            if cfg.time is not None and pos.epoch >= pos.epochs:
                print0(r.d, f"stopping: the time budget of {cfg.time:g} h holds no further epoch "
                            f"({pos.run_seconds / 3600:.4f} h trained in {pos.epoch} epochs); weights written")
                break
            moved = pos.epochs != planned and not loader.batch_sampler.replan(pos.epoch, pos.epochs - cfg.close_mosaic)
            if moved:  # close_mosaic moved across batches the workers already prepare: a new loader draws them
                r.parts.writer.wait()  # new loader workers fork: never while the checkpoint thread writes
                stop_workers(batches)
                loader = train_loader(cfg, r.d, r.data, pos)
                batches = iter(loader)
    finally:
        stop_workers(batches)
    return complete(r)


def train_epoch(r: Run, batches) -> int | None:
    """Train the rest of epoch r.pos.epoch, a step per pass of the loop; after
    each optimizer step the side tasks, then the ranks' agreed answer to a
    stop request and to the time budget (r.time_up ends the epoch early).
    Returns the exit code when the run stops inside the epoch, else None."""
    cfg, d, data, parts, pos = r.cfg, r.d, r.data, r.parts, r.pos
    parts.net.train()
    parts.loss_fn.set_epoch(pos.epoch, pos.epochs)
    meter = Throughput(d.device)  # this process's part of the epoch: timing, never compared
    epoch = Epoch(Progress(d, f"epoch {pos.epoch + 1}/{pos.epochs}", data.batches, pos.batch, cfg.log_every), meter,
                  t0=time.time() - pos.epoch_seconds, waited=meter.wait)  # a resumed epoch counts the time before
    # Each epoch ends with an optimizer step, and a checkpoint follows one: pos.batch starts a step's batches.
    last_step = pos.epoch * data.batches + pos.batch - 1
    for i, (host_imgs, targets, _, metas) in enumerate(meter.timed(batches, data.batches - pos.batch),
                                                        start=pos.batch):
        at = pos.epoch * data.batches + i  # the run's batch index: the warm-up and schedule follow it
        imgs = device_batch(cfg, d, host_imgs, metas, at)
        for hook in r.side.on_batch:
            hook(r, epoch, i, host_imgs, targets, imgs)
        last_micro = at - last_step >= parts.schedule.accumulate(at) or i + 1 == data.batches
        # The targets as the loader made them, on the host: the loss pads them there (DetectionLoss.gts).
        pos.loss_sum += forward_backward(parts.net, parts.loss_fn, imgs, targets, parts.amp, parts.amp_dtype,
                                         parts.scaler, reduce=last_micro, span=forward_span(r.side, pos.global_step))
        if not last_micro:
            continue
        parts.schedule.apply(parts.optimizer, at)
        last_step = at
        if parts.writer.copying:  # the last checkpoint's copy of what the step changes: done first, a stall
            with r.side.ledger.timed("checkpoint"):
                parts.writer.settle()
        optimizer_step(parts.model, parts.optimizer, parts.scaler, parts.ema, cfg.clip_norm)
        pos.global_step, pos.batch, pos.epoch_seconds = pos.global_step + 1, i + 1, time.time() - epoch.t0
        now = r.clock.seconds(pos.global_step)
        step_seconds, pos.run_seconds = now - pos.run_seconds, now
        for hook in r.side.after_step:
            hook(r, epoch, i)
        stopped = stop_if_asked(r, step_seconds, epoch_done=pos.batch >= data.batches)  # all ranks agree
        if stopped is not None:
            return stopped
        if r.time_up:
            if pos.batch < data.batches:
                print0(d, f"time budget: {cfg.time:g} h less the final validation is spent at epoch "
                          f"{pos.epoch + 1}, batch {pos.batch}: ending the epoch here")
            break
    epoch.progress.close()
    r.speed = merge_figures(gather_objects(d, meter.figures()))
    return None


def end_epoch(r: Run) -> int | None:
    """After an epoch's last batch (or the last the time budget allowed):
    validate the EMA weights, plan the epochs anew where `time` is set,
    checkpoint the start of the next epoch, and on rank 0 the results.csv
    row, last.pt, best.pt (when fitness is the best so far, ties too) and the epoch's line.
    A stop asked for during the validation ends it within a batch: the
    checkpoint then holds the epoch's trained end, and a resumed run
    validates the epoch from its start. Returns the exit code of such a
    stop, else None."""
    cfg, d, pos = r.cfg, r.d, r.pos
    started = r.clock.phase()
    train_loss = reduce_mean(d, pos.loss_sum / max(pos.batch, 1))
    speed = r.speed
    # Each rank's EMA averaged its own BatchNorm statistics; all validate
    # rank 0's, the one the checkpoint keeps, so a resumed run measures the same.
    r.parts.writer.wait()  # validation forks loader workers: never while the checkpoint thread writes
    broadcast_module(d, r.parts.ema.module)  # (after the wait: the checkpoint's copy of the EMA is done)
    last = r.last_validation()
    metrics, validated, stopped = validate_epoch(r, last)
    if stopped is not None:
        return stopped
    # Rank 0's, on every rank: the ranks decide patience's early stop and time's plan alike.
    fitness, seconds = gather_objects(d, (r.task.fitness(metrics), r.clock.seconds(pos.global_step)))[0]
    improved = fitness > pos.best_fitness  # patience's best epoch moves; best.pt is written on a tie too, as
    best_weights = fitness >= pos.best_fitness  # ultralytics' (its best.pt: the last epoch of the best fitness)
    pos.epoch, pos.batch, pos.epoch_seconds = pos.epoch + 1, 0, 0.0
    pos.run_seconds = pos.plan_seconds = seconds
    # A run the budget stopped is done: started again with the same budget, it trains no further.
    pos.epochs = pos.epoch if r.time_up else plan_epochs(cfg, pos.epoch, seconds)
    r.apply_plan()
    if improved or pos.best_fitness == 0:  # ultralytics' rule: an early stretch of zero fitness counts as improving
        pos.best_epoch = pos.epoch
    pos.best_fitness, pos.loss_sum = max(pos.best_fitness, fitness), torch.zeros_like(pos.loss_sum)
    with r.side.watch.phase("checkpoint"), r.side.ledger.timed("checkpoint"):
        save_state(r)
    r.side.ledger.checkpointed(pos.global_step)
    if d.is_main:
        epoch_outputs(r, train_loss, metrics, validated, best_weights, last, seconds, speed)
    # Rank 0's, which decides when the budget is spent: validation, checkpoint and weights.
    pos.end_seconds = max(pos.end_seconds, r.clock.phase() - started)
    return None


def validate_epoch(r: Run, last: bool) -> tuple[dict | None, bool, int | None]:
    """(the epoch's metrics, whether it was validated, None): the validation,
    where cfg.val or the run's last; a stop asked for during it checkpoints
    and ends the run (metrics None, and the exit code last)."""
    validated = r.cfg.val or last
    asked = validation_stop(r)
    metrics = r.task.not_validated
    while validated:
        with r.side.watch.phase("validation"), r.side.ledger.timed("validation"):
            metrics = epoch_metrics(r, plots=last and r.cfg.plots, interrupted=asked)
        if metrics is not INTERRUPTED:
            break
        stopped = stop_if_asked(r, where=f"during epoch {r.pos.epoch + 1}'s validation")
        if stopped is not None:
            return None, validated, stopped
    return metrics, validated, None


def epoch_outputs(r: Run, train_loss, metrics: dict, validated: bool, best: bool, last: bool,
                  seconds: float, speed) -> None:
    """Rank 0, at an epoch's end: results.csv's row (its `time`: `seconds`,
    the run's time so far, validation included, as ultralytics' counts from
    the start of training; and its numbers in TensorBoard and the trackers),
    the weights, the last validation's plots, the epoch's line, and after
    the last one the per-class table."""
    cfg, pos, parts = r.cfg, r.pos, r.parts
    row = write_results(r.folder, pos.epoch - 1, train_loss, parts.loss_fn.names, r.task, metrics,
                        [g["lr"] for g in parts.optimizer.param_groups], seconds, speed)
    values = numbers(row)  # results.csv's row, each parameter group's learning rate in it
    for sink in r.side.sinks():
        sink.scalars(pos.epoch, values)
    names = ["last.pt", *(["best.pt"] if best else [])]
    if cfg.save_period > 0 and (pos.epoch - 1) % cfg.save_period == 0:
        names.append(f"epoch{pos.epoch - 1}.pt")  # ultralytics' name: the epoch counted from 0
    with r.side.ledger.timed("checkpoint"):
        for name in names:
            save_weights(r.folder / rundir.WEIGHTS / name, parts.ema.module, cfg, r.data.names)
    if last and r.side.drawings is not None:  # the last validation's plots, after its weights
        r.side.drawings.submit(r.task.val_plots, metrics, r.data.names, r.folder)
    items = " ".join(f"{name.removesuffix('_loss')} {v:.3f}" for name, v in zip(parts.loss_fn.names, train_loss))
    measured = r.task.describe(metrics) if validated else "not validated (val off)"
    print(f"epoch {pos.epoch}/{pos.epochs}: loss {train_loss.sum():.3f} ({items}) {measured}; {describe(speed)}",
          flush=True)
    if last:  # per class, as ultralytics ends its training
        print(r.task.per_class(metrics, r.data.val_batches.labels, r.data.names), flush=True)


def complete(r: Run) -> int:
    """The run trained every epoch: no marker of an earlier preemption stays
    behind, rank 0 plots results.csv (and shows the plots in TensorBoard at
    the last epoch), and every rank leaves (exit 0)."""
    d = r.d
    r.side.watch.pause()  # the end: plots and a barrier, nothing to bound
    r.side.ledger.mark("finish")
    r.parts.writer.wait()
    if d.is_main:
        for marker in rundir.preempt_markers(r.folder):
            marker.unlink(missing_ok=True)
        # Plotted once, at the end: drawing it every epoch kept the other
        # ranks waiting about a second per epoch (and a signal unanswered).
        from ..report.plots import plot_results

        if r.side.drawings is not None:
            r.side.drawings.wait()  # matplotlib draws in one thread at a time
        plot_results(r.folder / rundir.RESULTS, r.folder / rundir.RESULTS_PLOT)
        for path in sorted(p for pattern in rundir.PLOT_FILES for p in r.folder.glob(pattern)):
            for sink in r.side.sinks():
                sink.image(r.pos.epoch, f"plots/{path.stem}", path)
    print0(d, f"done: results in {r.folder}")
    if d.distributed:
        # Rank 0 draws the plot above while the others are done: none leaves
        # the process group while another still holds it (a gloo rank that
        # tore down meanwhile was seen to abort at exit).
        torch.distributed.barrier()
    return finish(d, 0, keep_scratch=True)  # the batch script removes scratch after a success


def cli_main(cfg: TrainConfig) -> None:
    sys.exit(main(cfg))
