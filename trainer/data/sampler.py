"""Samplers that keep ranks in step.

Training: every rank gets exactly ceil(n / world) indices per epoch (the
shuffled order is padded by wrapping around), so every rank runs the same
number of steps whatever the dataset size: a rank that runs out first would
leave the others waiting in a collective until the timeout.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler

# Mosaic partners come from a pool of images loaded around the same time, as
# ultralytics draws them from each loader worker's buffer of recently loaded
# images, so that a mosaic decodes about one image, not four. Here the pool
# is a pure function of the run's batch order, never of a worker's history:
# batch n (counted over the run: epoch x batches per epoch + batch) draws
# from the images of POOL_IMAGES // batch batches of its stream, n mod
# STREAM, centred on n (at the run's start, the first ones). A DataLoader
# hands batches to its workers in turn, so with a worker count that divides
# STREAM one worker serves a stream and holds the pool's images while they
# are in use (YoloDataset's recent images): it decodes each image about
# once. With another count the items are the same, only more is decoded.
# Ultralytics' buffer holds 8 x batch images, 1000 at most; this pool holds
# 1000 whatever the batch: with ultralytics' 8 x batch (16 images per rank,
# 128 in the pool) the shapes set's detector learnt markedly less than with
# partners from the whole dataset (benchmarks/bench_mosaic_partners.py).
STREAM = 8
POOL_IMAGES = 1000


class EvenShardSampler(Sampler[int]):
    def __init__(self, n: int, rank: int, world: int, seed: int, shuffle: bool = True):
        if n <= 0:
            raise ValueError("cannot sample from an empty dataset")
        self.n, self.rank, self.world, self.seed, self.shuffle = n, rank, world, seed, shuffle
        self.per_rank = math.ceil(n / world)
        self.epoch = 0
        self.start = 0  # samples of this epoch already consumed (resume mid-epoch)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def order(self) -> list[int]:
        """This rank's whole order for the epoch, the same on every run."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
            perm = torch.randperm(self.n, generator=g).tolist()
        else:
            perm = list(range(self.n))
        total = self.per_rank * self.world
        padded = (perm * math.ceil(total / self.n))[:total]
        return padded[self.rank::self.world]

    def __iter__(self):
        return iter(self.order()[self.start:])

    def __len__(self) -> int:
        return self.per_rank - self.start


def steps_per_epoch(n: int, world: int, batch_per_rank: int) -> int:
    """Batches each rank runs in one epoch (the last may be short)."""
    return math.ceil(math.ceil(n / world) / batch_per_rank)


class RectBatchSampler(Sampler[list[int]]):
    """Rectangular training batches that keep ranks in step.

    `batches` are the global batches (dataset.batches: images of like aspect
    ratio, one canvas shape each). Each epoch shuffles them as wholes with
    (seed, epoch) alone, fills the short last one up to the global batch by
    repeating its own images, and gives rank r the r-th slice of each. So
    every rank runs ceil(n / global batch) steps, the same count as
    steps_per_epoch, and at every step all ranks' batches share one shape,
    a pure function of (seed, epoch, step): ranks never disagree on a shape
    or run out of batches at different times, and a resume sees the same.
    """

    def __init__(self, batches: list[list[int]], batch_per_rank: int, rank: int, world: int, seed: int):
        if not batches:
            raise ValueError("cannot sample from an empty dataset")
        self.batches, self.per_rank, self.rank, self.world, self.seed = batches, batch_per_rank, rank, world, seed
        self.epoch = 0
        self.start = 0  # batches of this epoch already run (resume mid-epoch)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """As EvenShardSampler's: `start` counts this rank's samples already consumed."""
        self.epoch, self.start = epoch, start // self.per_rank

    def order(self) -> list[list[int]]:
        """This rank's batches for the epoch, the same on every run."""
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        total = self.per_rank * self.world
        mine = []
        for k in torch.randperm(len(self.batches), generator=g).tolist():
            indices = self.batches[k]
            full = (indices * math.ceil(total / len(indices)))[:total]
            mine.append(full[self.rank * self.per_rank:(self.rank + 1) * self.per_rank])
        return mine

    def __iter__(self):
        return iter(self.order()[self.start:])

    def __len__(self) -> int:
        return len(self.batches) - self.start


class EpochBatch(list):
    """One batch's dataset indices, with the epoch and the mosaic setting
    they are drawn for. YoloDataset.__getitems__ reads both from the batch,
    not from its own copy: a loader worker's copy of the dataset is the one
    it got when it started, epochs ago."""

    def __init__(self, indices, epoch: int, mosaic: bool, pool: list[int] | None = None):
        super().__init__(indices)
        self.epoch, self.mosaic, self.pool = epoch, mosaic, pool


class RunBatches(Sampler[EpochBatch]):
    """A batch sampler for a whole training run: every batch of epochs
    `first`..`epochs - 1` in order, starting `start` samples into the first
    (a resumed run), each an EpochBatch with mosaic on before `mosaic_until`.

    One DataLoader iterator then serves the whole run: its workers start once
    and, while the last batches of an epoch train and validation runs, are
    already preparing the next epoch's first batches, where a loader made per
    epoch would start its workers and wait for its first batch every epoch.
    `epoch_sampler` is an EvenShardSampler (batched here by `batch`) or a
    RectBatchSampler (already batched); either gives each epoch's order.

    `epochs` None: no end (a `time` budget's run, whose plan moves; the
    training loop stops taking batches), and replan() moves mosaic_until.

    A mosaic batch carries its pool of mosaic partners (see STREAM), taken
    from the epochs' whole orders: the same at a resume as in the run it
    resumes. Rectangular batches have no mosaics and no pool."""

    def __init__(self, epoch_sampler, batch: int, first: int, start: int, epochs: int | None, mosaic_until: int):
        self.sampler, self.batch, self.first, self.start = epoch_sampler, batch, first, start
        self.epochs, self.mosaic_until = epochs, mosaic_until
        self.drawn = first - 1  # the epoch of the latest batch handed out (workers prepare batches ahead)
        self._orders: dict[int, list[list[int]]] = {}  # whole epochs' batches, for the pools

    def replan(self, next_epoch: int, mosaic_until: int) -> bool:
        """Move mosaic_until for the batches not drawn yet; False where a
        batch already drawn, of `next_epoch` or later, would then differ
        from one drawn afresh (a new loader must draw them, as a resumed
        run's would)."""
        for epoch in range(next_epoch, self.drawn + 1):
            if (epoch < self.mosaic_until) != (epoch < mosaic_until):
                return False
        self.mosaic_until = mosaic_until
        return True

    def epoch_batches(self, epoch: int, start: int | None = None) -> list[list[int]]:
        """This rank's batches of `epoch`, from `start` samples in (default:
        the run's `start` in its first epoch, else 0)."""
        self.sampler.set_epoch(epoch, start if start is not None else self.start if epoch == self.first else 0)
        if isinstance(self.sampler, RectBatchSampler):
            return list(self.sampler)
        order = list(self.sampler)
        return [order[k:k + self.batch] for k in range(0, len(order), self.batch)]

    def whole_epoch(self, epoch: int) -> list[list[int]]:
        """This rank's batches of all of `epoch` (kept while the pools reach into it)."""
        if epoch not in self._orders:
            self._orders[epoch] = self.epoch_batches(epoch, start=0)
        return self._orders[epoch]

    def pool(self, epoch: int, k: int) -> list[int]:
        """The mosaic partners' pool of batch k of `epoch` (see STREAM)."""
        per_epoch = len(self.whole_epoch(epoch))
        n = epoch * per_epoch + k
        depth = max(1, POOL_IMAGES // max(1, self.batch))
        first = max(n - depth // 2 * STREAM, n % STREAM)
        out: list[int] = []
        for m in range(first, first + depth * STREAM, STREAM):
            out += self.whole_epoch(m // per_epoch)[m % per_epoch]
        for old in [e for e in self._orders if e < first // per_epoch]:
            del self._orders[old]  # batches come in order: no later pool reaches back this far
        return out

    def __iter__(self):
        epoch = self.first
        rect = isinstance(self.sampler, RectBatchSampler)
        while self.epochs is None or epoch < self.epochs:
            skipped = self.start // self.batch if epoch == self.first and not rect else 0
            for k, indices in enumerate(self.epoch_batches(epoch), start=skipped):
                self.drawn = epoch
                mosaic = epoch < self.mosaic_until
                yield EpochBatch(indices, epoch, mosaic, self.pool(epoch, k) if mosaic and not rect else None)
            epoch += 1

    def __len__(self) -> int:
        if self.epochs is None:
            raise TypeError("a run without a fixed number of epochs (time) has no length")
        return sum(len(self.epoch_batches(e)) for e in range(self.first, self.epochs))
