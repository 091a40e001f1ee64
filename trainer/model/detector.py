"""The anchor-free YOLO-family detector: a family's body (families/: backbone
and neck), the decoupled head, and decoding to boxes.

Written from the published architecture descriptions (layer tables, scale
multipliers, head channel rules, bias init), not from ultralytics code.
Everything here is DDP-, SyncBatchNorm- and channels_last-friendly: forward
changes no Python state and does no in-place arithmetic on activations.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ..common import registry
from . import families
from .blocks import branch, dw_branch, scale_depth, scale_width
from .boxes import dist2bbox, make_anchors, non_max_suppression

MODELS = registry.MODELS
ALIASES = registry.ALIASES  # n, s, m: YOLOv8's sizes, as hpcyolo first offered them
STRIDES = (8, 16, 32)
REG_MAX = 16
MAX_DET = 300  # detections an end2end head keeps per image (ultralytics' max_det)


def model_family(name: str, nc: int):
    """(family, size, the family's module) of a model name for nc classes;
    ValueError for an unknown name or fewer than one class."""
    family, size = resolve_model(name)
    if nc < 1:
        raise ValueError(f"nc must be at least 1, got {nc}")
    return family, size, families.load(family)


def resolve_model(name: str) -> tuple[str, str]:
    """A model name (yolov8n ... yolo11x, or an alias n, s, m) -> (family, scale)."""
    full = ALIASES.get(name, name)
    if full not in MODELS:
        raise ValueError(f"unknown model scale {name!r}; choose one of {', '.join(MODELS)} (or {', '.join(ALIASES)}, "
                         "the YOLOv8 sizes)")
    return full[:-1], full[-1]


# ---------------------------------------------------------------- head

class Detect(nn.Module):
    """Decoupled head: per level, a box-distribution branch and a class branch.
    `one2one` (YOLO26's end2end): a second copy of both, for NMS-free inference."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int = REG_MAX,
                 strides: tuple[int, ...] = STRIDES, depthwise_cls: bool = False, one2one: bool = False):
        super().__init__()
        box_hidden = max(16, channels[0] // 4, 4 * reg_max)
        cls_hidden = max(channels[0], min(nc, 100))
        cls_branch = dw_branch if depthwise_cls else branch
        self.box = nn.ModuleList(branch(c, box_hidden, 4 * reg_max) for c in channels)
        self.cls = nn.ModuleList(cls_branch(c, cls_hidden, nc) for c in channels)
        self.init_biases(nc, strides)
        if one2one:
            self.one2one_box, self.one2one_cls = copy.deepcopy(self.box), copy.deepcopy(self.cls)

    @torch.no_grad()
    def init_biases(self, nc: int, strides: tuple[int, ...]) -> None:
        """Prior biases so that training from scratch starts stable."""
        for box, cls, s in zip(self.box, self.cls, strides):
            # Distances of 2 grid units to start from (reg_max 1, as ultralytics);
            # DFL's bins: any constant, a softmax does not see it.
            box[-1].bias.fill_(2.0 if box[-1].out_channels == 4 else 1.0)
            # Prior of ~5 objects per 640x640 image spread over nc classes and the
            # (640/s)^2 cells of this level: keeps early class loss from exploding.
            cls[-1].bias.fill_(math.log(5 / nc / (640 / s) ** 2))

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat([box(x), cls(x)], dim=1) for x, box, cls in zip(feats, self.box, self.cls)]

    def one2one(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        """The one-to-one branches' maps (end2end heads only)."""
        return [torch.cat([box(x), cls(x)], dim=1) for x, box, cls in zip(feats, self.one2one_box, self.one2one_cls)]


# ---------------------------------------------------------------- decoding

def dfl_expectation(box_logits: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Box-distribution logits [B, 4*reg_max, A] -> expected distances [B, 4, A] (DFL)."""
    b, _, a = box_logits.shape
    probs = box_logits.reshape(b, 4, reg_max, a).softmax(dim=2)
    bins = torch.arange(reg_max, dtype=probs.dtype, device=probs.device).view(1, 1, reg_max, 1)
    return (probs * bins).sum(dim=2)


# ---------------------------------------------------------------- the model

class DetectionModel(nn.Module):
    """A detector of any family: forward gives raw maps, decode turns them into boxes."""

    task = "detect"

    def __init__(self, nc: int, scale: str = "n"):
        super().__init__()
        family, size, spec = model_family(scale, nc)
        depth, width, max_channels = spec.SCALES[size]
        self.nc, self.reg_max, self.scale = nc, spec.REG_MAX, scale
        self.family, self.arch = family, family + size
        self.no = 4 * self.reg_max + nc  # channels of each output map

        def d(n):
            return scale_depth(n, depth)

        self.width = (width, max_channels)
        self.backbone, self.neck = spec.body(self.w, d, size)
        self.head = self.make_head(spec, nc)
        # Non-persistent: an architectural constant, not checkpoint state; a buffer
        # so that it follows the model across .to(device).
        self.register_buffer("stride", torch.tensor(STRIDES, dtype=torch.float32), persistent=False)

    def w(self, channels: int) -> int:
        """A published channel count at this model's size."""
        return scale_width(channels, *self.width)

    def make_head(self, spec, nc: int) -> Detect:
        """The head on the neck's levels (a task's model with more outputs overrides it)."""
        return Detect(nc, self.neck.out_channels, self.reg_max, STRIDES, depthwise_cls=spec.DEPTHWISE_CLS,
                      one2one=spec.END2END)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The head's raw maps, what the loss trains on; an end2end model's
        come with its one-to-one maps, computed on detached features: the
        one-to-one loss trains its own branches only, never the body."""
        feats = self.neck(self.backbone(x))
        if self.end2end:
            return self.head(feats), self.head.one2one([f.detach() for f in feats])
        return self.head(feats)

    def decode(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps -> [B, 4 + nc, A]: (cx, cy, w, h) in input pixels, then sigmoid class scores."""
        flat = torch.cat([f.flatten(2) for f in feats], dim=2)  # [B, no, A]
        box_logits, cls_logits = flat.split((4 * self.reg_max, self.nc), dim=1)
        # [B, 4, A] in grid units: the distribution's expectation, or (reg_max 1) the distances themselves
        dist = dfl_expectation(box_logits, self.reg_max) if self.reg_max > 1 else box_logits
        # The Python constant, not the self.stride buffer: make_anchors takes
        # floats, and reading them off a device tensor would sync the GPU.
        points, strides = make_anchors(feats, STRIDES, 0.5)
        boxes = dist2bbox(dist.transpose(1, 2), points, xywh=True, dim=-1) * strides
        return torch.cat([boxes.transpose(1, 2), cls_logits.sigmoid()], dim=1)

    @property
    def end2end(self) -> bool:
        """Whether the head has a one-to-one copy (YOLO26): NMS-free inference."""
        return hasattr(self.head, "one2one_box")

    def decode_end2end(self, feats: list[torch.Tensor], max_det: int = MAX_DET,
                       extra: torch.Tensor | None = None) -> torch.Tensor:
        """The one-to-one maps -> [B, max_det, 6]: (x1, y1, x2, y2) in input
        pixels, score, class; the max_det best over anchors x classes (the
        anchors with the best class score first, then their best pairs).
        `extra` [B, C, A] (a segmenter's mask coefficients): each pick's
        anchor's C values appended, [B, max_det, 6 + C]."""
        boxes, scores = self.decode(feats).transpose(1, 2).split((4, self.nc), dim=-1)
        boxes = torch.cat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], dim=-1)
        k = min(max_det, boxes.shape[1])
        best = scores.amax(dim=-1).topk(k).indices.unsqueeze(-1)
        boxes, scores = boxes.gather(1, best.expand(-1, -1, 4)), scores.gather(1, best.expand(-1, -1, self.nc))
        top, pair = scores.flatten(1).topk(k)
        rows = torch.arange(boxes.shape[0], device=boxes.device).unsqueeze(-1)
        out = [boxes[rows, pair // self.nc], top.unsqueeze(-1), (pair % self.nc).unsqueeze(-1).to(top)]
        if extra is not None:
            extra = extra.transpose(1, 2).gather(1, best.expand(-1, -1, extra.shape[1]))
            out.append(extra[rows, pair // self.nc].to(top))
        return torch.cat(out, dim=-1)

    def predict(self, x: torch.Tensor, end2end: bool = False) -> torch.Tensor:
        """[B, 4 + nc, A] from the one-to-many head (before NMS); with
        `end2end`, [B, 300, 6] from the one-to-one head (decode_end2end)."""
        feats = self.neck(self.backbone(x))
        if end2end:
            return self.decode_end2end(self.head.one2one(feats))
        return self.decode(self.head(feats))


def check_end2end(model, end2end: bool, weights: object) -> None:
    """--end2end asks for a one-to-one head: a YOLO26 detector's or segmenter's."""
    if end2end and not getattr(model, "end2end", False):
        from ..common.errors import HpcyoloError

        if getattr(model, "task", "detect") == "classify":
            raise HpcyoloError(f"{weights}: a classifier has no NMS to leave out; --end2end (NMS-free, ultralytics' "
                               "nms=False) is for YOLO26 detectors and segmenters")
        raise HpcyoloError(f"{weights}: {model.arch} has no one-to-one head; --end2end (NMS-free, ultralytics' "
                           "nms=False) is for YOLO26 weights")


def detections(model: DetectionModel, x: torch.Tensor, *, conf: float, iou: float, end2end: bool = False,
               multi_label: bool = False) -> list[torch.Tensor]:
    """Per image [n, 6]: (x1, y1, x2, y2) in input pixels, confidence, class.
    NMS over the one-to-many head's boxes, as ultralytics does by default;
    with `end2end` (ultralytics' nms=False), the one-to-one head's top 300
    whose confidence passes `conf`, no NMS."""
    if end2end:
        return confident(model.predict(x, end2end=True), conf)
    return non_max_suppression(model.predict(x), conf_thres=conf, iou_thres=iou, multi_label=multi_label)


def confident(picks: torch.Tensor, conf: float) -> list[torch.Tensor]:
    """Per image, an end2end head's picks ([B, 300, 6+], decode_end2end) whose confidence passes `conf`."""
    return [p[p[:, 4] > conf] for p in picks]


def build_model(scale: str, nc: int) -> DetectionModel:
    """A freshly initialised detector (yolov8n ... yolo26x, or n, s, m for YOLOv8) for nc classes."""
    return DetectionModel(nc=nc, scale=scale)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (all of them, trainable or not)."""
    return sum(p.numel() for p in model.parameters())
