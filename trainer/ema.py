"""Exponential moving average of the model's weights (Polyak averaging with
a warm-up of the decay, as YOLO detectors use it)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0):
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates

    def _decay(self) -> float:
        # Small at first, so early weights do not dominate the average.
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """ema = d * ema + (1 - d) * weights over all floating tensors at once
        (torch's multi-tensor ops: a few kernel launches on a GPU instead of
        two per tensor, ~700 for a detector; the same arithmetic, so the same
        bits); integer buffers (BatchNorm's num_batches_tracked) are copied."""
        self.updates += 1
        d = self._decay()
        source = model.state_dict()
        mine, theirs, counters = [], [], []
        for name, value in self.module.state_dict().items():
            if value.dtype.is_floating_point:
                mine.append(value)
                theirs.append(source[name].detach())
            else:
                counters.append((value, source[name]))
        if mine:
            torch._foreach_mul_(mine, d)
            torch._foreach_add_(mine, theirs, alpha=1 - d)
        for value, new in counters:
            value.copy_(new)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = state["updates"]
