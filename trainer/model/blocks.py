"""The building blocks of the YOLO-family detectors: convolutions, CSP
blocks, attention, SPPF, the backbone and neck containers, the head's
branches, and the scaling rules of a family's sizes. Written from the
published architecture descriptions, not from ultralytics code. The model
families (families/) assemble them; model.py adds the head and decoding.

Everything here is DDP-, SyncBatchNorm- and channels_last-friendly: forward
changes no Python state and does no in-place arithmetic on activations.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

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
    """Conv2d (no bias) + BatchNorm2d + SiLU (or nothing), 'same' padding for odd kernels."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True):
        super().__init__(
            nn.Conv2d(c_in, c_out, k, s, padding=k // 2, groups=g, bias=False),
            # YOLOv8's BN settings; momentum 0.03 (PyTorch convention) is a slow
            # running average, which suits the small per-GPU batches of detection.
            nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03),
            nn.SiLU() if act else nn.Identity(),
        )


def dw_conv(c_in: int, c_out: int, k: int) -> Conv:
    """Depthwise Conv: one group per channel (gcd(c_in, c_out) groups)."""
    return Conv(c_in, c_out, k, g=math.gcd(c_in, c_out))


class Bottleneck(nn.Module):
    """Two 3x3 Convs (hidden width c_out * e), with a residual add when asked and the shapes allow it."""

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
    """CSP block: split, chain n blocks on one half, concat every stage, fuse.

    YOLOv8's C2f chains Bottlenecks of full width; YOLO11's C3k2 is the same
    frame with half-width Bottlenecks, or C3k blocks (`c3k`), and a hidden
    width of c_out * e."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = False, e: float = 0.5,
                 block: Callable[[int], nn.Module] | None = None):
        super().__init__()
        self.hidden = int(c_out * e)
        self.cv1 = Conv(c_in, 2 * self.hidden, 1)
        self.cv2 = Conv((2 + n) * self.hidden, c_out, 1)
        block = block or (lambda c: Bottleneck(c, c, shortcut))
        self.m = nn.ModuleList(block(self.hidden) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = list(self.cv1(x).split(self.hidden, dim=1))
        for block in self.m:
            ys.append(block(ys[-1]))
        return self.cv2(torch.cat(ys, dim=1))


def c3k2(c_in: int, c_out: int, n: int, c3k: bool, e: float = 0.5, attn: bool = False) -> C2f:
    """YOLO11's C3k2: a C2f of C3k blocks (c3k) or of half-width Bottlenecks, residual throughout;
    YOLO26's last one (attn): each block a half-width Bottleneck then a PSA block (64 channels a head)."""
    if attn:
        return C2f(c_in, c_out, n, e=e, block=lambda c: nn.Sequential(Bottleneck(c, c, shortcut=True, e=0.5),
                                                                      PSABlock(c, heads=max(c // 64, 1))))
    if c3k:
        return C2f(c_in, c_out, n, e=e, block=lambda c: C3(c, c, 2))
    return C2f(c_in, c_out, n, e=e, block=lambda c: Bottleneck(c, c, shortcut=True, e=0.5))


class C3(nn.Module):
    """CSP block with three Convs: Bottlenecks on one branch, a 1x1 Conv on the
    other, concat, fuse (YOLO11's C3k: 3x3 kernels, residual Bottlenecks)."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True, e: float = 0.5):
        super().__init__()
        hidden = int(c_out * e)
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(c_in, hidden, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat([self.m(self.cv1(x)), self.cv2(x)], dim=1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: n chained k x k max-pools, concat, fuse.
    YOLO26's has no activation on its first Conv and a residual add."""

    def __init__(self, c_in: int, c_out: int, k: int = 5, n: int = 3, shortcut: bool = False, act: bool = True):
        super().__init__()
        hidden = c_in // 2
        self.n = n
        self.cv1 = Conv(c_in, hidden, 1, act=act)
        self.cv2 = Conv((n + 1) * hidden, c_out, 1)
        self.pool = nn.MaxPool2d(k, stride=1, padding=k // 2)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = [self.cv1(x)]
        for _ in range(self.n):
            ys.append(self.pool(ys[-1]))
        y = self.cv2(torch.cat(ys, dim=1))
        return x + y if self.add else y


class Attention(nn.Module):
    """Multi-head self-attention over all positions of a map, with 1x1 Convs
    for q, k, v (keys half the head width) and a depthwise 3x3 positional term
    on v, as in YOLO11's PSA block."""

    def __init__(self, dim: int, heads: int, attn_ratio: float = 0.5):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, g=dim, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        # Per head, channels are laid out q | k | v.
        qkv = self.qkv(x).reshape(b, self.heads, 2 * self.key_dim + self.head_dim, h * w)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)  # [b, heads, hw, hw]
        out = (v @ attn.transpose(-2, -1)).reshape(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(out)


class PSABlock(nn.Module):
    """Attention then a two-Conv feed-forward, each with a residual add."""

    def __init__(self, c: int, heads: int):
        super().__init__()
        self.attn = Attention(c, heads, attn_ratio=0.5)
        self.ffn = nn.Sequential(Conv(c, 2 * c, 1), Conv(2 * c, c, 1, act=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.ffn(x)


class C2PSA(nn.Module):
    """YOLO11's C2PSA: split in halves, n PSA blocks on one (64 channels a head), concat, fuse."""

    def __init__(self, c: int, n: int = 1):
        super().__init__()
        self.hidden = c // 2
        self.cv1 = Conv(c, 2 * self.hidden, 1)
        self.cv2 = Conv(2 * self.hidden, c, 1)
        self.m = nn.Sequential(*(PSABlock(self.hidden, heads=self.hidden // 64) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).split(self.hidden, dim=1)
        return self.cv2(torch.cat([a, self.m(b)], dim=1))


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
    """Stem, then stride-2 stages; returns P3, P4, P5."""

    def __init__(self, stem: nn.Sequential, stage3: nn.Sequential, stage4: nn.Sequential, stage5: nn.Sequential):
        super().__init__()
        self.stem, self.stage3, self.stage4, self.stage5 = stem, stage3, stage4, stage5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p3 = self.stage3(self.stem(x))
        p4 = self.stage4(p3)
        return p3, p4, self.stage5(p4)


class Neck(nn.Module):
    """PAN: a top-down path (upsample + concat) then a bottom-up path (stride-2 Conv + concat)."""

    def __init__(self, td4: nn.Module, td3: nn.Module, down3: nn.Module, bu4: nn.Module, down4: nn.Module,
                 bu5: nn.Module, out_channels: tuple[int, int, int]):
        super().__init__()
        self.up = upsample()
        self.cat = Concat()
        self.td4, self.td3, self.down3, self.bu4, self.down4, self.bu5 = td4, td3, down3, bu4, down4, bu5
        self.out_channels = out_channels

    def forward(self, feats: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        p3, p4, p5 = feats
        t4 = self.td4(self.cat([self.up(p5), p4]))
        n3 = self.td3(self.cat([self.up(t4), p3]))
        n4 = self.bu4(self.cat([self.down3(n3), t4]))
        n5 = self.bu5(self.cat([self.down4(n4), p5]))
        return [n3, n4, n5]


# ---------------------------------------------------------------- head branches

def branch(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    """Two 3x3 Convs then a plain 1x1 Conv2d (with bias) to the output logits."""
    return nn.Sequential(Conv(c_in, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, c_out, 1))


def dw_branch(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    """YOLO11's class branch: twice (depthwise 3x3, pointwise 1x1), then a 1x1 Conv2d to the logits."""
    return nn.Sequential(nn.Sequential(dw_conv(c_in, c_in, 3), Conv(c_in, hidden, 1)),
                         nn.Sequential(dw_conv(hidden, hidden, 3), Conv(hidden, hidden, 1)),
                         nn.Conv2d(hidden, c_out, 1))
