"""Optimizer and learning-rate schedule.

The schedule is a pure function of the optimizer step, so resuming needs only
the step count (no scheduler object to save).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True, kw_only=True)
class Schedule:
    lr0: float
    lrf: float  # final LR = lr0 * lrf
    momentum: float
    total_steps: int
    warmup_steps: int
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    cosine: bool = False

    def factor(self, step: int) -> float:
        """The LR multiplier after warm-up: linear or cosine from 1 to lrf."""
        t = min(step / max(1, self.total_steps), 1.0)
        if self.cosine:
            return self.lrf + (1 - self.lrf) * 0.5 * (1 + math.cos(math.pi * t))
        return (1 - t) * (1 - self.lrf) + self.lrf

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Set LR (and SGD momentum) of every group for optimizer step `step`.
        During warm-up biases start high and come down, the rest start at 0."""
        target = self.lr0 * self.factor(step)
        for group in optimizer.param_groups:
            lr = target
            if step < self.warmup_steps:
                w = step / self.warmup_steps
                start = self.warmup_bias_lr if group["name"] == "bias" else 0.0
                lr = start + (target - start) * w
                if "momentum" in group:
                    group["momentum"] = self.warmup_momentum + (self.momentum - self.warmup_momentum) * w
            elif "momentum" in group:
                group["momentum"] = self.momentum
            group["lr"] = lr


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float):
    """Three groups: weights with decay, norm weights and biases without."""
    decay, no_decay, bias = [], [], []
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if pname == "bias":
                bias.append(p)
            elif isinstance(module, nn.modules.batchnorm._BatchNorm):
                no_decay.append(p)
            else:
                decay.append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "norm"},
        {"params": bias, "weight_decay": 0.0, "name": "bias"},
    ]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    raise ValueError(f"unknown optimizer {name!r}")
