"""The run's data: the data YAML, the dataset's index (rank 0 brings it up
to date, every rank reads it), the task's training set and validation
batches, this rank's sampler, and the one loader of the run with its
workers' signals and their end."""

from __future__ import annotations

import functools
import getpass
import hashlib
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..common import rundir
from ..common.datayaml import DataSpec, check_labels, check_task_layout, training_files
from ..common.errors import HpcyoloError
from ..common.settings import TrainConfig
from ..data import index as dataindex
from ..data.dataset import collate, keep_freed_memory, load_data_spec
from ..data.sampler import EvenShardSampler, RectBatchSampler, RunBatches, steps_per_epoch
from ..parallel.dist import Dist, print0, warn0
from ..parallel.workers import in_worker, loader_context
from ..tasks.task import Task
from ..tasks.task import load as load_task
from .state import Position


@dataclass
class Data:
    """The data of a run, as this rank sees it."""
    spec: DataSpec
    names: list[str]  # the classes trained: the data YAML's, or single_cls' one
    train_set: Any  # the task's training set (tasks/: for detect, data/dataset.py's YoloDataset)
    val_batches: Any  # the task's validation batches (for detect, eval/evaluate.py's ValBatches)
    sampler: EvenShardSampler | RectBatchSampler  # this rank's share of each epoch
    batches: int  # global batches per epoch
    batch_per_rank: int

    @property
    def nc(self) -> int:
        return len(self.names)


def load_data(cfg: TrainConfig, d: Dist, spec: DataSpec | None = None, stats: dict | None = None,
              task: Task | None = None) -> Data:
    """The data YAML (`spec`, where read already), the task's training set
    (this rank's sampler) and validation batches (cfg.task's where `task` is
    not given); warnings once, on rank 0, and an error for data that cannot
    be trained on. `stats`: rank 0's stats of the training (at cfg.fraction)
    and validation images, by split, where taken already (filescan.Prescan)."""
    task = task or load_task(cfg.task)
    spec = spec or load_data_spec(cfg.data, listed=d.is_main)
    check_task_layout(spec, task.name)
    nc = len(spec.names)
    batch_per_rank = cfg.batch // d.world_size
    # On a GPU the HSV jitter runs there, on the whole batch (photometric.py).
    train_files = training_files(spec.train, cfg.fraction, spec.folders) if d.is_main else None  # others: the index
    with indexed(d, spec, nc, Path(cfg.run_dir), {"train": train_files, "val": spec.val}, stats) as checked:
        if d.is_main:  # refused there, the other ranks stop with its words (see indexed)
            # Label files counted from the index's stats where it holds the whole split, not listed again.
            known = {split: checked[split].labelled() for split, files in (("train", train_files), ("val", spec.val))
                     if files is getattr(spec, split) and hasattr(checked[split], "labelled")}
            for warning in check_labels(spec, ("train", "val"), known):
                warn0(d, warning)
        train_set = task.train_set(cfg, train_files, nc, cache_dir=cache_folder(cfg) / "train",
                                   hsv_on_device=d.device.type == "cuda", checked=checked["train"],
                                   names=list(spec.names))
        # Validated as ultralytics' trainer does: rectangular batches of twice the training batch per rank.
        val_batches = task.val_batches(spec.val, nc, cfg.imgsz, 2 * batch_per_rank,
                                       cache_dir=cache_folder(cfg) / "val" if cfg.cache != "none" else None,
                                       checked=checked["val"], names=list(spec.names))
        for problem in train_set.problems + val_batches.problems:
            warn0(d, problem)
        refuse_unlearnable(cfg.data, train_set, nc)
        names = select_classes(cfg, list(spec.names), train_set, val_batches)
    sampler = RectBatchSampler([idx for idx, _ in train_set.batches], batch_per_rank, d.rank, d.world_size, cfg.seed) \
        if cfg.rect else EvenShardSampler(len(train_set), d.rank, d.world_size, cfg.seed)
    batches = steps_per_epoch(len(train_set), d.world_size, batch_per_rank)
    assert not cfg.rect or len(train_set.batches) == batches, "rect batches and steps per epoch disagree"
    return Data(spec, names, train_set, val_batches, sampler, batches, batch_per_rank)


def select_classes(cfg: TrainConfig, names: list[str], train_set, val_batches) -> list[str]:
    """The classes trained (`names`, the data YAML's): cfg.classes keeps
    some, cfg.single_cls makes them one, "item", in training and validation
    alike, as ultralytics does."""
    nc = len(names)
    if cfg.classes is not None:  # other classes' labels dropped
        missing = sorted(set(cfg.classes) - set(range(nc)))
        if missing:
            raise HpcyoloError(f"classes (train.classes, --classes): {missing} not among the {nc} classes of "
                               f"{cfg.data} (ids 0..{nc - 1})")
        train_set.keep_classes(cfg.classes)
        val_batches.labels = [lb[np.isin(lb[:, 0], cfg.classes)] for lb in val_batches.labels]
    if cfg.single_cls:
        names = ["item"]
        for split in (train_set, val_batches):
            split.labels = [np.concatenate([np.zeros_like(lb[:, :1]), lb[:, 1:]], axis=1) for lb in split.labels]
        val_batches.nc = 1
    return names


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
    with (_index_on_rank_0(d, spec, nc, run, splits, stats) if d.is_main else _index_of_rank_0(d, spec, run)) \
            as checked:
        yield checked


@contextmanager
def _index_of_rank_0(d: Dist, spec: DataSpec, run: Path):
    """`indexed` on a rank but 0: the index rank 0 wrote (or found current), then its verdict."""
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


@contextmanager
def _index_on_rank_0(d: Dist, spec: DataSpec, nc: int, run: Path, splits: dict[str, list[Path]],
                     stats: dict | None):
    """`indexed` on rank 0: each split's index brought up to date, written
    once the block accepted the data, the other ranks told (its error too)."""
    built, versions = {}, {}
    try:
        for split, files in splits.items():
            t0 = time.monotonic()
            # The user's cache's index of this split (named only where the run's own is not current): a new
            # run starts from it, and keeps it up to date where it reads the whole split (not a --fraction).
            shared = functools.partial(dataindex.shared_file, spec.root, split, spec.yaml)
            built[split] = dataindex.refresh(files, nc, spec.root, rundir.index_file(run, split),
                                             (stats or {}).get(split), shared, keep=files is getattr(spec, split),
                                             kpt_shape=spec.kpt_shape)
            if built[split][2]:
                print0(d, f"{split}: checked {built[split][2]} of {len(files)} images in "
                          f"{time.monotonic() - t0:.1f} s for the dataset index ({rundir.index_file(run, split)})")
        if d.distributed and all(index is None for _, index, _, _ in built.values()):
            torch.distributed.broadcast_object_list([({split: b[3] for split, b in built.items()}, None, True)], 0)
        yield {split: results for split, (results, *_) in built.items()}
        for split, (_, index, _, version) in built.items():
            _write_index(d, run, split, index)
            versions[split] = version
    except Exception as e:
        if d.distributed:  # the others wait for the index, or for the verdict: they stop too, with the same words
            why = str(e) if isinstance(e, HpcyoloError) else f"rank 0 failed to load the data ({type(e).__name__}: {e})"
            torch.distributed.broadcast_object_list([({}, why, False)], 0)
        raise
    if d.distributed:  # the index to read, or (told already) that the data is accepted
        torch.distributed.broadcast_object_list([(versions, None, False)], 0)


def _write_index(d: Dist, run: Path, split: str, index) -> None:
    """A split's index into the run directory, where it changed (None: current)."""
    if index is None:
        return
    try:
        dataindex.write(rundir.index_file(run, split), index)
    except OSError as e:
        raise HpcyoloError(f"cannot write the dataset index {rundir.index_file(run, split)}: "
                           f"{e.strerror or e}") from None
    if index.origin is not None:
        print0(d, f"{split}: the dataset index from {index.origin} (a run or val before this one "
                  "indexed these files; none changed since)")


def _word_of_rank_0() -> tuple[dict[str, str], str | None, bool]:
    """What rank 0 broadcasts in `indexed`: (each split's index version, its
    error or None, whether it told before accepting the data)."""
    shared = [None]
    torch.distributed.broadcast_object_list(shared, 0)
    return shared[0]


def refuse_unlearnable(data: str, train_set, nc: int) -> None:
    """Label files whose every line was dropped as malformed (class ids from
    1, or beyond `names`; coordinates in pixels) leave only background: an
    error, where ultralytics would warn and train a detector of nothing."""
    if train_set.counts.get("malformed label lines") and not any(len(labels) for labels in train_set.labels):
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


def train_loader(cfg: TrainConfig, d: Dist, data: Data, pos: Position) -> DataLoader:
    """One loader for the whole run, from `pos` on (sampler.RunBatches): its
    workers start once, forked by the workers' server (parallel/workers.py:
    never by this process, whose other threads' locks a child would
    inherit), and prepare each epoch's first batches while the last one
    ends. (Only
    a `time` plan that moves close_mosaic across batches already prepared
    makes a new one.)"""
    run_batches = RunBatches(data.sampler, data.batch_per_rank, pos.epoch, pos.batch * data.batch_per_rank,
                             None if cfg.time is not None else pos.epochs, mosaic_until=pos.epochs - cfg.close_mosaic)
    return DataLoader(data.train_set, batch_sampler=run_batches, num_workers=cfg.workers, collate_fn=collate,
                      pin_memory=d.device.type == "cuda",
                      multiprocessing_context=loader_context(cfg.workers),
                      worker_init_fn=functools.partial(ignore_signals, (cfg.signal, "TERM")))


def stop_workers(batches) -> None:
    """End a loader iterator's workers now, wherever the run stops. They
    ignore SIGTERM (ignore_signals), so Python's exit, which terminates and
    then joins its child processes, would otherwise wait for them forever."""
    shutdown = getattr(batches, "_shutdown_workers", None)  # none without workers
    if shutdown is not None:
        shutdown()


def ignore_signals(names: tuple[str, ...], worker_id: int) -> None:
    """In data-loader workers: Slurm signals the whole process group, and a
    worker killed by the warning signal would crash the loader before the
    main process can checkpoint. Only the main process acts on it. Also
    tunes the worker's malloc for image buffers (data.keep_freed_memory),
    and ties the worker's life to its rank's (parallel/workers.in_worker)."""
    in_worker()
    for name in names:
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)
    keep_freed_memory()
