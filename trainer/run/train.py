"""The DDP trainer: `main()` reads top to bottom.

setup -> data -> model and optimizer -> resume -> loop (train, preemption
check, validate, save) -> cleanup. Only rank 0 prints, saves and plots.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import inspect
import math
import os
import random
import signal
import socket
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from . import checkpoint as ckpt
from ..data import index as dataindex
from ..model import families
from ..common import rundir
from ..report.background import Background
from ..data.dataset import AugmentHyp, YoloDataset, collate, keep_freed_memory, load_data_spec
from ..common.datayaml import DataSpec, check_labels, training_files
from ..parallel.dist import Dist, broadcast_module, gather_objects, leave, max_over_ranks, print0, setup, warn0
from .drills import Drills
from ..optim.ema import ModelEMA
from ..common.errors import HpcyoloError
from ..eval.evaluate import INTERRUPTED, ValBatches, batch_drawer, report, table, validate
from ..data.filescan import Prescan
from ..common.fsutil import write_atomic
from ..common.heap import long_lived
from ..common.ledger import Ledger
from ..optim.loss import DetectionLoss, EndToEndLoss
from ..model.detector import ALIASES, build_model
from ..data.photometric import gains_of, hsv_jitter_batch
from ..report.plots import plot_labels, write_val_plots
from ..common.preemption import CHECKPOINT
from ..common.preemption import EXIT_CODE as PREEMPT_EXIT_CODE
from ..common.preemption import NONE, SCRATCH_ENV, STOP, TERMINATED_EXIT_CODE, Decision, StopFlag, mark_preempted
from ..report.progress import Progress, Throughput, describe, merge_figures
from ..data.sampler import EvenShardSampler, RectBatchSampler, RunBatches, steps_per_epoch
from ..data.multiscale import rescale, step_size
from ..optim.schedule import Schedule, build_optimizer, not_traced_inner, warmup_batches_for
from ..common.settings import TrainConfig
from .stragglers import Stragglers
from ..parallel.syncbn import normalise_across_ranks
from ..report.tboard import EventWriter, StepLosses
from ..report.tracking import Tracking, check_installed
from .watchdog import Off, Watchdog
from ..model.weights import Weights, load_into, read_weights

NO_STOP = Decision(NONE)
# A folder: each rank appends `epoch batch height width` of every training
# batch to rank-R.txt in it, so tests can check that the ranks agree.
SHAPES_ENV = "HPCYOLO_STEP_SHAPES"
# Tests: each optimizer step counts as this many seconds of the run's
# training time, and nothing else counts (RunClock).
STEP_SECONDS_ENV = "HPCYOLO_STEP_SECONDS"
BOARD_EVERY = 10  # optimizer steps between the running training losses in TensorBoard


def main(cfg: TrainConfig, stop: StopFlag | None = None, prescan: Prescan | None = None) -> int:
    stop = stop or StopFlag(cfg.signal)
    run = Path(cfg.run_dir)
    settings = rundir.settings(cfg.to_dict())
    rundir.check_continues(run, settings)  # before anything is written, and before the rendezvous
    check_installed(settings)  # a tracker asked for and not installed: one line, before anything runs
    ledger = Ledger()
    ledger.mark("rendezvous")
    d = setup(cfg.dist_timeout)
    ledger.mark("setup")
    if d.is_main:
        ledger.path = rundir.ledger_file(run, *this_start(), ".json")
    with long_lived():
        cfg, data, parts, pos = prepare(cfg, d, run, settings, ledger, prescan)
    print0(d, f"training {parts.model.arch} on {len(data.train_set)} images ({data.nc} classes), {d.world_size} "
              f"rank(s) x {data.batch_per_rank} images, {data.batches} batches per epoch, accumulate "
              f"{parts.accumulate}, {cfg.workers} loader worker(s) per rank, device {d.device}")
    print0(d, f"arithmetic: {arithmetic(parts.amp, parts.amp_dtype, layout(cfg, d.device))}")
    code = None
    try:
        code = train_epochs(cfg, d, data, parts, pos, run, stop)
        return code
    finally:
        parts.watch.close()
        ledger.mark("exit")
        ledger.write()
        if parts.drawings is not None:
            parts.drawings.wait()
        if parts.board is not None:
            parts.board.close()
        if parts.tracking is not None:
            for line in parts.tracking.close(finished=code == 0):
                print(line, flush=True)


def prepare(cfg: TrainConfig, d: Dist, run: Path, settings: dict, ledger: Ledger, prescan: Prescan | None
            ) -> tuple[TrainConfig, Data, Parts, Position]:
    """The run's data, model and training state, at its start or where it
    resumes: (the config with the loader workers this rank gets, ...)."""
    everyone = say_ranks(d)
    cfg = replace(cfg, workers=loader_workers(cfg.workers, d, everyone))
    seed_all(cfg.seed + d.rank)
    torch.backends.cudnn.benchmark = d.device.type == "cuda"

    # Rank 0's listing and stats of the dataset, made while this process imported torch (`prescan`).
    scan = prescan.take(cfg.data, cfg.fraction) if prescan is not None and d.is_main else None
    spec = scan.spec if scan else load_data_spec(cfg.data, listed=d.is_main)  # the other ranks: from the index
    # This run's newest valid checkpoint, or the weights to start from (or neither): checked before the
    # dataset's index in the run directory is brought up to date, so that a start refused here writes nothing.
    state, weights = checkpoint_to_resume(cfg, d, run, settings, 1 if cfg.single_cls else len(spec.names))
    # What cannot be trained on stops here, before a run directory exists.
    data = load_data(cfg, d, spec, scan.stats if scan else None)
    start_run(d, run, settings)
    parts = build(cfg, d, data, state, weights)
    pos = resume(parts, state, d)
    pos.epochs = resumed_plan(cfg, state, pos)
    parts.ledger = ledger
    ledger.resumed(pos.global_step)
    apply_plan(parts, pos)
    parts.net = data_parallel(parts.model, d)
    health(cfg, d, parts, run, [host for *_, host, _, _ in everyone])
    if state is not None and parts.drills is not None:
        parts.drills.val_signal = None  # a resumed run validates through
    if d.distributed and pos.global_step > 0:  # the run's first step builds the buckets the same way in any start
        settle_buckets(parts.net, parts.model, parts.loss_fn, cfg.imgsz, d.device, parts.amp, parts.amp_dtype)
    if d.is_main and cfg.tensorboard:  # a requeued run's events from its resumed batch on replace the earlier ones
        done = pos.epoch * data.batches + pos.batch
        parts.board = StepLosses(EventWriter(run, None if state is None else done + 1), parts.loss_fn.names)
    if d.is_main and (cfg.mlflow or cfg.wandb):
        parts.tracking = Tracking(run, cfg.mlflow, cfg.wandb, {**cfg.to_dict(), "world_size": d.world_size})
    if d.is_main and cfg.plots:
        parts.drawings = Background()
        if state is None:  # a new run: its training labels, as ultralytics' labels.jpg shows them
            parts.drawings.submit(plot_labels, data.train_set.labels, data.names, run / "labels.jpg")
    return cfg, data, parts, pos


def train_epochs(cfg: TrainConfig, d: Dist, data: Data, parts: Parts, pos: Position, run: Path,
                 stop: StopFlag) -> int:
    """Train from `pos` to the planned end (or a stop); returns the exit code."""
    clock = RunClock(pos.run_seconds)
    parts.ledger.mark("loop")
    parts.ledger.write()
    loader = train_loader(cfg, d, data, pos)
    train_batches = iter(loader)
    try:
        while pos.epoch < pos.epochs:
            if patience_spent(cfg, pos):
                print0(d, f"stopping early: no better fitness in the {pos.epoch - pos.best_epoch} epochs after epoch "
                          f"{pos.best_epoch} (patience {cfg.patience}); weights/best.pt holds epoch {pos.best_epoch}")
                break
            planned = pos.epochs
            stopped = train_epoch(cfg, d, data, parts, pos, train_batches, stop, clock)
            if stopped is not None:
                return stopped
            if pos.time_up:  # the batches the workers prepare will not be trained: free their CPU for validation
                stop_workers(train_batches)
            stopped = end_epoch(cfg, d, data, parts, pos, run, clock, stop)
            if stopped is not None:
                return stopped
            if cfg.time is not None and pos.epoch >= pos.epochs:
                print0(d, f"stopping: the time budget of {cfg.time:g} h holds no further epoch "
                          f"({pos.run_seconds / 3600:.4f} h trained in {pos.epoch} epochs); weights written")
                break
            moved = pos.epochs != planned and not loader.batch_sampler.replan(pos.epoch, pos.epochs - cfg.close_mosaic)
            if moved:  # close_mosaic moved across batches the workers already prepare: a new loader draws them
                parts.writer.wait()  # new loader workers fork: never while the checkpoint thread writes
                stop_workers(train_batches)
                loader = train_loader(cfg, d, data, pos)
                train_batches = iter(loader)
    finally:
        stop_workers(train_batches)
    return complete(d, parts, run, pos.epoch)


class RunClock:
    """The run's training time, which `time` budgets: what its earlier jobs
    trained (checkpointed) plus this job's time since its training loop
    began. With STEP_SECONDS_ENV set (tests), each optimizer step counts as
    that many seconds and nothing else counts: the run's time decisions are
    then the same in every run of it, and a resumed run can be compared
    with an uninterrupted one exactly."""

    def __init__(self, before: float):
        self.before, self.t0 = before, time.monotonic()
        fake = os.environ.get(STEP_SECONDS_ENV)
        self.step_seconds = float(fake) if fake else None

    def seconds(self, step: int) -> float:
        """The run's training time at optimizer step `step`."""
        if self.step_seconds is not None:
            return step * self.step_seconds
        return self.before + time.monotonic() - self.t0

    def phase(self) -> float:
        """Now, for timing an epoch's end (0 with the test clock: it does not count)."""
        return 0.0 if self.step_seconds is not None else time.monotonic()


def plan_epochs(cfg: TrainConfig, epochs_done: int, seconds: float) -> int:
    """The epochs the run trains: cfg.epochs, or with `time` ultralytics'
    plan, ceil(budget / the run's mean epoch time so far) (cfg.epochs before
    an epoch was timed)."""
    if cfg.time is None:
        return cfg.epochs
    if epochs_done == 0 or seconds <= 0:
        return cfg.epochs
    return math.ceil(cfg.time * 3600 / (seconds / epochs_done))


def resumed_plan(cfg: TrainConfig, state: dict | None, pos: Position) -> int:
    """The plan a started or resumed run follows: the checkpoint's, made at
    the end of its last epoch, while the budget is the one it was made for;
    another budget (or none) plans anew."""
    if state is not None and cfg.time is not None and state["config"].get("time") == cfg.time and "epochs" in state:
        return state["epochs"]
    return plan_epochs(cfg, pos.epoch, pos.plan_seconds)


def apply_plan(parts: Parts, pos: Position) -> None:
    """The learning-rate schedule and the end-to-end loss's weights follow the planned epochs."""
    if parts.schedule.epochs != pos.epochs:
        parts.schedule = parts.schedule.planned(pos.epochs)
    parts.loss_fn.set_epoch(pos.epoch, pos.epochs)


@dataclass
class Data:
    """The data of a run, as this rank sees it."""
    spec: DataSpec
    names: list[str]  # the classes trained: the data YAML's, or single_cls' one
    train_set: YoloDataset
    val_batches: ValBatches
    sampler: EvenShardSampler | RectBatchSampler  # this rank's share of each epoch
    batches: int  # global batches per epoch
    batch_per_rank: int

    @property
    def nc(self) -> int:
        return len(self.names)


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
    loss_fn: DetectionLoss | EndToEndLoss
    writer: ckpt.Writer
    net: torch.nn.Module | None = None  # the model under DDP, once placed
    board: StepLosses | None = None  # rank 0's TensorBoard events (tboard.py), once the run directory is there
    tracking: Tracking | None = None  # rank 0's MLflow and W&B runs (tracking.py)
    drawings: Background | None = None  # rank 0's plots, drawn off the loop
    watch: Watchdog | Off = Off()  # the hang watchdog (watchdog.py)
    stragglers: Stragglers | None = None  # the slow-rank report (stragglers.py)
    drills: Drills | None = None  # the health drills set for this rank (drills.py)
    ledger: Ledger = field(default_factory=Ledger)  # where this start's time goes (ledger.py): rank 0 writes it


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
    time_up: bool = False  # the budget leaves no room for another step and the final validation
    loss_sum: torch.Tensor | None = None  # this rank's loss items summed over the epoch's batches
    speed: tuple | None = None  # the epoch's throughput figures, once it is trained (not checkpointed)


def load_data(cfg: TrainConfig, d: Dist, spec: DataSpec | None = None, stats: dict | None = None) -> Data:
    """The data YAML (`spec`, where read already), the training set (this
    rank's sampler) and the validation batches; warnings once, on rank 0,
    and an error for data that cannot be trained on. `stats`: rank 0's
    stats of the training (at cfg.fraction) and validation images, by
    split, where taken already (filescan.Prescan)."""
    spec = spec or load_data_spec(cfg.data, listed=d.is_main)
    nc = len(spec.names)
    batch_per_rank = cfg.batch // d.world_size
    # On a GPU the HSV jitter runs there, on the whole batch (photometric.py).
    train_files = training_files(spec.train, cfg.fraction) if d.is_main else None  # others: from the index
    with indexed(d, spec, nc, Path(cfg.run_dir), {"train": train_files, "val": spec.val}, stats) as checked:
        if d.is_main:  # refused there, the other ranks stop with its words (see indexed)
            # Label files counted from the index's stats where it holds the whole split, not listed again.
            known = {split: checked[split].labelled() for split, files in (("train", train_files), ("val", spec.val))
                     if files is getattr(spec, split) and hasattr(checked[split], "labelled")}
            for warning in check_labels(spec, ("train", "val"), known):
                warn0(d, warning)
        train_set = YoloDataset(train_files, cfg.imgsz, augment=cfg.augment,
                                hyp=augment_hyp(cfg), seed=cfg.seed, cache=cfg.cache,
                                cache_dir=cache_folder(cfg) / "train", names_count=nc,
                                rect_batch=cfg.batch if cfg.rect else 0, hsv_on_device=d.device.type == "cuda",
                                checked=checked["train"])
        # Validated as ultralytics' trainer does: rectangular batches of twice the training batch per rank.
        val_batches = ValBatches(spec.val, nc, cfg.imgsz, 2 * batch_per_rank,
                                 cache_dir=cache_folder(cfg) / "val" if cfg.cache != "none" else None,
                                 checked=checked["val"])
        for problem in train_set.problems + val_batches.problems:
            warn0(d, problem)
        refuse_unlearnable(cfg.data, train_set, nc)
        names = list(spec.names)
        if cfg.classes is not None:  # as ultralytics: other classes' boxes dropped, in training and validation alike
            missing = sorted(set(cfg.classes) - set(range(nc)))
            if missing:
                raise HpcyoloError(f"classes (train.classes, --classes): {missing} not among the {nc} classes of "
                                   f"{cfg.data} (ids 0..{nc - 1})")
            train_set.keep_classes(cfg.classes)
            val_batches.labels = [lb[np.isin(lb[:, 0], cfg.classes)] for lb in val_batches.labels]
        if cfg.single_cls:  # as ultralytics: one class, "item", in training and validation alike
            names = ["item"]
            for split in (train_set, val_batches):
                split.labels = [np.concatenate([np.zeros_like(lb[:, :1]), lb[:, 1:]], axis=1) for lb in split.labels]
            val_batches.nc = 1
    sampler = RectBatchSampler([idx for idx, _ in train_set.batches], batch_per_rank, d.rank, d.world_size, cfg.seed) \
        if cfg.rect else EvenShardSampler(len(train_set), d.rank, d.world_size, cfg.seed)
    batches = steps_per_epoch(len(train_set), d.world_size, batch_per_rank)
    assert not cfg.rect or len(train_set.batches) == batches, "rect batches and steps per epoch disagree"
    return Data(spec, names, train_set, val_batches, sampler, batches, batch_per_rank)


@contextmanager
def indexed(d: Dist, spec: DataSpec, nc: int, run: Path, splits: dict[str, list[Path]],
            stats: dict | None = None):
    """Each split's check results (dataindex.Results: data.Checked on demand,
    dropped images too; the datasets sift them straight from the index's
    arrays) from the dataset's index in the run directory (dataindex.py). Rank 0 brings the
    index up to date, checking only the files that changed since it was
    written (a new run: since the user's cache's index of the dataset was,
    dataindex.shared_file, which it then brings up to date too), while the
    other ranks wait; it writes the index once the data
    is accepted (leaving the block: data that cannot be trained on stops
    before a run directory exists), then every rank reads it, one file per
    split, which names the images (`splits`, each split's images, are rank
    0's alone: the other ranks list no folder). Where the index is current
    (nothing to write: a start that wrote it accepted the data), rank 0 says
    so at once and the other ranks read it while rank 0 builds its datasets;
    its verdict on the data follows when it leaves the block. What stops
    rank 0 in the block stops the others with its words."""
    if not d.is_main:
        versions, error, current = _word_of_rank_0()
        if error:
            raise HpcyoloError(error)
        try:
            checked = {split: dataindex.read(rundir.index_file(run, split), spec.root, version)
                       for split, version in versions.items()}
        except OSError as e:
            raise HpcyoloError(f"rank {d.rank}: {e}") from None
        yield checked
        if current:  # told before rank 0 built its datasets: its verdict on the data
            _, error, _ = _word_of_rank_0()
            if error:
                raise HpcyoloError(error)
        return
    built, versions = {}, {}
    try:
        for split, files in splits.items():
            t0 = time.monotonic()
            # The user's cache's index of this split (named only where the run's own is not current): a new
            # run starts from it, and keeps it up to date where it reads the whole split (not a --fraction).
            shared = functools.partial(dataindex.shared_file, spec.root, split, spec.yaml)
            built[split] = dataindex.refresh(files, nc, spec.root, rundir.index_file(run, split),
                                             (stats or {}).get(split), shared, keep=files is getattr(spec, split))
            if built[split][2]:
                print0(d, f"{split}: checked {built[split][2]} of {len(files)} images in "
                          f"{time.monotonic() - t0:.1f} s for the dataset index ({rundir.index_file(run, split)})")
        if d.distributed and all(index is None for _, index, _, _ in built.values()):
            torch.distributed.broadcast_object_list([({split: b[3] for split, b in built.items()}, None, True)], 0)
        yield {split: results for split, (results, *_) in built.items()}
        for split, (_, index, _, version) in built.items():
            if index is not None:
                try:
                    dataindex.write(rundir.index_file(run, split), index)
                except OSError as e:
                    raise HpcyoloError(f"cannot write the dataset index {rundir.index_file(run, split)}: "
                                       f"{e.strerror or e}") from None
                if index.origin is not None:
                    print0(d, f"{split}: the dataset index from {index.origin} (a run or val before this one "
                              "indexed these files; none changed since)")
            versions[split] = version
    except Exception as e:
        if d.distributed:  # the others wait for the index, or for the verdict: they stop too, with the same words
            why = str(e) if isinstance(e, HpcyoloError) else f"rank 0 failed to load the data ({type(e).__name__}: {e})"
            torch.distributed.broadcast_object_list([({}, why, False)], 0)
        raise
    if d.distributed:  # the index to read, or (told already) that the data is accepted
        torch.distributed.broadcast_object_list([(versions, None, False)], 0)


def _word_of_rank_0() -> tuple[dict[str, str], str | None, bool]:
    """What rank 0 broadcasts in `indexed`: (each split's index version, its
    error or None, whether it told before accepting the data)."""
    shared = [None]
    torch.distributed.broadcast_object_list(shared, 0)
    return shared[0]


def augment_hyp(cfg: TrainConfig) -> AugmentHyp:
    """The augmentation strengths of `cfg` (every AugmentHyp field is a setting of the same name)."""
    return AugmentHyp(**{f.name: getattr(cfg, f.name) for f in fields(AugmentHyp)
                         if f.name != "close_mosaic"})


def checkpoint_to_resume(cfg: TrainConfig, d: Dist, run: Path, settings: dict,
                         nc: int) -> tuple[dict | None, Weights | None]:
    """(the run's newest valid checkpoint, None), or (None, the --weights to
    start from, or None). Either must do for this run (the checkpoint its
    settings, architecture and classes; the weights an architecture hpcyolo
    trains) before rank 0 writes a file (start_run)."""
    state = ckpt.load_latest(run / rundir.CHECKPOINTS, lambda m: warn0(d, m))
    weights = None
    if state is not None:
        rundir.check_continues(run, settings, saved=state["config"])
        state["arch"] = resumed_arch(state, cfg, nc)
    elif cfg.weights:
        weights = read_weights(cfg.weights)
    arch = state["arch"] if state is not None else choose_arch(cfg, weights)
    if cfg.end2end and not families.load(arch[:-1]).END2END:
        raise HpcyoloError(f"end2end (--end2end, train.end2end): {arch} has no one-to-one head; NMS-free "
                           "validation is for YOLO26")
    return state, weights


def start_run(d: Dist, run: Path, settings: dict) -> None:
    """The run accepted: rank 0 removes unfinished checkpoint writes and
    records the settings in RUN/config.yaml."""
    if d.is_main:
        for partial in ckpt.remove_partials(run / rundir.CHECKPOINTS):
            warn0(d, f"removed {partial.name}, a checkpoint whose write never finished")
        (run / rundir.WEIGHTS).mkdir(parents=True, exist_ok=True)
        write_atomic(run / rundir.CONFIG, yaml.safe_dump(settings, sort_keys=False).encode())


def build(cfg: TrainConfig, d: Dist, data: Data, state: dict | None, weights: Weights | None) -> Parts:
    """The model (the checkpoint's architecture, else --model or --weights'),
    placed on the device, with its EMA, optimizer, schedule, mixed precision
    and loss. A checkpoint wins over --weights: its tensors are loaded by resume()."""
    arch = state["arch"] if state is not None else choose_arch(cfg, weights)
    model, report = initial_model(arch, data.nc, cfg.seed, weights)
    if report:
        print0(d, report)
    model = place_model(model, d, layout(cfg, d.device))
    if cfg.freeze:  # after place_model: its BatchNorm layers for several ranks are new modules
        print0(d, freeze(model, cfg.freeze))
    if cfg.optimizer == "auto":
        name, lr0, momentum, _ = choose_optimizer(cfg, data.nc, len(data.train_set))
        given = "" if cfg.lr0 is None else f"; the lr0 {cfg.lr0:g} given is not used: name an optimizer to use it"
        print0(d, f"optimizer auto: {name}, lr0 {lr0:g}, momentum {momentum:g}, warmup_bias_lr 0 (ultralytics' rule"
                  f"{given})")
    optimizer, schedule, accumulate = build_optimization(cfg, model, data.batches, len(data.train_set))
    amp, amp_dtype, scaler = mixed_precision(d.device, cfg.amp)
    return Parts(model, ModelEMA(model), optimizer, schedule, accumulate, amp, amp_dtype, scaler,
                 detection_loss(model, data.nc, d, cfg), ckpt.Writer())


def resume(parts: Parts, state: dict | None, d: Dist) -> Position:
    """Load the checkpoint `state` into `parts` and this rank's RNG; where it
    stopped (the start of a fresh run without one)."""
    if state is None:
        return Position(loss_sum=torch.zeros(3, device=d.device))
    parts.model.load_state_dict(state["model"])
    parts.ema.load_state_dict(state["ema"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scaler.load_state_dict(state["scaler"])
    pos = Position(state["epoch"], state["batch"], state["global_step"], state["best_fitness"],
                   state.get("best_epoch", 0), state.get("epoch_seconds", 0.0),
                   run_seconds=state.get("run_seconds", 0.0), plan_seconds=state.get("plan_seconds", 0.0),
                   end_seconds=state.get("end_seconds", 0.0), loss_sum=restore_rank_state(state, d).to(d.device))
    print0(d, f"resumed from {Path(state['path']).name}: epoch {pos.epoch + 1}, batch {pos.batch}, "
              f"step {pos.global_step}")
    return pos


def train_loader(cfg: TrainConfig, d: Dist, data: Data, pos: Position) -> DataLoader:
    """One loader for the whole run, from `pos` on (sampler.RunBatches): its
    workers start once, here, before the checkpoint thread ever writes (a
    child forked amid another thread's lock can hang, and the job with it),
    and prepare each epoch's first batches while the last one ends. (Only
    a `time` plan that moves close_mosaic across batches already prepared
    makes a new one.)"""
    run_batches = RunBatches(data.sampler, data.batch_per_rank, pos.epoch, pos.batch * data.batch_per_rank,
                             None if cfg.time is not None else pos.epochs, mosaic_until=pos.epochs - cfg.close_mosaic)
    return DataLoader(data.train_set, batch_sampler=run_batches, num_workers=cfg.workers, collate_fn=collate,
                      pin_memory=d.device.type == "cuda",
                      worker_init_fn=functools.partial(ignore_signals, (cfg.signal, "TERM")))


def train_epoch(cfg: TrainConfig, d: Dist, data: Data, parts: Parts, pos: Position, train_batches,
                stop: StopFlag, clock: RunClock) -> int | None:
    """Train the rest of epoch pos.epoch; after each optimizer step, the
    checkpoint cadence and the ranks' agreed answer to a stop request and
    to the time budget (pos.time_up ends the epoch early). Returns the exit
    code when the run stops inside the epoch, else None."""
    parts.net.train()
    parts.loss_fn.set_epoch(pos.epoch, pos.epochs)
    progress = Progress(d, f"epoch {pos.epoch + 1}/{pos.epochs}", data.batches, pos.batch, cfg.log_every)
    t0 = time.time() - pos.epoch_seconds  # a resumed epoch counts the time before the stop too
    meter = Throughput(d.device)  # this process's part of the epoch: timing, never compared
    # Each epoch ends with an optimizer step, and a checkpoint follows one: pos.batch starts a step's batches.
    last_step = pos.epoch * data.batches + pos.batch - 1
    waited = meter.wait
    for i, (imgs, targets, _, metas) in enumerate(meter.timed(train_batches, data.batches - pos.batch),
                                                   start=pos.batch):
        if parts.drawings is not None and pos.epoch == 0 and i < 3:  # ultralytics' train_batch0..2.jpg
            parts.drawings.submit(draw_train_batch, imgs.numpy().copy(), targets.numpy().copy(), data.names,
                                  Path(cfg.run_dir) / f"train_batch{i}.jpg")
        imgs = device_batch(cfg, d, imgs, metas, pos.epoch * data.batches + i)
        record_shape(d, pos.epoch, i, imgs.shape)
        at = pos.epoch * data.batches + i  # the run's batch index: the warm-up and schedule follow it
        last_micro = at - last_step >= parts.schedule.accumulate(at) or i + 1 == data.batches
        # The targets as the loader made them, on the host: the loss pads them there (DetectionLoss.gts).
        pos.loss_sum += forward_backward(parts.net, parts.loss_fn, imgs, targets,
                                         parts.amp, parts.amp_dtype, parts.scaler, reduce=last_micro,
                                         span=forward_span(parts, pos.global_step))
        if not last_micro:
            continue
        parts.schedule.apply(parts.optimizer, at)
        last_step = at
        if parts.writer.copying:  # the last checkpoint's copy of what the step changes: done first, a stall
            with parts.ledger.timed("checkpoint"):
                parts.writer.settle()
        optimizer_step(parts.model, parts.optimizer, parts.scaler, parts.ema, cfg.clip_norm)
        pos.global_step, pos.batch, pos.epoch_seconds = pos.global_step + 1, i + 1, time.time() - t0
        now = clock.seconds(pos.global_step)
        step_seconds, pos.run_seconds = now - pos.run_seconds, now
        parts.watch.beat(pos.global_step)
        parts.ledger.step(pos.global_step)
        if parts.drills is not None:
            parts.drills.after_step(pos.global_step)
        if parts.stragglers is not None:
            for line in parts.stragglers.step(meter.wait - waited, pos.global_step):
                print(line, flush=True)
            waited = meter.wait
        progress.update(i + 1, pos.loss_sum / (i + 1))
        if parts.board is not None and pos.global_step % BOARD_EVERY == 0:
            parts.board.add(pos.epoch * data.batches + i + 1, pos.loss_sum / (i + 1))
        if cfg.save_every and pos.global_step % cfg.save_every == 0:
            with parts.watch.phase("checkpoint"), parts.ledger.timed("checkpoint"):
                save_state(d, cfg, parts, pos)
            parts.ledger.checkpointed(pos.global_step)
        stopped = stop_if_asked(cfg, d, parts, pos, stop, step_seconds,  # all ranks agree, after the optimizer step
                                epoch_done=pos.batch >= data.batches)
        if stopped is not None:
            return stopped
        if pos.time_up:
            if pos.batch < data.batches:
                print0(d, f"time budget: {cfg.time:g} h less the final validation is spent at epoch {pos.epoch + 1}, "
                          f"batch {pos.batch}: ending the epoch here")
            break
    progress.close()
    pos.epoch_seconds = time.time() - t0  # the training loop alone, for results.csv
    pos.speed = merge_figures(gather_objects(d, meter.figures()))
    return None


def device_batch(cfg: TrainConfig, d: Dist, imgs: torch.Tensor, metas, step: int) -> torch.Tensor:
    """A batch of uint8 images as the model trains on it: on the device, in
    [0, 1], HSV-jittered where the loader left that to the device, resized
    for multi-scale training (the same size on every rank: seeded by step)."""
    imgs = imgs.to(d.device, non_blocking=True).float() / 255
    if (gains := gains_of(metas)) is not None:
        imgs = hsv_jitter_batch(imgs, gains)
    if cfg.multi_scale:
        imgs = rescale(imgs, step_size(cfg.imgsz, cfg.multi_scale, cfg.seed, step), cfg.imgsz)
    return imgs.contiguous(memory_format=layout(cfg, d.device))


def stop_if_asked(cfg: TrainConfig, d: Dist, parts: Parts, pos: Position, stop: StopFlag,
                  step_seconds: float = 0.0, where: str | None = None, epoch_done: bool = False) -> int | None:
    """The ranks' agreed answer to a stop request (agreed_stop): None to go
    on, else the exit code, after a checkpoint where the answer asks for one.
    Also whether the time budget is spent (pos.time_up, budget_spent;
    `epoch_done`: the step was its epoch's last)."""
    # Rank 0's clock decides for every rank; in the same all-reduce as the stop request.
    budget = d.is_main and budget_spent(cfg, pos, step_seconds, epoch_done)
    with parts.watch.phase("stop drill") if stop.drill else nullcontext():  # a drill may hold for a signal
        now, pos.time_up = agreed_stop(d, stop, pos.global_step, budget)
    if now.action != NONE:
        parts.watch.pause()  # a preemption or a stop is handled: nothing is bounded any more
    where = where or f"at epoch {pos.epoch + 1}, batch {pos.batch}"
    if now.action == STOP:
        print0(d, f"hpcyolo: job cancelled: stopping {where} without a checkpoint; it will not be requeued"
               if now.reason == "cancelled" else
               f"hpcyolo: stopping {where} without a checkpoint ({now.reason}); it will not be requeued")
        return finish(d, TERMINATED_EXIT_CODE, keep_scratch=False)
    if now.action == CHECKPOINT:
        # Said before the checkpoint's barrier: once a rank exits, srun may end the others.
        print0(d, f"stopping for preemption ({now.reason}) {where}: writing a checkpoint, then exit "
                  f"{PREEMPT_EXIT_CODE}")
        with parts.ledger.timed("checkpoint"):
            save_state(d, cfg, parts, pos, preempted=now.reason)
        parts.ledger.checkpointed(pos.global_step)
        return finish(d, PREEMPT_EXIT_CODE, keep_scratch=now.requeue)
    return None


def end_epoch(cfg: TrainConfig, d: Dist, data: Data, parts: Parts, pos: Position, run: Path,
              clock: RunClock, stop: StopFlag) -> int | None:
    """After an epoch's last batch (or the last the time budget allowed):
    validate the EMA weights, plan the epochs anew where `time` is set,
    checkpoint the start of the next epoch, and on rank 0 the results.csv
    row, last.pt, best.pt (when fitness improved) and the epoch's line.
    A stop asked for during the validation ends it within a batch: the
    checkpoint then holds the epoch's trained end, and a resumed run
    validates the epoch from its start. Returns the exit code of such a
    stop, else None."""
    started = clock.phase()
    train_loss = reduce_mean(d, pos.loss_sum / max(pos.batch, 1))
    train_seconds, speed = pos.epoch_seconds, pos.speed
    # Each rank's EMA averaged its own BatchNorm statistics; all validate
    # rank 0's, the one the checkpoint keeps, so a resumed run measures the same.
    parts.writer.wait()  # validation forks loader workers: never while the checkpoint thread writes
    broadcast_module(d, parts.ema.module)  # (after the wait: the checkpoint's copy of the EMA is done)
    # The plots of the run's last validation, as ultralytics draws them: the planned end, the
    # time budget's, or patience's (its last epoch without a better fitness; with val off, as in
    # ultralytics, no fitness is measured before the end and patience never stops the run).
    last = pos.epoch + 1 >= pos.epochs or pos.time_up or \
        (cfg.val and cfg.patience > 0 and pos.epoch + 1 - pos.best_epoch >= cfg.patience)
    validated = cfg.val or last
    asked = validation_stop(cfg, parts, stop)
    metrics = dict(NOT_VALIDATED)
    while validated:
        with parts.watch.phase("validation"), parts.ledger.timed("validation"):
            metrics = epoch_metrics(d, parts.ema.module, data.val_batches, cfg, data.names, run,
                                    plots=last and cfg.plots, drawings=parts.drawings, interrupted=asked)
        if metrics is not INTERRUPTED:
            break
        stopped = stop_if_asked(cfg, d, parts, pos, stop, where=f"during epoch {pos.epoch + 1}'s validation")
        if stopped is not None:
            return stopped
    # Rank 0's, on every rank: the ranks decide patience's early stop and time's plan alike.
    fitness, seconds = gather_objects(d, (rundir.fitness(metrics["map50"], metrics["map50_95"]),
                                          clock.seconds(pos.global_step)))[0]
    improved = fitness > pos.best_fitness
    pos.epoch, pos.batch, pos.epoch_seconds = pos.epoch + 1, 0, 0.0
    pos.run_seconds = pos.plan_seconds = seconds
    # A run the budget stopped is done: started again with the same budget, it trains no further.
    pos.epochs = pos.epoch if pos.time_up else plan_epochs(cfg, pos.epoch, seconds)
    apply_plan(parts, pos)
    if improved or pos.best_fitness == 0:  # ultralytics' rule: an early stretch of zero fitness counts as improving
        pos.best_epoch = pos.epoch
    pos.best_fitness, pos.loss_sum = max(pos.best_fitness, fitness), torch.zeros(3, device=d.device)
    with parts.watch.phase("checkpoint"), parts.ledger.timed("checkpoint"):
        save_state(d, cfg, parts, pos)
    parts.ledger.checkpointed(pos.global_step)
    if d.is_main:
        row = write_results(run, pos.epoch - 1, train_loss, parts.loss_fn.names, metrics,
                            parts.optimizer.param_groups[0]["lr"], train_seconds, speed)
        # results.csv's row, and each parameter group's learning rate
        values = {**numbers(row), **{f"lr/pg{k}": g["lr"] for k, g in enumerate(parts.optimizer.param_groups)}}
        for sink in (parts.board and parts.board.writer, parts.tracking):
            if sink is not None:
                sink.scalars(pos.epoch, values)
        names = ["last.pt", *(["best.pt"] if improved else [])]
        if cfg.save_period > 0 and (pos.epoch - 1) % cfg.save_period == 0:
            names.append(f"epoch{pos.epoch - 1}.pt")  # ultralytics' name: the epoch counted from 0
        with parts.ledger.timed("checkpoint"):
            for name in names:
                save_weights(run / rundir.WEIGHTS / name, parts.ema.module, cfg, data.names)
        if last and parts.drawings is not None:  # the last validation's plots, after its weights
            parts.drawings.submit(write_val_plots, metrics, data.names, run)
        box, cls, third = (name.removesuffix("_loss") for name in parts.loss_fn.names)
        measured = (f"P {metrics['precision']:.3f} R {metrics['recall']:.3f} mAP50 {metrics['map50']:.3f} "
                    f"mAP50-95 {metrics['map50_95']:.3f}") if validated else "not validated (val off)"
        print(f"epoch {pos.epoch}/{pos.epochs}: loss {train_loss.sum():.3f} "
              f"({box} {train_loss[0]:.3f} {cls} {train_loss[1]:.3f} {third} {train_loss[2]:.3f}) "
              f"{measured}; {describe(speed)}", flush=True)
        if last:  # per class, as ultralytics ends its training
            print(table(report(metrics, data.val_batches.labels, data.names)), flush=True)
    # Rank 0's, which decides when the budget is spent: validation, checkpoint and weights.
    pos.end_seconds = max(pos.end_seconds, clock.phase() - started)
    return None


def validation_stop(cfg: TrainConfig, parts: Parts, stop: StopFlag):
    """What a validation asks before each of its batches: whether a signal
    came (and the drill that sends one, where set)."""
    batches = iter(range(1 << 62))

    def asked() -> bool:
        if parts.drills is not None:
            parts.drills.in_validation(next(batches), cfg.signal)
        return stop.requested

    return asked


def complete(d: Dist, parts: Parts, run: Path, epoch: int) -> int:
    """The run trained every epoch: no marker of an earlier preemption stays
    behind, rank 0 plots results.csv (and shows the plots in TensorBoard at
    `epoch`), and every rank leaves (exit 0)."""
    parts.watch.pause()  # the end: plots and a barrier, nothing to bound
    parts.ledger.mark("finish")
    parts.writer.wait()
    if d.is_main:
        for marker in rundir.preempt_markers(run):
            marker.unlink(missing_ok=True)
        # Plotted once, at the end: drawing it every epoch kept the other
        # ranks waiting about a second per epoch (and a signal unanswered).
        from ..report.plots import plot_results

        if parts.drawings is not None:
            parts.drawings.wait()  # matplotlib draws in one thread at a time
        plot_results(run / rundir.RESULTS, run / rundir.RESULTS_PLOT)
        for path in sorted(p for pattern in rundir.PLOT_FILES for p in run.glob(pattern)):
            for sink in (parts.board and parts.board.writer, parts.tracking):
                if sink is not None:
                    sink.image(epoch, f"plots/{path.stem}", path)
    print0(d, f"done: results in {run}")
    if d.distributed:
        # Rank 0 draws the plot above while the others are done: none leaves
        # the process group while another still holds it (a gloo rank that
        # tore down meanwhile was seen to abort at exit).
        torch.distributed.barrier()
    return finish(d, 0, keep_scratch=True)  # the batch script removes scratch after a success


def patience_spent(cfg: TrainConfig, pos: Position) -> bool:
    """Whether cfg.patience epochs passed since the best one (ultralytics'
    EarlyStopping); a pure function of the checkpointed position, so a
    resumed run decides as the uninterrupted one. With val off no fitness
    is measured before the end: never."""
    return cfg.val and cfg.patience > 0 and pos.epoch - pos.best_epoch >= cfg.patience


def freeze(model, layers: int) -> str:
    """Stop the weights of ultralytics' layers 0..layers-1 from training
    (no gradient, so neither the optimizer nor DDP holds them); the line that says so."""
    prefixes = tuple(f"{name}." for name in families.load(model.family).ULTRALYTICS_LAYERS[:layers] if name)
    frozen = [p for name, p in model.named_parameters() if name.startswith(prefixes)]
    if len(frozen) == len(list(model.parameters())):
        raise HpcyoloError(f"freeze: {layers} layers are the whole {model.arch}; nothing would train")
    for p in frozen:
        p.requires_grad_(False)
    return f"freeze: layers 0-{layers - 1} ({len(frozen)} tensors) stay as they are"


def resolve_name(name: str | None) -> str:
    """The full model name of --model (n -> yolov8n); n when none is given."""
    name = name or "n"
    return ALIASES.get(name, name)


def initial_model(arch: str, nc: int, seed: int, weights: Weights | None):
    """(model, report line or None): a fresh model, seeded, with the weights
    loaded where given. Identical on every rank without any broadcast: every
    rank seeds the same and reads the same file, so class convs that the
    weights cannot give (other classes: fine-tuning) start the same everywhere."""
    torch.manual_seed(seed)
    model = build_model(arch, nc)
    return model, load_into(model, weights) if weights is not None else None


def resumed_arch(state: dict, cfg: TrainConfig, nc: int) -> str:
    """The architecture of the checkpoint `state`. One that cannot hold this
    request's model is one line, never load_state_dict's list of every tensor
    that does not fit: a checkpoint of another architecture, or one written
    before the data YAML changed its classes."""
    arch = state.get("arch", resolve_name(state["config"].get("model")))
    want = resolve_name(cfg.model) if cfg.model else arch
    bias = state["model"].get("head.cls.0.2.bias")
    held = None if bias is None else int(bias.shape[0])
    if (arch, held) != (want, nc):
        raise HpcyoloError(f"{state['path']}: holds {arch} weights for {held} classes, but this request trains "
                           f"{want} on {nc} classes ({cfg.data}): use a new run directory (--run-dir) to start a "
                           "new run")
    return arch


def choose_arch(cfg: TrainConfig, weights: Weights | None) -> str:
    """--model, or the weights' architecture; both given, they must agree."""
    if weights is None:
        return resolve_name(cfg.model)
    if cfg.model and resolve_name(cfg.model) != weights.arch:
        raise HpcyoloError(f"{weights.path}: holds {weights.arch}, but --model asks for {resolve_name(cfg.model)} "
                           "(leave --model out to train the weights' own architecture)")
    return weights.arch


def arithmetic(amp: bool, dtype: torch.dtype, memory_format: torch.memory_format = torch.contiguous_format) -> str:
    """How this process computes, as run (for comparing runs and trainers):
    `AMP bf16, channels_last, cudnn.benchmark on, deterministic off, 8 torch threads`."""
    precision = "fp32" if not amp else "AMP bf16" if dtype == torch.bfloat16 else "AMP fp16 with the gradient scaler"
    on = {True: "on", False: "off"}
    return (f"{precision}, {'channels_last' if memory_format == torch.channels_last else 'NCHW'}, "
            f"cudnn.benchmark {on[torch.backends.cudnn.benchmark]}, deterministic "
            f"{on[torch.are_deterministic_algorithms_enabled()]}, {torch.get_num_threads()} torch threads")


def mixed_precision(device: torch.device, wanted: bool):
    """(autocast on, its dtype, the gradient scaler) for training on `device`:
    bf16 on a GPU that has it, else fp16 with the scaler (fp16's range needs
    it); off on the CPU."""
    amp = wanted and device.type == "cuda"
    dtype = torch.bfloat16 if amp and torch.cuda.is_bf16_supported() else torch.float16
    return amp, dtype, torch.amp.GradScaler("cuda", enabled=amp and dtype == torch.float16)


def choose_optimizer(cfg: TrainConfig, nc: int, images: int) -> tuple[str, float, float, float]:
    """(optimizer, lr0, momentum, warmup_bias_lr): cfg's, or with optimizer
    auto, ultralytics' choice for `images` training images of `nc` classes."""
    if cfg.optimizer != "auto":
        return cfg.optimizer, cfg.learning_rate, cfg.momentum, cfg.warmup_bias_lr
    if math.ceil(images / max(cfg.batch, cfg.nbs)) * cfg.epochs > 10_000:
        return "musgd", 0.01, 0.9, 0.0
    return "adamw", round(0.002 * 5 / (4 + nc), 6), 0.9, 0.0


def build_optimization(cfg: TrainConfig, model, batches: int, images: int | None = None):
    """(optimizer, schedule, accumulate) for `batches` global batches per
    epoch (of `images` images; optimizer auto chooses by them), as
    ultralytics sets them up, from the global batch alone (never the
    per-rank one): gradients of `accumulate` batches (about nbs images) make
    one optimizer step (fewer during the warm-up: Schedule.accumulate), and
    the weight decay is scaled to the images a step sees."""
    name, lr0, momentum, warmup_bias_lr = choose_optimizer(cfg, model.nc, images or batches * cfg.batch)
    accumulate = max(round(cfg.nbs / cfg.batch), 1)
    weight_decay = cfg.weight_decay * cfg.batch * accumulate / cfg.nbs
    optimizer = build_optimizer(model, name, lr0, momentum, weight_decay)
    schedule = Schedule(lr0=lr0, lrf=cfg.lrf, momentum=momentum, cosine=cfg.cos_lr,
                        warmup_momentum=cfg.warmup_momentum, warmup_bias_lr=warmup_bias_lr, nominal=cfg.nbs / cfg.batch,
                        epochs=cfg.epochs, batches_per_epoch=batches, warmup_epochs=cfg.warmup_epochs,
                        warmup_batches=warmup_batches_for(cfg.warmup_epochs, cfg.epochs, batches))
    return optimizer, schedule, accumulate


def place_model(model, d: Dist, memory_format: torch.memory_format = torch.contiguous_format):
    """`model` on d's device, its weights in `memory_format` (layout); with
    several ranks, its BatchNorm layers normalise over the global batch, as
    one process does (syncbn.py)."""
    model = model.to(d.device, memory_format=memory_format)
    return normalise_across_ranks(model, d.device) if d.distributed else model


def layout(cfg: TrainConfig, device: torch.device) -> torch.memory_format:
    """The memory format of the model's weights and batches: channels_last
    (NHWC) on a GPU where cfg.channels_last, as ultralytics trains there (on an
    H200 it doubled the model step's images/s: benchmarks/bench_gpu.py);
    NCHW otherwise, and always on the CPU (no gain there, as in ultralytics)."""
    if cfg.channels_last and device.type == "cuda":
        return torch.channels_last
    return torch.contiguous_format


def detection_loss(model, nc: int, d: Dist, cfg: TrainConfig) -> DetectionLoss | EndToEndLoss:
    """The loss of `model`'s head with cfg's gains (both heads of an end2end
    one: their weights change over cfg.epochs), scaled for d's world size
    (DetectionLoss). Every family's anchors are assigned as ultralytics 8.4
    assigns them: aligned by CIoU, gt sides under the middle stride (16 px)
    counted as 16 px when candidates are chosen (STAL)."""
    strides, gains = tuple(model.stride.tolist()), dict(box=cfg.box, cls=cfg.cls, dfl=cfg.dfl)
    if model.end2end:
        return EndToEndLoss(nc, cfg.epochs, strides=strides, world_size=d.world_size, **gains)
    return DetectionLoss(nc, reg_max=model.reg_max, strides=strides, world_size=d.world_size, min_side=strides[1],
                         assign_ciou=True, **gains)


def data_parallel(model, d: Dist):
    """`model` under DDP where there are several ranks, else as it is."""
    if not d.distributed:
        return model
    # No buffer broadcast before each forward pass (the straggler report times
    # the forward): rank 0's buffers, the ones checkpointed and validated
    # (end_epoch broadcasts its EMA), are the same either way, as DDP
    # broadcast them from rank 0. torch 2.13 names it forward_sync_buffers.
    device_ids = [d.device.index] if d.device.type == "cuda" else None
    quiet = {"forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
             else "broadcast_buffers": False}
    with dynamo_stand_in():
        return EAGER_DDP(model, device_ids=device_ids, **quiet)


def eager_ddp() -> type:
    """DDP without torch's torch._disable_dynamo wrapper around its
    _inside_ddp_forward, which imports torch._dynamo at the first forward
    (what it adds matters only under torch.compile, which the trainer never
    uses); DDP itself where torch's method is other than that."""
    wrapped = getattr(vars(DDP).get("_inside_ddp_forward"), "__wrapped__", None)  # under @contextmanager
    inner = not_traced_inner(wrapped)
    if inner is None:
        return DDP
    return type(DDP.__name__, (DDP,), {"_inside_ddp_forward": contextmanager(inner), "__module__": DDP.__module__,
                                       "__qualname__": DDP.__qualname__, "__doc__": DDP.__doc__})


EAGER_DDP = eager_ddp()


@contextmanager
def dynamo_stand_in():
    """Around DDP's constructor: it asks torch._dynamo which reducer to use,
    and that import costs each rank about a second of CPU at every start
    (with 4 ranks on 2 CPUs, 2 s of a 8 s start), though the trainer never
    compiles. Where torch._dynamo is not imported yet, a stand-in gives
    dynamo's default answer (optimize_ddp True: "ddp_optimizer", DDP's own
    C++ reducer) and leaves afterwards; a later use imports the real one."""
    if "torch._dynamo" in sys.modules or "_dynamo" in vars(torch):
        yield
        return
    utils = type(sys)("torch._dynamo.utils (hpcyolo's stand-in)")
    utils.get_optimize_ddp_mode = lambda: "ddp_optimizer"
    stand_in = type(sys)("torch._dynamo (hpcyolo's stand-in)")
    stand_in.utils = utils
    torch._dynamo = stand_in
    try:
        yield
    finally:
        if vars(torch).get("_dynamo") is stand_in:
            del torch._dynamo


def health(cfg: TrainConfig, d: Dist, parts: Parts, run: Path, hosts: list[str]) -> None:
    """The hang watchdog, the slow-rank report and the drills, where set."""
    if cfg.hang_factor > 0:
        from ..common.rendezvous import side_store
        from .watchdog import ANSWER_SECONDS

        store = functools.partial(side_store, ANSWER_SECONDS + 5) if d.distributed else None
        parts.watch = Watchdog(d.rank, hosts, rundir.hang_folder(run, *this_start()), cfg.hang_factor,
                               cfg.hang_min, store)
    if cfg.straggler_every > 0 and d.distributed:
        job, _ = this_start()
        parts.stragglers = Stragglers(d, hosts, cfg.straggler_every, cfg.straggler_margin, record=lambda row: \
                                      rundir.append_row(run / rundir.STRAGGLERS, rundir.STRAGGLER_COLUMNS,
                                                        {**row, "job": job}))
        parts.stragglers.watch_waits(parts.model)
    parts.drills = Drills.from_env(d.rank, hosts[d.rank])


def this_start() -> tuple[str, str]:
    """(job, restart) of this start of the job, as the batch script names its
    records (hpcyolo job end reads the hang verdict and the ledger by them)."""
    return os.environ.get("SLURM_JOB_ID", "local"), os.environ.get("SLURM_RESTART_COUNT", "0")


def forward_span(parts: Parts, done: int):
    """Around a step's forward pass: its time for the straggler report, and
    the drills that act inside a step; nothing where neither is set."""
    if parts.stragglers is None and parts.drills is None:
        return nullcontext()
    return _forward_span(parts, done)


@contextmanager
def _forward_span(parts: Parts, done: int):
    with parts.stragglers.forward() if parts.stragglers is not None else nullcontext():
        if parts.drills is not None:
            parts.drills.in_step(done)
        yield


def forward_backward(net, loss_fn, imgs, targets, amp: bool, amp_dtype, scaler, reduce: bool = True,
                     span=nullcontext()) -> torch.Tensor:
    """Forward and backward of this rank's share of one global batch; the
    gradients add up until the optimizer step. `reduce=False` (a batch that
    is not the last one before the step) keeps DDP from all-reducing them
    yet. Returns the loss items (box, cls, dfl)."""
    sync = nullcontext() if reduce or not isinstance(net, DDP) else net.no_sync()
    with sync:
        with span, torch.autocast(imgs.device.type, dtype=amp_dtype, enabled=amp):
            loss, items = loss_fn(net(imgs), targets)
        scaler.scale(loss).backward()
    return items


def optimizer_step(model, optimizer, scaler, ema: ModelEMA, clip_norm: float) -> torch.Tensor | None:
    """One optimizer step on the summed gradients: unscale (a no-op without
    fp16), clip (unless clip_norm is 0), step (the scaler skips it on
    inf/nan), zero, update the EMA. Returns the gradients' norm before
    clipping (None when not clipping), a tensor: reading it waits for the device."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm) if clip_norm > 0 else None
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    ema.update(model)
    return norm


def budget_spent(cfg: TrainConfig, pos: Position, step_seconds: float, epoch_done: bool = False) -> bool:
    """Whether the time budget leaves no room to go on: for another step
    like the last (`step_seconds`) and the run's final end (1.5 times its
    longest epoch end so far). After an epoch's last step (`epoch_done`),
    going on also means that epoch's own end before the next step: room for
    one more end. (Without it, the check at an epoch's last step passed,
    the epoch's end spent the final end's room, and the run ended up to an
    end past its budget.)"""
    if cfg.time is None:
        return False
    ends = 2.5 if epoch_done else 1.5
    return pos.run_seconds + step_seconds + ends * pos.end_seconds > cfg.time * 3600


def agreed_stop(d: Dist, stop: StopFlag, step: int, time_up: bool = False) -> tuple[Decision, bool]:
    """What every rank does after optimizer step `step`: the strongest of the
    ranks' decisions (none < stop < checkpoint < checkpoint and requeue, one
    MAX all-reduce), with the reason of a rank that asked for it (a signal
    may reach the ranks one by one); and, where none asked, whether any rank
    (rank 0: its clock decides) says the time budget is spent, in the same
    all-reduce."""
    mine = stop.decide(step) if stop.requested or stop.drill else NO_STOP
    code = 0 if mine.action == NONE else 1 if mine.action == STOP else 2 + mine.requeue
    agreed, time_up = divmod(max_over_ranks(d, 2 * code + time_up), 2)
    if not agreed:
        return NO_STOP, bool(time_up)
    reason = next(r for r in gather_objects(d, mine.reason if code == agreed else "") if r)
    return Decision(STOP if agreed == 1 else CHECKPOINT, reason, requeue=agreed == 3), False


def finish(d: Dist, code: int, keep_scratch: bool) -> int:
    """Leave the process group; on an ending no requeue follows, the node's
    first rank removes the node-local scratch (staged data, image caches):
    node memory must not outlive the job."""
    leave()
    scratch = os.environ.get(SCRATCH_ENV)
    if not keep_scratch and scratch and d.local_rank == 0:
        from ..common.stagedcopy import remove

        remove(scratch)
    return code


def settle_buckets(net, model, loss_fn, imgsz: int, device, amp: bool, amp_dtype) -> None:
    """One throwaway forward and backward through DDP, so that every real step
    all-reduces with the same gradient buckets.

    Why: DDP's first backward all-reduces all gradients as one bucket in
    parameter order; the next forward rebuilds the buckets in the order the
    gradients became ready. A ring all-reduce adds a value's per-rank terms in
    an order set by the value's position in its bucket, and with more than two
    ranks float addition is not associative: the first step after a resume
    (old layout) rounded differently from the same step of an uninterrupted
    run (rebuilt layout), and the runs drifted apart. Doing the first backward
    here, in a start that resumes after the run's first optimizer step,
    leaves weights, buffers, gradients and RNG state as they were. A start
    at the run's first step (a new run, or one stopped before its first
    step) needs none: its first backward is the uninterrupted run's first,
    in the same layout.

    BatchNorm layers run in eval mode here: across ranks (SyncBatchNorm,
    CrossRankBatchNorm2d) each would add a collective to the forward and one
    to the backward, over a hundred before the first step for nothing, since
    only the order of the gradients matters here."""
    buffers = [b.detach().clone() for b in model.buffers()]
    imgs = torch.zeros(2, 3, imgsz, imgsz, device=device)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.25, 0.25], [1, 0, 0.5, 0.5, 0.25, 0.25]], device=device)
    net.train()
    for m in net.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
            loss, _ = loss_fn(net(imgs), targets)
        loss.backward()
    net.train()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)


def record_shape(d: Dist, epoch: int, batch: int, shape: torch.Size) -> None:
    """Append this batch's image size to the SHAPES_ENV folder, where set."""
    folder = os.environ.get(SHAPES_ENV)
    if folder:
        with open(Path(folder) / f"rank-{d.rank}.txt", "a") as f:
            f.write(f"{epoch} {batch} {shape[2]} {shape[3]}\n")


def stop_workers(batches) -> None:
    """End a loader iterator's workers now, wherever the run stops. They
    ignore SIGTERM (ignore_signals), so Python's exit, which terminates and
    then joins its child processes, would otherwise wait for them forever."""
    shutdown = getattr(batches, "_shutdown_workers", None)  # none without workers
    if shutdown is not None:
        shutdown()
        settle_feeders()


def settle_feeders(timeout: float = 5.0) -> None:
    """Wait for the feeder threads of the queues a loader just closed to end
    (multiprocessing's QueueFeederThread ends on its own, a moment after the
    close), so that the next loader forks its workers beside as few
    threads as possible. (A worker forked right after a loader was stopped
    once hung in PyOS_AfterFork_Child; the cause found since is gloo's
    threads and the runtime's lock: forksafe.) Called where the run's only
    loader was stopped, so no feeder of a live queue is waited for."""
    import threading

    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread":
            thread.join(timeout)


def ignore_signals(names: tuple[str, ...], worker_id: int) -> None:
    """In data-loader workers: Slurm signals the whole process group, and a
    worker killed by the warning signal would crash the loader before the
    main process can checkpoint. Only the main process acts on it. Also
    tunes the worker's malloc for image buffers (data.keep_freed_memory)."""
    for name in names:
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)
    keep_freed_memory()


def say_ranks(d: Dist) -> list[tuple]:
    """Rank 0 prints where every rank runs: a wrong layout (two ranks on one
    GPU, a host missing) shows at the start, not as a hang or a slow run.
    Returns every rank's (rank, local rank, local world, world, host,
    device, the CPUs it may run on), in rank order."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cpus = frozenset(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1))
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's name: the one to exclude
    everyone = gather_objects(d, (d.rank, d.local_rank, local_world, d.world_size, host, str(d.device), cpus))
    if d.distributed:
        for rank, local, local_world, world, host, device, _ in everyone:
            print0(d, f"rank {rank}: local rank {local} of {local_world} on host {host}, world size {world}, "
                      f"device {device}")
    return everyone


def cpu_share(everyone: list[tuple], rank: int) -> int:
    """The CPUs rank `rank` may count on: those it may run on, shared with
    the ranks on its host that may run on some of them too (srun binding
    each task to its own cores: its own; unbound tasks: the node's over them)."""
    *_, host, _, cpus = everyone[rank]
    sharing = sum(1 for *_, h, _, theirs in everyone if h == host and theirs & cpus)
    return max(1, len(cpus) // sharing)


def loader_workers(wanted: int, d: Dist, everyone: list[tuple]) -> int:
    """Loader workers per rank: `wanted`, but no more than the CPUs the
    rank may count on (ultralytics caps them at the node's CPUs over its
    GPUs): a GPU rank's cpu_share, a CPU rank's whole affinity as in
    ultralytics on the CPU. 0 stays 0 (loading in the training process)."""
    cpus = cpu_share(everyone, d.rank) if d.device.type == "cuda" else len(everyone[d.rank][-1])
    return min(wanted, cpus)


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


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


def save_state(d: Dist, cfg: TrainConfig, parts: Parts, pos: Position, preempted: str = "") -> None:
    """Everything needed to continue exactly at `pos`; rank 0 snapshots it
    and writes it in the background. When stopping for preemption the write
    is waited for, then rank 0 leaves the marker the batch script looks for."""
    ranks = gather_objects(d, (rng_state(), pos.loss_sum.cpu()))
    if d.is_main:
        state = {"model": parts.model.state_dict(), "ema": parts.ema.state_dict(),
                 "optimizer": parts.optimizer.state_dict(), "scaler": parts.scaler.state_dict(),
                 "rng": [r for r, _ in ranks], "loss_sums": [s for _, s in ranks],
                 "config": rundir.settings(cfg.to_dict()), "arch": parts.model.arch, "epoch": pos.epoch,
                 "batch": pos.batch, "global_step": pos.global_step, "best_fitness": pos.best_fitness,
                 "best_epoch": pos.best_epoch, "epoch_seconds": pos.epoch_seconds, "epochs": pos.epochs,
                 "run_seconds": pos.run_seconds, "plan_seconds": pos.plan_seconds, "end_seconds": pos.end_seconds}
        parts.writer.save(state, Path(cfg.run_dir) / rundir.CHECKPOINTS, cfg.keep, wait=bool(preempted),
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


def refuse_unlearnable(data: str, train_set: YoloDataset, nc: int) -> None:
    """Label files whose every line was dropped as malformed (class ids from
    1, or beyond `names`; coordinates in pixels) leave only background: an
    error, where ultralytics would warn and train a detector of nothing."""
    if train_set.counts["malformed label lines"] and not any(len(labels) for labels in train_set.labels):
        raise HpcyoloError(f"{data}: train: no label line is usable ({train_set.summary()}; see the warnings "
                           f"above): class ids run 0..{nc - 1} for the {nc} names, coordinates are fractions "
                           "of the image in [0, 1]")


def cache_folder(cfg: TrainConfig) -> Path:
    """Where image caches go: never beside the dataset. A RAM cache must be
    on node-local tmpfs, shared by the node's ranks (one copy per node)."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    if cfg.cache == "ram":
        run = Path(cfg.run_dir).resolve()
        key = hashlib.sha1(str(run).encode()).hexdigest()[:8]
        return Path("/dev/shm") / f"hpcyolo-{getpass.getuser()}" / f"{run.name}-{key}"
    return Path(cfg.run_dir) / "cache"


def epoch_metrics(d: Dist, model, batches: ValBatches, cfg: TrainConfig, names: list[str], run: Path,
                  plots: bool = False, drawings: Background | None = None, interrupted=None) -> dict:
    """The epoch's validation (evaluate.validate, as `hpcyolo val` measures);
    rank 0 also draws the first cfg.val_images images with their predictions,
    and with `plots` (every rank alike) its first batches as
    val_batchN_labels.jpg and val_batchN_pred.jpg, on its plot thread
    `drawings` (the metrics then hold what the other plots show)."""
    drawn = 0
    batch_plots = batch_drawer(names, run, run=drawings.submit) if plots and drawings is not None else None

    def draw(imgs, metas, preds) -> None:
        nonlocal drawn
        if drawn < cfg.val_images:
            drawn += draw_predictions(imgs, preds, names, run, drawn, cfg.val_images - drawn)
        if batch_plots is not None:
            batch_plots(imgs, metas, preds)

    metrics = validate(d, model, batches, workers=cfg.workers, on_batch=draw if d.is_main else None,
                       worker_init=functools.partial(ignore_signals, (cfg.signal, "TERM")), end2end=cfg.end2end,
                       plots=plots, interrupted=interrupted)
    return metrics or dict(NOT_VALIDATED)


# The figures of an epoch with no validation (val off, or no validation images), as ultralytics writes them.
NOT_VALIDATED = {"precision": 0.0, "recall": 0.0, "map50": 0.0, "map50_95": 0.0}


def draw_train_batch(imgs: np.ndarray, targets: np.ndarray, names: list[str], path: Path) -> None:
    """A training batch as the loader made it (uint8 [B, 3, H, W]; targets
    [M, 6]: index in batch, class, normalised cx, cy, w, h), with its boxes."""
    from ..report.plots import batch_grid

    h, w = imgs.shape[2:]
    drawn = []
    for k in range(len(imgs)):
        rows = targets[targets[:, 0] == k]
        cx, cy, bw, bh = rows[:, 2] * w, rows[:, 3] * h, rows[:, 4] * w, rows[:, 5] * h
        drawn.append((np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1), rows[:, 1].astype(int), None))
    batch_grid(imgs, drawn, names, path)


def draw_predictions(imgs, preds, names, run: Path, offset: int, limit: int) -> int:
    from ..report.plots import draw_detections, save_image

    count = min(limit, len(preds))
    for j in range(count):
        det = preds[j][preds[j][:, 4] > 0.25].cpu().numpy()
        img = imgs[j].permute(1, 2, 0).numpy()
        save_image(draw_detections(img, det[:, :4], det[:, 5].astype(int), det[:, 4], names),
                   run / f"val_pred_{offset + j}.jpg")
    return count


def write_results(run: Path, epoch: int, loss: torch.Tensor, losses: tuple[str, ...], metrics: dict, lr: float,
                  seconds: float, speed: tuple[float, float, float | None]) -> dict[str, str]:
    """The epoch's row of results.csv (rundir.results_columns; `losses`:
    the loss items' names); returns it, by column."""
    rate, wait, memory = speed
    columns = rundir.results_columns(losses)
    values = (epoch + 1, f"{loss[0]:.5f}", f"{loss[1]:.5f}", f"{loss[2]:.5f}", f"{metrics['precision']:.5f}",
              f"{metrics['recall']:.5f}", f"{metrics['map50']:.5f}", f"{metrics['map50_95']:.5f}", f"{lr:.6g}",
              f"{seconds:.1f}", f"{rate:.1f}", f"{wait:.3f}", "n/a" if memory is None else f"{memory:.3f}")
    row = dict(zip(columns, values, strict=True))
    rundir.write_result(run, tuple(row.values()), columns)
    return row


def numbers(row: dict[str, str]) -> dict[str, float]:
    """A results.csv row's numeric cells but the epoch, as floats."""
    out = {}
    for column, text in row.items():
        try:
            out[column] = float(text)
        except ValueError:
            pass  # n/a
    del out["epoch"]
    return out


def save_weights(path: Path, model, cfg: TrainConfig, names: list[str]) -> None:
    """Inference weights: the EMA model and what is needed to rebuild it."""
    ckpt.save({"model": model.state_dict(), "scale": model.arch, "names": list(names), "imgsz": cfg.imgsz}, path)


def cli_main(cfg: TrainConfig) -> None:
    sys.exit(main(cfg))
