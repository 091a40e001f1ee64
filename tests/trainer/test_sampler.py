"""Every rank takes the same number of steps, whatever the dataset size:
real gloo process groups, an all-reduce per step as DDP does, no hang."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from hpcyolo.node.local import free_port
from hpcyolo_trainer.data.sampler import EvenShardSampler, RectBatchSampler, steps_per_epoch

SIZES = (1, 2, 5, 7, 10, 13)
BATCH_PER_RANK = 3


def _worker(rank: int, world: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    counts = {}
    for n in SIZES:
        sampler = EvenShardSampler(n, rank, world, seed=1)
        seen = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            steps = 0
            for batch in DataLoader(list(range(n)), batch_size=BATCH_PER_RANK, sampler=sampler):
                dist.all_reduce(torch.ones(1))  # what DDP does every step: hangs if a rank stops early
                seen.extend(batch.tolist())
                steps += 1
        counts[n] = (steps, sorted(set(seen)))
    out[rank] = counts
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_equal_steps_no_hang(world):
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(world, free_port(), out), nprocs=world, join=True)  # raises if a rank failed/hung
    for n in SIZES:
        steps = {out[r][n][0] for r in range(world)}
        assert steps == {steps_per_epoch(n, world, BATCH_PER_RANK)}
        covered = set().union(*(out[r][n][1] for r in range(world)))
        assert covered == set(range(n))  # every sample is used


def test_order_is_reproducible_and_resumable():
    a = EvenShardSampler(10, 1, 2, seed=3)
    a.set_epoch(4)
    full = list(a)
    b = EvenShardSampler(10, 1, 2, seed=3)
    b.set_epoch(4, start=2)
    assert list(b) == full[2:] and len(b) == len(full) - 2
    a.set_epoch(5)
    assert list(a) != full


@pytest.mark.parametrize("world", [3, 4])
def test_rect_batches_split_whole_global_batches_across_ranks(world):
    """Every rank gets one slice of the same global batch at every step (so one
    canvas shape), the short last batch filled from its own images, the order
    a function of (seed, epoch) alone."""
    batch_per_rank, n = 2, 23  # 23: no world size divides it
    batches = [list(range(k, min(k + world * batch_per_rank, n))) for k in range(0, n, world * batch_per_rank)]
    samplers = [RectBatchSampler(batches, batch_per_rank, r, world, seed=7) for r in range(world)]
    for s in samplers:
        s.set_epoch(2)
    orders = [s.order() for s in samplers]
    assert {len(o) for o in orders} == {steps_per_epoch(n, world, batch_per_rank)} == {len(batches)}
    for step in zip(*orders):
        union = set().union(*step)
        assert all(len(part) == batch_per_rank for part in step)
        assert any(union <= set(b) for b in batches)  # one global batch per step
    assert {i for o in orders for part in o for i in part} == set(range(n))  # every image, some twice
    again = RectBatchSampler(batches, batch_per_rank, 1, world, seed=7)
    again.set_epoch(2, start=2 * batch_per_rank)  # resumed after two steps
    assert list(again) == orders[1][2:]
    again.set_epoch(3)
    assert again.order() != orders[1]
