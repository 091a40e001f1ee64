"""Multi-scale training (ultralytics' `multi_scale`): each step's batch is
resized to a size drawn around imgsz.

The size is a pure function of (seed, batch number): never drawn from a
rank's own random stream, which would give the ranks different shapes at the
same step and a resumed run other sizes than an uninterrupted one.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from ..common.registry import MAX_STRIDE


def step_size(imgsz: int, fraction: float, seed: int, number: int) -> int:
    """The training size of batch `number` (counted over the whole run):
    uniform in imgsz x [1 - fraction, 1 + fraction], rounded to a multiple of
    the largest stride, at least one stride."""
    # A str seed is hashed by SHA-512: the same on every rank, run and Python.
    draw = random.Random(f"multi-scale/{seed}/{number}").uniform(imgsz * (1 - fraction), imgsz * (1 + fraction))
    return max(MAX_STRIDE, round(draw / MAX_STRIDE) * MAX_STRIDE)


def rescale(imgs: torch.Tensor, size: int, imgsz: int) -> torch.Tensor:
    """The batch resized by size / imgsz, each side rounded up to the stride
    (a rectangular batch keeps its aspect ratio). Labels are normalised to
    the image, so they need no change."""
    gain = size / imgsz
    shape = [max(MAX_STRIDE, math.ceil(side * gain / MAX_STRIDE) * MAX_STRIDE) for side in imgs.shape[2:]]
    if shape == list(imgs.shape[2:]):
        return imgs
    return F.interpolate(imgs, size=shape, mode="bilinear", align_corners=False)
