"""BatchNorm over the whole global batch, on any device: the ranks' batches
are normalised together, as one process normalises its batch.

On GPUs that is torch's SyncBatchNorm. torch's DDP refuses it for CPU
modules ("SyncBatchNorm layers only work with GPU modules"), and with each
rank normalising its own share, a CPU run of N processes trains another
model than one process on the same global batch: per step the gradient
differed by more than itself (tests/trainer/test_world_size.py), and at 2
and 4 processes the shapes set ended far below one process's mAP
(benchmarks/bench_world_size.py). CrossRankBatchNorm2d is the same maths
for CPU process groups (gloo): the batch mean and variance come from the
ranks' sums through differentiable all-reduces (two passes: the mean, then
the squared deviations from it, so no precision is lost to E[x^2] - E[x]^2),
and the backward pass all-reduces their gradients in turn. Every rank must
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
        dims = (0, 2, 3)
        local = torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype, device=x.device)
        total = all_reduce(torch.cat([x.sum(dims), local]))
        count = total[-1].detach()
        mean = total[:-1] / count
        centred = x - mean[None, :, None, None]
        var = all_reduce(centred.square().sum(dims)) / count  # biased, as BatchNorm normalises
        if self.track_running_stats:
            self._update_running(mean.detach(), var.detach() * count / max(count.item() - 1, 1))
        scale = torch.rsqrt(var + self.eps)
        y = centred * scale[None, :, None, None]
        if self.affine:
            y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        return y

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        """As nn.BatchNorm2d in training mode: an exponential average with
        `momentum`, or the cumulative one when momentum is None."""
        self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.lerp_(mean, factor)
        self.running_var.lerp_(unbiased_var, factor)


class _SumOverRanks(torch.autograd.Function):
    """The sum of a tensor over all ranks, differentiable: each rank's input
    reaches every rank's output, so its gradient is the sum of theirs.
    `forward_seconds` adds up the forward all-reduces' time (a rank's wait
    for the others: the straggler report subtracts it from the forward pass)."""

    forward_seconds = 0.0

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        start = time.perf_counter()
        dist.all_reduce(out)
        _SumOverRanks.forward_seconds += time.perf_counter() - start
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        dist.all_reduce(out)
        return out


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    return _SumOverRanks.apply(x)


def forward_wait() -> float:
    """Seconds this process spent so far in the forward passes' all-reduces."""
    return _SumOverRanks.forward_seconds


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

