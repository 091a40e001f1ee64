"""YOLO11 (ultralytics' cfg/models/11/yolo11.yaml): C3k2 blocks, SPPF and
C2PSA attention, a head whose class branches are depthwise. Everything
hpcyolo knows of the family: its sizes, its body, its ultralytics layer map
and its published parameter counts."""

from __future__ import annotations

from hpcyolo_trainer.common import registry
from torch import nn

from ..blocks import C2PSA, SPPF, Backbone, Conv, Neck, Scaler, c3k2

# Scale -> (depth multiple, width multiple, max channels), as published.
SCALES = {"n": (0.50, 0.25, 1024), "s": (0.50, 0.50, 1024), "m": (0.50, 1.00, 512), "l": (1.00, 1.00, 512),
          "x": (1.00, 1.50, 512)}
DEPTHWISE_CLS = True  # the head's class branches: depthwise then pointwise
REG_MAX = 16  # box regression: a distribution over 16 bins per side (DFL)
END2END = False  # one head, NMS after it
# Our module for each layer index of ultralytics' published table (None:
# upsample and concat layers, which hold no tensors): how its checkpoints load.
# yolo11.yaml: as YOLOv8 with C3k2 for C2f, plus 10 C2PSA at the end of the backbone.
ULTRALYTICS_LAYERS = ("backbone.stem.0", "backbone.stem.1", "backbone.stem.2", "backbone.stage3.0",
                      "backbone.stage3.1", "backbone.stage4.0", "backbone.stage4.1", "backbone.stage5.0",
                      "backbone.stage5.1", "backbone.stage5.2", "backbone.stage5.3", None, None, "neck.td4", None,
                      None, "neck.td3", "neck.down3", None, "neck.bu4", "neck.down4", None, "neck.bu5", "head")
# Parameters at nc=80 as ultralytics prints them (the docs round them:
# 2.6/9.4/20.1/25.3/56.9 M).
PUBLISHED_PARAMETERS = registry.PUBLISHED_PARAMETERS["yolo11"]


def body(w: Scaler, d: Scaler, scale: str) -> tuple[Backbone, Neck]:
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


CLASSIFY_SCALES = SCALES  # yolo11-cls.yaml's sizes are the detector's

CLASSIFY_LAYERS = 10  # ultralytics' layer indices before the Classify head


def classify_body(w: Scaler, d: Scaler, scale: str) -> list[nn.Module]:
    """yolo11-cls.yaml's layers 0-9: the detector's backbone with C2PSA
    straight after the last C3k2 (no SPPF)."""
    big = scale in "mlx"
    return [Conv(3, w(64), 3, 2), Conv(w(64), w(128), 3, 2), c3k2(w(128), w(256), d(2), big, e=0.25),
            Conv(w(256), w(256), 3, 2), c3k2(w(256), w(512), d(2), big, e=0.25),
            Conv(w(512), w(512), 3, 2), c3k2(w(512), w(512), d(2), True),
            Conv(w(512), w(1024), 3, 2), c3k2(w(1024), w(1024), d(2), True), C2PSA(w(1024), d(2))]
