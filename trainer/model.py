"""An anchor-free YOLOv8-style detector: CSP backbone, PAN neck, decoupled head.

Written from the published YOLOv8 architecture description (layer table,
scale multipliers, head channel rules, bias init), not from ultralytics code.
Everything here is DDP-, SyncBatchNorm- and channels_last-friendly: forward
changes no Python state and does no in-place arithmetic on activations.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from .boxes import dist2bbox, make_anchors

# scale -> (depth multiple, width multiple, max channels), as published for YOLOv8.
SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768)}
STRIDES = (8, 16, 32)
REG_MAX = 16


# ---------------------------------------------------------------- scaling rules

def make_divisible(x: float, divisor: int = 8) -> int:
    """Round x up to a multiple of divisor."""
    return int(math.ceil(x / divisor) * divisor)


def scale_width(channels: int, width: float, max_channels: int) -> int:
    """Channels of a layer after the width multiple and the channel cap."""
    return make_divisible(min(channels, max_channels) * width)


def scale_depth(repeats: int, depth: float) -> int:
    """Bottleneck repeats of a C2f after the depth multiple (at least one)."""
    return max(round(repeats * depth), 1)


# ---------------------------------------------------------------- building blocks

class Conv(nn.Sequential):
    """Conv2d (no bias) + BatchNorm2d + SiLU, 'same' padding for odd kernels."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1):
        super().__init__(
            nn.Conv2d(c_in, c_out, k, s, padding=k // 2, bias=False),
            # YOLOv8's BN settings; momentum 0.03 (PyTorch convention) is a slow
            # running average, which suits the small per-GPU batches of detection.
            nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03),
            nn.SiLU(),
        )


class Bottleneck(nn.Module):
    """Two 3x3 Convs, with a residual add when asked and the shapes allow it."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True, e: float = 1.0):
        super().__init__()
        hidden = int(c_out * e)
        self.cv1 = Conv(c_in, hidden, 3)
        self.cv2 = Conv(hidden, c_out, 3)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP block: split, chain n Bottlenecks on one half, concat every stage, fuse."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = False):
        super().__init__()
        self.hidden = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.hidden, 1)
        self.cv2 = Conv((2 + n) * self.hidden, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.hidden, self.hidden, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = list(self.cv1(x).split(self.hidden, dim=1))
        for block in self.m:
            ys.append(block(ys[-1]))
        return self.cv2(torch.cat(ys, dim=1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained k x k max-pools, concat, fuse."""

    def __init__(self, c_in: int, c_out: int, k: int = 5):
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(4 * hidden, c_out, 1)
        self.pool = nn.MaxPool2d(k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = [self.cv1(x)]
        for _ in range(3):
            ys.append(self.pool(ys[-1]))
        return self.cv2(torch.cat(ys, dim=1))


class Concat(nn.Module):
    """Concatenate a list of tensors along channels."""

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, dim=1)


def upsample() -> nn.Upsample:
    """Nearest-neighbour x2 upsampling, as in the YOLOv8 neck."""
    return nn.Upsample(scale_factor=2.0, mode="nearest")


# ---------------------------------------------------------------- backbone and neck

Scaler = Callable[[int], int]  # published channels or repeats -> this scale's

class Backbone(nn.Module):
    """CSP backbone: stem, four stride-2 stages with C2f, SPPF; returns P3, P4, P5."""

    def __init__(self, w: Scaler, d: Scaler):
        super().__init__()
        self.stem = nn.Sequential(Conv(3, w(64), 3, 2), Conv(w(64), w(128), 3, 2),
                                  C2f(w(128), w(128), d(3), shortcut=True))
        self.stage3 = nn.Sequential(Conv(w(128), w(256), 3, 2), C2f(w(256), w(256), d(6), True))
        self.stage4 = nn.Sequential(Conv(w(256), w(512), 3, 2), C2f(w(512), w(512), d(6), True))
        self.stage5 = nn.Sequential(Conv(w(512), w(1024), 3, 2), C2f(w(1024), w(1024), d(3), True),
                                    SPPF(w(1024), w(1024), 5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p3 = self.stage3(self.stem(x))
        p4 = self.stage4(p3)
        return p3, p4, self.stage5(p4)


class Neck(nn.Module):
    """PAN: a top-down path (upsample + concat) then a bottom-up path (stride-2 Conv + concat)."""

    def __init__(self, w: Scaler, d: Scaler):
        super().__init__()
        self.up = upsample()
        self.cat = Concat()
        # The neck's C2f blocks have no residual shortcut, per the published table.
        self.td4 = C2f(w(1024) + w(512), w(512), d(3))
        self.td3 = C2f(w(512) + w(256), w(256), d(3))
        self.down3 = Conv(w(256), w(256), 3, 2)
        self.bu4 = C2f(w(256) + w(512), w(512), d(3))
        self.down4 = Conv(w(512), w(512), 3, 2)
        self.bu5 = C2f(w(512) + w(1024), w(1024), d(3))
        self.out_channels = (w(256), w(512), w(1024))

    def forward(self, feats: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        p3, p4, p5 = feats
        t4 = self.td4(self.cat([self.up(p5), p4]))
        n3 = self.td3(self.cat([self.up(t4), p3]))
        n4 = self.bu4(self.cat([self.down3(n3), t4]))
        n5 = self.bu5(self.cat([self.down4(n4), p5]))
        return [n3, n4, n5]


# ---------------------------------------------------------------- head

def branch(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    """Two 3x3 Convs then a plain 1x1 Conv2d (with bias) to the output logits."""
    return nn.Sequential(Conv(c_in, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, c_out, 1))


class Detect(nn.Module):
    """Decoupled head: per level, a box-distribution branch and a class branch."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int = REG_MAX,
                 strides: tuple[int, ...] = STRIDES):
        super().__init__()
        box_hidden = max(16, channels[0] // 4, 4 * reg_max)
        cls_hidden = max(channels[0], min(nc, 100))
        self.box = nn.ModuleList(branch(c, box_hidden, 4 * reg_max) for c in channels)
        self.cls = nn.ModuleList(branch(c, cls_hidden, nc) for c in channels)
        self.init_biases(nc, strides)

    @torch.no_grad()
    def init_biases(self, nc: int, strides: tuple[int, ...]) -> None:
        """Prior biases so that training from scratch starts stable."""
        for box, cls, s in zip(self.box, self.cls, strides):
            box[-1].bias.fill_(1.0)
            # Prior of ~5 objects per 640x640 image spread over nc classes and the
            # (640/s)^2 cells of this level: keeps early class loss from exploding.
            cls[-1].bias.fill_(math.log(5 / nc / (640 / s) ** 2))

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat([box(x), cls(x)], dim=1) for x, box, cls in zip(feats, self.box, self.cls)]


# ---------------------------------------------------------------- decoding

def dfl_expectation(box_logits: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Box-distribution logits [B, 4*reg_max, A] -> expected distances [B, 4, A] (DFL)."""
    b, _, a = box_logits.shape
    probs = box_logits.reshape(b, 4, reg_max, a).softmax(dim=2)
    bins = torch.arange(reg_max, dtype=probs.dtype, device=probs.device).view(1, 1, reg_max, 1)
    return (probs * bins).sum(dim=2)


# ---------------------------------------------------------------- the model

class DetectionModel(nn.Module):
    """YOLOv8-style detector: forward gives raw maps, decode turns them into boxes."""

    def __init__(self, nc: int, scale: str = "n"):
        super().__init__()
        if scale not in SCALES:
            raise ValueError(f"unknown model scale {scale!r}; choose one of {', '.join(SCALES)}")
        if nc < 1:
            raise ValueError(f"nc must be at least 1, got {nc}")
        depth, width, max_channels = SCALES[scale]
        self.nc, self.reg_max, self.scale = nc, REG_MAX, scale
        self.no = 4 * REG_MAX + nc  # channels of each output map

        def w(c):
            return scale_width(c, width, max_channels)

        def d(n):
            return scale_depth(n, depth)

        self.backbone = Backbone(w, d)
        self.neck = Neck(w, d)
        self.head = Detect(nc, self.neck.out_channels, REG_MAX, STRIDES)
        # Non-persistent: an architectural constant, not checkpoint state; a buffer
        # so that it follows the model across .to(device).
        self.register_buffer("stride", torch.tensor(STRIDES, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.head(self.neck(self.backbone(x)))

    def decode(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps -> [B, 4 + nc, A]: (cx, cy, w, h) in input pixels, then sigmoid class scores."""
        flat = torch.cat([f.flatten(2) for f in feats], dim=2)  # [B, no, A]
        box_logits, cls_logits = flat.split((4 * self.reg_max, self.nc), dim=1)
        dist = dfl_expectation(box_logits, self.reg_max)  # [B, 4, A], grid units
        # The Python constant, not the self.stride buffer: make_anchors takes
        # floats, and reading them off a device tensor would sync the GPU.
        points, strides = make_anchors(feats, STRIDES, 0.5)
        boxes = dist2bbox(dist.transpose(1, 2), points, xywh=True, dim=-1) * strides
        return torch.cat([boxes.transpose(1, 2), cls_logits.sigmoid()], dim=1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.forward(x))


def build_model(scale: str, nc: int) -> DetectionModel:
    """A freshly initialised detector of the given scale (n, s, m) for nc classes."""
    return DetectionModel(nc=nc, scale=scale)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (all of them, trainable or not)."""
    return sum(p.numel() for p in model.parameters())
