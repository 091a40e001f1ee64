"""The oriented-box model of each family (ultralytics' `*-obb`): the detector
(backbone, neck, box and class branches) plus, per level, a branch that
predicts each anchor's angle; a box is its ltrb distances measured in its own
rotated frame about the anchor, and that angle.

Written from ultralytics 8.4's published descriptions (yolov8-obb.yaml,
yolo11-obb.yaml, yolo26-obb.yaml; the OBB and OBB26 heads of nn/modules/
head.py): the body is the family's detector's, layer for layer; the angle
branches are two 3x3 Convs of max(channels/4, 1) and a 1x1 to one value
(always plain Convs, also where the class branches are depthwise). OBB
(YOLOv8, YOLO11) maps that value to (sigmoid - 1/4) * pi, an angle in
[-pi/4, 3pi/4); OBB26 (YOLO26) takes it as the angle in radians, unbounded,
and has one-to-one copies of all three branches for NMS-free inference."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from .blocks import branch
from .detector import MAX_DET, STRIDES, Detect, DetectionModel, dfl_expectation
from .boxes import make_anchors
from .rboxes import dist2rbox

ANGLES = 1  # values per anchor the angle branch predicts (ultralytics' ne)


class OBBHead(Detect):
    """Detect's branches, and an angle branch per level (`angle`, with its
    one-to-one copy on an end2end head). `raw_angle`: OBB26's, the branch's
    output is the angle itself."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int, strides: tuple[int, ...] = STRIDES,
                 depthwise_cls: bool = False, one2one: bool = False, raw_angle: bool = False):
        super().__init__(nc, channels, reg_max, strides, depthwise_cls=depthwise_cls, one2one=one2one)
        hidden = max(channels[0] // 4, ANGLES)
        self.angle = nn.ModuleList(branch(c, hidden, ANGLES) for c in channels)
        self.raw_angle = raw_angle
        if one2one:
            self.one2one_angle = copy.deepcopy(self.angle)

    def angles(self, feats: list[torch.Tensor], one2one: bool = False) -> list[torch.Tensor]:
        """Per level [B, 1, H, W]: each anchor's angle in radians."""
        logits = [m(x) for x, m in zip(feats, self.one2one_angle if one2one else self.angle)]
        if self.raw_angle:
            return logits
        # OBB (YOLOv8, YOLO11): bounded to [-pi/4, 3pi/4), where its corners-to-xywhr labels fold theirs
        return [(t.sigmoid() - 0.25) * math.pi for t in logits]


class OBBModel(DetectionModel):
    """A detector of rotated boxes. forward gives (the detector's maps, the
    angles per level); YOLO26's, ((those), (the one-to-one head's maps and
    angles)), the one-to-one branches on detached features."""

    task = "obb"

    def make_head(self, spec, nc: int) -> OBBHead:
        return OBBHead(nc, self.neck.out_channels, self.reg_max, STRIDES, depthwise_cls=spec.DEPTHWISE_CLS,
                       one2one=spec.END2END, raw_angle=spec.END2END)

    def forward(self, x: torch.Tensor):
        """(maps, angles): what OBBLoss trains on; an end2end model's come
        with the one-to-one head's (maps, angles), on detached features, what
        EndToEndOBBLoss trains on."""
        feats = self.neck(self.backbone(x))
        out = self.head(feats), self.head.angles(feats)
        if not self.end2end:
            return out
        detached = [f.detach() for f in feats]
        return out, (self.head.one2one(detached), self.head.angles(detached, one2one=True))

    def decode(self, feats: list[torch.Tensor], angles: list[torch.Tensor]) -> torch.Tensor:
        """Raw maps and angles -> [B, 4 + nc + 1, A]: (cx, cy, w, h) in input
        pixels, sigmoid class scores, the angle in radians (ultralytics'
        eval-mode OBB output)."""
        flat = torch.cat([f.flatten(2) for f in feats], dim=2)
        box_logits, cls_logits = flat.split((4 * self.reg_max, self.nc), dim=1)
        angle = torch.cat([a.flatten(2) for a in angles], dim=2)  # [B, 1, A]
        dist = dfl_expectation(box_logits, self.reg_max) if self.reg_max > 1 else box_logits
        points, strides = make_anchors(feats, STRIDES, 0.5)
        boxes = dist2rbox(dist, angle, points.transpose(0, 1)[None], dim=1) * strides.transpose(0, 1)[None]
        return torch.cat([boxes, cls_logits.sigmoid(), angle], dim=1)

    def decode_end2end(self, feats: list[torch.Tensor], angles: list[torch.Tensor],
                       max_det: int = MAX_DET) -> torch.Tensor:
        """The one-to-one maps and angles -> [B, max_det, 7]: (cx, cy, w, h)
        in input pixels, score, class, angle: the max_det best over anchors x
        classes, as DetectionModel.decode_end2end picks them (ultralytics'
        end2end OBB output keeps xywh, the angle last)."""
        decoded = self.decode(feats, angles).transpose(1, 2)
        boxes, scores, angle = decoded.split((4, self.nc, 1), dim=-1)
        k = min(max_det, boxes.shape[1])
        best = scores.amax(dim=-1).topk(k).indices.unsqueeze(-1)
        boxes, angle = boxes.gather(1, best.expand(-1, -1, 4)), angle.gather(1, best)
        scores = scores.gather(1, best.expand(-1, -1, self.nc))
        top, pair = scores.flatten(1).topk(k)
        rows = torch.arange(boxes.shape[0], device=boxes.device).unsqueeze(-1)
        anchor = pair // self.nc
        return torch.cat([boxes[rows, anchor], top.unsqueeze(-1), (pair % self.nc).unsqueeze(-1).to(top),
                          angle[rows, anchor]], dim=-1)

    def predict(self, x: torch.Tensor, end2end: bool = False) -> torch.Tensor:
        """[B, 4 + nc + 1, A] from the one-to-many head (before NMS); with
        `end2end` (YOLO26), [B, 300, 7] from the one-to-one head."""
        feats = self.neck(self.backbone(x))
        if end2end:
            return self.decode_end2end(self.head.one2one(feats), self.head.angles(feats, one2one=True))
        return self.decode(self.head(feats), self.head.angles(feats))


def build_model(scale: str, nc: int) -> OBBModel:
    """A freshly initialised oriented-box detector (yolov8n ... yolo26x) for nc classes."""
    return OBBModel(nc=nc, scale=scale)
