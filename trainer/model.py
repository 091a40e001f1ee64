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

from . import registry
from .boxes import dist2bbox, make_anchors

# Family -> scale -> (depth multiple, width multiple, max channels), as published
# in ultralytics' model YAMLs (cfg/models/v8/yolov8.yaml, cfg/models/11/yolo11.yaml).
FAMILIES = {
    "yolov8": {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768),
               "l": (1.00, 1.00, 512), "x": (1.00, 1.25, 512)},
    "yolo11": {"n": (0.50, 0.25, 1024), "s": (0.50, 0.50, 1024), "m": (0.50, 1.00, 512),
               "l": (1.00, 1.00, 512), "x": (1.00, 1.50, 512)},
}
MODELS = tuple(f"{family}{scale}" for family, scales in FAMILIES.items() for scale in scales)
assert MODELS == registry.MODELS, "trainer/registry.py names the same detectors"
ALIASES = registry.ALIASES  # n, s, m: YOLOv8's sizes, as hpcyolo first offered them
STRIDES = (8, 16, 32)
REG_MAX = 16


def resolve_model(name: str) -> tuple[str, str]:
    """A model name (yolov8n ... yolo11x, or an alias n, s, m) -> (family, scale)."""
    full = ALIASES.get(name, name)
    if full not in MODELS:
        raise ValueError(f"unknown model scale {name!r}; choose one of {', '.join(MODELS)} (or {', '.join(ALIASES)}, "
                         "the YOLOv8 sizes)")
    return full[:-1], full[-1]


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


def c3k2(c_in: int, c_out: int, n: int, c3k: bool, e: float = 0.5) -> C2f:
    """YOLO11's C3k2: a C2f of C3k blocks (c3k) or of half-width Bottlenecks, residual throughout."""
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


def yolov8_body(w: Scaler, d: Scaler, scale: str) -> tuple[Backbone, Neck]:
    """YOLOv8's published layer table (yolov8.yaml), layers 0-21."""
    backbone = Backbone(
        nn.Sequential(Conv(3, w(64), 3, 2), Conv(w(64), w(128), 3, 2), C2f(w(128), w(128), d(3), shortcut=True)),
        nn.Sequential(Conv(w(128), w(256), 3, 2), C2f(w(256), w(256), d(6), True)),
        nn.Sequential(Conv(w(256), w(512), 3, 2), C2f(w(512), w(512), d(6), True)),
        nn.Sequential(Conv(w(512), w(1024), 3, 2), C2f(w(1024), w(1024), d(3), True), SPPF(w(1024), w(1024), 5)))
    # The neck's C2f blocks have no residual shortcut, per the published table.
    neck = Neck(C2f(w(1024) + w(512), w(512), d(3)), C2f(w(512) + w(256), w(256), d(3)),
                Conv(w(256), w(256), 3, 2), C2f(w(256) + w(512), w(512), d(3)),
                Conv(w(512), w(512), 3, 2), C2f(w(512) + w(1024), w(1024), d(3)),
                (w(256), w(512), w(1024)))
    return backbone, neck


def yolo11_body(w: Scaler, d: Scaler, scale: str) -> tuple[Backbone, Neck]:
    """YOLO11's published layer table (yolo11.yaml), layers 0-22. The m, l and
    x sizes use C3k blocks in every C3k2, the smaller ones only where the
    table says so."""
    big = scale in "mlx"
    backbone = Backbone(
        nn.Sequential(Conv(3, w(64), 3, 2), Conv(w(64), w(128), 3, 2), c3k2(w(128), w(256), d(2), big, e=0.25)),
        nn.Sequential(Conv(w(256), w(256), 3, 2), c3k2(w(256), w(512), d(2), big, e=0.25)),
        nn.Sequential(Conv(w(512), w(512), 3, 2), c3k2(w(512), w(512), d(2), True)),
        nn.Sequential(Conv(w(512), w(1024), 3, 2), c3k2(w(1024), w(1024), d(2), True), SPPF(w(1024), w(1024), 5),
                      C2PSA(w(1024), d(2))))
    neck = Neck(c3k2(w(1024) + w(512), w(512), d(2), big), c3k2(w(512) + w(512), w(256), d(2), big),
                Conv(w(256), w(256), 3, 2), c3k2(w(256) + w(512), w(512), d(2), big),
                Conv(w(512), w(512), 3, 2), c3k2(w(512) + w(1024), w(1024), d(2), True),
                (w(256), w(512), w(1024)))
    return backbone, neck


BODIES = {"yolov8": yolov8_body, "yolo11": yolo11_body}


# ---------------------------------------------------------------- head

def branch(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    """Two 3x3 Convs then a plain 1x1 Conv2d (with bias) to the output logits."""
    return nn.Sequential(Conv(c_in, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, c_out, 1))


def dw_branch(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    """YOLO11's class branch: twice (depthwise 3x3, pointwise 1x1), then a 1x1 Conv2d to the logits."""
    return nn.Sequential(nn.Sequential(dw_conv(c_in, c_in, 3), Conv(c_in, hidden, 1)),
                         nn.Sequential(dw_conv(hidden, hidden, 3), Conv(hidden, hidden, 1)),
                         nn.Conv2d(hidden, c_out, 1))


class Detect(nn.Module):
    """Decoupled head: per level, a box-distribution branch and a class branch."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int = REG_MAX,
                 strides: tuple[int, ...] = STRIDES, depthwise_cls: bool = False):
        super().__init__()
        box_hidden = max(16, channels[0] // 4, 4 * reg_max)
        cls_hidden = max(channels[0], min(nc, 100))
        cls_branch = dw_branch if depthwise_cls else branch
        self.box = nn.ModuleList(branch(c, box_hidden, 4 * reg_max) for c in channels)
        self.cls = nn.ModuleList(cls_branch(c, cls_hidden, nc) for c in channels)
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
    """YOLOv8 or YOLO11 detector: forward gives raw maps, decode turns them into boxes."""

    def __init__(self, nc: int, scale: str = "n"):
        super().__init__()
        family, size = resolve_model(scale)
        if nc < 1:
            raise ValueError(f"nc must be at least 1, got {nc}")
        depth, width, max_channels = FAMILIES[family][size]
        self.nc, self.reg_max, self.scale = nc, REG_MAX, scale
        self.family, self.arch = family, family + size
        self.no = 4 * REG_MAX + nc  # channels of each output map

        def w(c):
            return scale_width(c, width, max_channels)

        def d(n):
            return scale_depth(n, depth)

        self.backbone, self.neck = BODIES[family](w, d, size)
        self.head = Detect(nc, self.neck.out_channels, REG_MAX, STRIDES, depthwise_cls=family == "yolo11")
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
    """A freshly initialised detector (yolov8n ... yolo11x, or n, s, m for YOLOv8) for nc classes."""
    return DetectionModel(nc=nc, scale=scale)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (all of them, trainable or not)."""
    return sum(p.numel() for p in model.parameters())
