"""The per-step agreement between ranks (max_over_ranks): real gloo process
groups, over the default group and over a separate control group as the
trainer makes beside NCCL (dist.setup)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hpcyolo.node.local import free_port
from hpcyolo_trainer.parallel.dist import Dist, max_over_ranks


def _worker(rank: int, world: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=20))
    plain = Dist(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"))
    with_control = Dist(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"), control=control)
    out[rank] = [max_over_ranks(with_control, 5 * rank), max_over_ranks(plain, 7 - rank),
                 max_over_ranks(with_control, 0)]
    dist.destroy_process_group()


def test_ranks_agree_on_the_largest_value_over_either_group():
    world = 3
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(world, free_port(), out), nprocs=world, join=True)
    assert [out[r] for r in range(world)] == [[10, 7, 0]] * world
