"""BatchNorm over the whole global batch, on any device: the ranks' batches
are normalised together, as one process normalises its batch.

On GPUs that is torch's SyncBatchNorm. torch's DDP refuses it for CPU
modules ("SyncBatchNorm layers only work with GPU modules"), and with each
rank normalising its own share, a CPU run of N processes trains another
model than one process on the same global batch: per step the gradient
differed by more than itself (tests/trainer/test_world_size.py), and at 2
and 4 processes the shapes set ended far below one process's mAP
(benchmarks/bench_world_size.py). CrossRankBatchNorm2d is the same maths
for CPU process groups (gloo), with the same collectives per layer: one
all-gather of each rank's count, mean and squared deviations in the forward
pass (combined without losing precision to E[x^2] - E[x]^2), and one of
the two gradient sums in the backward pass (_Normalise). Every rank must
run every forward and backward in training mode in step, as DDP already
requires; in eval mode it is plain BatchNorm (the running statistics).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn


class CrossRankBatchNorm2d(nn.BatchNorm2d):
    """nn.BatchNorm2d whose training-mode statistics span every rank of the
    default process group (the same parameters and buffers, so checkpoints
    and weights are those of nn.BatchNorm2d)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        xhat, mean, var, count = _Normalise.apply(x, self.eps)
        if self.track_running_stats:
            self._update_running(mean, var * count / max(count - 1, 1))
        if not self.affine:
            return xhat
        return xhat * self.weight[None, :, None, None] + self.bias[None, :, None, None]

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        """As nn.BatchNorm2d in training mode: an exponential average with
        `momentum`, or the cumulative one when momentum is None."""
        self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased_var.to(self.running_var.dtype), factor)


_DIMS = (0, 2, 3)  # what a channel's statistics span in an NCHW batch


def _channel(v: torch.Tensor) -> torch.Tensor:
    return v[None, :, None, None]


class _Normalise(torch.autograd.Function):
    """x normalised with the mean and biased variance of every rank's batch
    together: one all-gather forward, one backward (torch's SyncBatchNorm
    all-reduces there; gloo's all-gather of a [2, 256] float32 tensor took
    3.7 ms against its all-reduce's 5.3 ms at 4 processes on 2 cores, 0.5
    against 1.1 ms at 2, 200 of each; every rank adds the same rows in the
    same order). Each rank sends its element count, mean and sum of squared
    deviations from its own mean per channel, in float64, and every
    rank combines them the same way (Chan et al.'s parallel variance): no
    E[x^2] - E[x]^2 cancellation. The backward pass needs the global sums
    of the gradient and of gradient x normalised input, per channel.

    Returns (x normalised, mean, biased variance, element count per channel);
    only the first carries a gradient. `seconds` adds up the forward
    all-gathers' time (a rank's wait for the others: the straggler report
    subtracts it from the forward pass)."""

    seconds = 0.0

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float):
        channels, n = x.shape[1], x.numel() // x.shape[1]
        local_mean = x.sum(_DIMS) / max(n, 1)  # a rank without images adds nothing (its count is 0)
        local_m2 = (x - _channel(local_mean)).square().sum(_DIMS)
        mine = torch.cat([torch.tensor([n], dtype=torch.float64, device=x.device),
                          local_mean.double(), local_m2.double()])
        start = time.perf_counter()
        table = _gathered(mine)  # [ranks, 1 + 2C]
        _Normalise.seconds += time.perf_counter() - start
        counts, means, m2s = table[:, :1], table[:, 1:1 + channels], table[:, 1 + channels:]
        count = float(counts.sum())
        mean = (counts * means).sum(0) / count
        var = (m2s.sum(0) + (counts * (means - mean).square()).sum(0)) / count
        invstd = torch.rsqrt(var + eps).to(x.dtype)
        xhat = (x - _channel(mean.to(x.dtype))) * _channel(invstd)
        ctx.save_for_backward(xhat, invstd)
        ctx.count = count
        ctx.mark_non_differentiable(mean, var)
        return xhat, mean, var, count

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *_):
        xhat, invstd = ctx.saved_tensors
        sums = _gathered(torch.stack([grad.sum(_DIMS), (grad * xhat).sum(_DIMS)])).sum(0) / ctx.count
        return (grad - _channel(sums[0]) - xhat * _channel(sums[1])) * _channel(invstd), None


def _gathered(mine: torch.Tensor) -> torch.Tensor:
    """Every rank's `mine`, stacked in rank order: [ranks, *mine.shape]."""
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return torch.stack(everyone)


def forward_wait() -> float:
    """Seconds this process spent so far in the forward passes' all-gathers."""
    return _Normalise.seconds


def normalise_across_ranks(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` with every BatchNorm2d normalising over all ranks: torch's
    SyncBatchNorm on a GPU, CrossRankBatchNorm2d elsewhere. Call it where
    there are several ranks, before DDP wraps the model."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return _swap(model)


def _swap(module: nn.Module) -> nn.Module:
    if type(module) is nn.BatchNorm2d:
        swapped = CrossRankBatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                                       module.track_running_stats, device=_device_of(module))
        swapped.load_state_dict(module.state_dict())
        swapped.train(module.training)
        return swapped
    for name, child in module.named_children():
        module.add_module(name, _swap(child))
    return module


def _device_of(module: nn.Module) -> torch.device | None:
    tensor = next(iter(module.state_dict().values()), None)
    return None if tensor is None else tensor.device

