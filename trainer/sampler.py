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
