"""YOLO26 (ultralytics' cfg/models/26/yolo26.yaml, ultralytics' default
family since 8.4): YOLO11's layer table and sizes, with SPPF's first Conv
without activation and a residual add, C3k blocks in every C3k2 of the neck
and attention in its last, a head that regresses the four distances directly
(reg_max 1, no DFL; a narrower box branch), and a second, one-to-one copy of
the box and class branches (end2end) for NMS-free inference. Everything
hpcyolo knows of the family: its sizes, its body, its ultralytics layer map
and its published parameter counts."""

from __future__ import annotations

from hpcyolo_trainer.common import registry
from torch import nn

from ..blocks import C2PSA, SPPF, Backbone, Conv, Neck, Scaler, c3k2
from . import yolo11

# YOLO11's sizes (depth multiple, width multiple, max channels) and its 24
# layers in the same places: the same table by which checkpoints load.
SCALES = yolo11.SCALES
ULTRALYTICS_LAYERS = yolo11.ULTRALYTICS_LAYERS
DEPTHWISE_CLS = True  # the head's class branches: depthwise then pointwise
REG_MAX = 1  # box regression: the four distances themselves
END2END = True  # a one-to-one copy of the head's branches beside the one-to-many ones
# Parameters at nc=80, both heads, as ultralytics 8.4.190 builds yolo26X.yaml
# for training (sum(p.numel()) of its DetectionModel; the reference fixtures'
# README, ../shared/fixtures/ultralytics, lists them).
PUBLISHED_PARAMETERS = registry.PUBLISHED_PARAMETERS["yolo26"]


def body(w: Scaler, d: Scaler, scale: str) -> tuple[Backbone, Neck]:
    """YOLO26's published layer table (yolo26.yaml), layers 0-22. As in YOLO11,
    the m, l and x sizes use C3k blocks in the backbone's first two C3k2."""
    big = scale in "mlx"
    backbone = Backbone(
        nn.Sequential(Conv(3, w(64), 3, 2), Conv(w(64), w(128), 3, 2), c3k2(w(128), w(256), d(2), big, e=0.25)),
        nn.Sequential(Conv(w(256), w(256), 3, 2), c3k2(w(256), w(512), d(2), big, e=0.25)),
        nn.Sequential(Conv(w(512), w(512), 3, 2), c3k2(w(512), w(512), d(2), True)),
        nn.Sequential(Conv(w(512), w(1024), 3, 2), c3k2(w(1024), w(1024), d(2), True),
                      SPPF(w(1024), w(1024), 5, n=3, shortcut=True, act=False), C2PSA(w(1024), d(2))))
    neck = Neck(c3k2(w(1024) + w(512), w(512), d(2), True), c3k2(w(512) + w(512), w(256), d(2), True),
                Conv(w(256), w(256), 3, 2), c3k2(w(256) + w(512), w(512), d(2), True),
                Conv(w(512), w(512), 3, 2), c3k2(w(512) + w(1024), w(1024), d(1), True, attn=True),
                (w(256), w(512), w(1024)))
    return backbone, neck


# yolo26-cls.yaml is yolo11-cls.yaml's table, layer for layer (SPPF's YOLO26
# variant and the neck's attention are the detector's only).
CLASSIFY_SCALES = yolo11.CLASSIFY_SCALES
CLASSIFY_LAYERS = yolo11.CLASSIFY_LAYERS
classify_body = yolo11.classify_body
