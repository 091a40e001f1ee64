"""The keypoint model of each family (ultralytics' `*-pose`): the detector
(backbone, neck, box and class branches) plus, per level, a branch that
predicts each anchor's K keypoints (x, y and, with kpt_shape [K, 3], a
visibility logit).

Written from ultralytics 8.4's published descriptions (yolov8-pose.yaml,
yolo11-pose.yaml, yolo26-pose.yaml; head.py's Pose and Pose26):

- Pose (YOLOv8, YOLO11): per level two 3x3 Convs of max(channels/4, K*D)
  and a 1x1 to the K*D values. A keypoint decodes as
  ((x * 2 + anchor - 0.5) * stride, (y * 2 + anchor - 0.5) * stride), the
  anchor a cell's centre in grid units; a visibility by its sigmoid.
- Pose26 (YOLO26): per level two 3x3 Convs of max(channels/4, K*(D+2)),
  then two 1x1s: the K*D keypoint values and, for training only, 2K scales
  (a sigma per coordinate, for the residual log-likelihood loss); a
  keypoint decodes as ((x + anchor) * stride, (y + anchor) * stride). The
  one-to-one head has its own copy of the three; a RealNVP flow (6 coupling
  layers of 2 -> 64 -> 64 -> 2) is the learnt error density of that loss.

And what a keypoint is measured by, for the loss and validation alike: the
OKS sigmas (ultralytics' OKS_SIGMA for COCO's [17, 3], 1/K otherwise, or a
data.yaml's kpt_oks_sigmas) and the area OKS takes of a box.
"""

from __future__ import annotations

import copy
import math
from typing import Sequence

import torch
from torch import Tensor, nn

from .blocks import Conv, branch
from .detector import STRIDES, Detect, DetectionModel
from .boxes import make_anchors

KPT_SHAPE = (17, 3)  # ultralytics' default, COCO's 17 keypoints with visibility: the shape COCO's sigmas are for
# COCO's per-keypoint sigmas (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles): ultralytics' OKS_SIGMA
OKS_SIGMA = (0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07, 0.87, 0.87, 0.89, 0.89)


def keypoint_sigmas(kpt_shape: Sequence[int], own: Sequence[float] | None = None) -> Tensor:
    """[K] OKS sigmas: a data.yaml's own (`kpt_oks_sigmas`: K positive
    values, else ValueError), or COCO's / 10 for kpt_shape [17, 3], else
    1/K each (ultralytics' choice)."""
    k = int(kpt_shape[0])
    if own is not None:
        sigmas = torch.as_tensor(own, dtype=torch.float32).flatten()
        if len(sigmas) != k or not bool((sigmas > 0).all()):
            raise ValueError(f"kpt_oks_sigmas must be {k} positive values, got {list(own)}")
        return sigmas
    if tuple(kpt_shape) == KPT_SHAPE:
        return torch.tensor(OKS_SIGMA, dtype=torch.float32) / 10.0
    return torch.full((k,), 1.0 / k)


# a box's w * h to the object area OKS takes (xtcocotools' cocoeval): the pose loss's assignment and validation's
AREA_SCALE = 0.53


class RealNVP(nn.Module):
    """The flow of YOLO26's keypoint loss (ultralytics' RealNVP, after
    mmpose's): six affine coupling layers over a 2-d error, alternately
    conditioned on one coordinate; `log_prob` is the error's log density
    under a standard normal pulled back through them. Ultralytics' loc, cov
    and mask buffers are constants here (model/heads.py checks them)."""

    MASKS = ((0.0, 1.0), (1.0, 0.0)) * 3

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tensor(self.MASKS), persistent=False)
        self.s = nn.ModuleList(nn.Sequential(nn.Linear(2, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(),
                                             nn.Linear(64, 2), nn.Tanh()) for _ in self.MASKS)
        self.t = nn.ModuleList(nn.Sequential(nn.Linear(2, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(),
                                             nn.Linear(64, 2)) for _ in self.MASKS)
        for m in self.modules():  # a near-identity flow to start from, as ultralytics
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight, gain=0.01)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """[N, 2] errors -> [N] log densities (float32: the squares overflow in half precision)."""
        z, log_det = x, x.new_zeros(x.shape[0])
        for i in reversed(range(len(self.t))):
            keep = self.mask[i] * z
            s = self.s[i](keep) * (1 - self.mask[i])
            t = self.t[i](keep) * (1 - self.mask[i])
            z = (1 - self.mask[i]) * (z - t) * torch.exp(-s) + keep
            log_det = log_det - s.sum(dim=1)
        return -0.5 * (z.float() ** 2).sum(-1) - math.log(2 * math.pi) + log_det


class PoseHead(Detect):
    """Detect's branches and a keypoint branch per level (`kpt`); YOLO26's
    (`pose26`): `kpt` the two Convs, `kpt_out` and `kpt_sigma` the 1x1s
    after them, each with its one-to-one copy, and the loss's `flow`."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int, kpt_shape: tuple[int, int],
                 strides: tuple[int, ...] = STRIDES, depthwise_cls: bool = False, one2one: bool = False,
                 pose26: bool = False):
        super().__init__(nc, channels, reg_max, strides, depthwise_cls=depthwise_cls, one2one=one2one)
        k, dims = kpt_shape
        self.kpt_shape, self.nk = (k, dims), k * dims
        if pose26:
            hidden = max(channels[0] // 4, k * (dims + 2))
            self.kpt = nn.ModuleList(nn.Sequential(Conv(c, hidden, 3), Conv(hidden, hidden, 3)) for c in channels)
            self.kpt_out = nn.ModuleList(nn.Conv2d(hidden, self.nk, 1) for _ in channels)
            self.kpt_sigma = nn.ModuleList(nn.Conv2d(hidden, 2 * k, 1) for _ in channels)
            self.flow = RealNVP()
        else:
            self.kpt = nn.ModuleList(branch(c, max(channels[0] // 4, self.nk), self.nk) for c in channels)
        if one2one:
            for name in ("kpt", "kpt_out", "kpt_sigma") if pose26 else ("kpt",):
                setattr(self, f"one2one_{name}", copy.deepcopy(getattr(self, name)))

    @property
    def pose26(self) -> bool:
        return hasattr(self, "kpt_out")

    def keypoints(self, feats: list[torch.Tensor], one2one: bool = False) -> list[torch.Tensor]:
        """Per level [B, K*D, H, W]: each anchor's raw keypoint values."""
        prefix = "one2one_" if one2one else ""
        kpt = getattr(self, prefix + "kpt")
        if not self.pose26:
            return [m(x) for x, m in zip(feats, kpt)]
        out = getattr(self, prefix + "kpt_out")
        return [o(m(x)) for x, m, o in zip(feats, kpt, out)]

    def keypoints_and_sigmas(self, feats: list[torch.Tensor], one2one: bool = False):
        """YOLO26's: (keypoints, [B, 2K, H, W] sigma logits) per level, the shared Convs run once."""
        prefix = "one2one_" if one2one else ""
        kpt, out, sigma = (getattr(self, prefix + n) for n in ("kpt", "kpt_out", "kpt_sigma"))
        hidden = [m(x) for x, m in zip(feats, kpt)]
        return [o(h) for h, o in zip(hidden, out)], [s(h) for h, s in zip(hidden, sigma)]


class PoseModel(DetectionModel):
    """A detector whose every box comes with K keypoints. forward gives (the
    detector's maps, keypoint maps); YOLO26's both heads' (with the sigma
    maps in training mode)."""

    task = "pose"

    def __init__(self, nc: int, scale: str = "n", kpt_shape: tuple[int, int] = KPT_SHAPE):
        if len(kpt_shape) != 2 or kpt_shape[0] < 1 or kpt_shape[1] not in (2, 3):
            raise ValueError(f"kpt_shape must be [keypoints, 2 or 3], got {list(kpt_shape)}")
        self.kpt_shape = tuple(int(v) for v in kpt_shape)  # read by make_head, during DetectionModel's init
        super().__init__(nc, scale)

    def make_head(self, spec, nc: int) -> PoseHead:
        return PoseHead(nc, self.neck.out_channels, self.reg_max, self.kpt_shape, STRIDES,
                        depthwise_cls=spec.DEPTHWISE_CLS, one2one=spec.END2END, pose26=spec.END2END)

    def forward(self, x: torch.Tensor):
        """(the detector's maps per level, the keypoint maps per level): what
        the pose loss trains on. YOLO26's (end2end): ((maps, keypoints,
        sigmas), (the one-to-one head's three)), sigmas None in eval mode (as
        ultralytics' head computes them in training only); the one-to-one
        branches see detached features, as the detector's."""
        feats = self.neck(self.backbone(x))
        if not self.end2end:
            return self.head(feats), self.head.keypoints(feats)
        detached = [f.detach() for f in feats]
        heads = []
        for one2one, f in ((False, feats), (True, detached)):
            maps = self.head.one2one(f) if one2one else self.head(f)
            if self.training:
                heads.append((maps, *self.head.keypoints_and_sigmas(f, one2one)))
            else:
                heads.append((maps, self.head.keypoints(f, one2one), None))
        return tuple(heads)

    def decode_keypoints(self, kpts: list[torch.Tensor]) -> torch.Tensor:
        """Raw keypoint maps -> [B, K*D, A]: x, y in input pixels (and
        visibility in 0..1) of each keypoint of each anchor, as ultralytics'
        kpts_decode."""
        flat = torch.cat([k.flatten(2) for k in kpts], dim=2)
        b, a = flat.shape[0], flat.shape[2]
        k, dims = self.kpt_shape
        y = flat.view(b, k, dims, a)
        points, strides = make_anchors(kpts, STRIDES, 0.5)  # [A, 2] cell centres, [A, 1]
        points, strides = points.t(), strides.t()  # [2, A], [1, A]: against y's last two dims
        scale, shift = (1.0, 0.0) if self.head.pose26 else (2.0, -0.5)
        xy = (y[:, :, :2] * scale + points + shift) * strides
        parts = [xy, y[:, :, 2:].sigmoid()] if dims == 3 else [xy]
        return torch.cat(parts, dim=2).view(b, k * dims, a)

    def predict(self, x: torch.Tensor, end2end: bool = False) -> torch.Tensor:
        """[B, 4 + nc + K*D, A]: the detector's decoded boxes and scores, then
        each anchor's decoded keypoints; `end2end` (YOLO26, ultralytics'
        nms=False): the one-to-one head's [B, 300, 6 + K*D] instead."""
        feats = self.neck(self.backbone(x))
        if end2end:
            keypoints = self.decode_keypoints(self.head.keypoints(feats, one2one=True))
            return self.decode_end2end(self.head.one2one(feats), extra=keypoints)
        return torch.cat([self.decode(self.head(feats)), self.decode_keypoints(self.head.keypoints(feats))], dim=1)


def build_model(scale: str, nc: int, kpt_shape: tuple[int, int] = KPT_SHAPE) -> PoseModel:
    """A freshly initialised keypoint model (yolov8n ... yolo26x) for nc classes and kpt_shape."""
    return PoseModel(nc=nc, scale=scale, kpt_shape=kpt_shape)
