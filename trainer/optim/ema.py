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
        self._paired: tuple | None = None  # (model, its tensors paired with ours): _pairs

    def _decay(self) -> float:
        # Small at first, so early weights do not dominate the average.
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """ema = d * ema + (1 - d) * weights over all floating tensors at once
        (torch's multi-tensor ops: a few kernel launches on a GPU instead of
        two per tensor, ~700 for a detector; the same arithmetic, so the same
        bits); integer buffers (BatchNorm's num_batches_tracked) are copied,
        also at once."""
        self.updates += 1
        d = self._decay()
        mine, theirs, counters, sources = self._pairs(model)
        if mine:
            torch._foreach_mul_(mine, d)
            torch._foreach_add_(mine, theirs, alpha=1 - d)
        if counters:
            torch._foreach_copy_(counters, sources)

    def _pairs(self, model: nn.Module) -> tuple[list, list, list, list]:
        """The EMA's tensors and the model's, paired by name: made at the
        first update and kept, since a step changes tensors in place (the
        optimizer, BatchNorm's statistics, load_state_dict, broadcasts); made
        again for another model object. Two state_dict() walks of ~550
        modules each and ~700 detach() calls per step were a host cost that
        a GPU waits for (yolo26n: about 3 ms of a step's launches)."""
        if self._paired is not None and self._paired[0] is model:
            return self._paired[1]
        source = model.state_dict()
        mine, theirs, counters, sources = [], [], [], []
        for name, value in self.module.state_dict().items():
            floating = value.dtype.is_floating_point
            (mine if floating else counters).append(value)
            (theirs if floating else sources).append(source[name])
        self._paired = (model, (mine, theirs, counters, sources))
        return self._paired[1]

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = state["updates"]
