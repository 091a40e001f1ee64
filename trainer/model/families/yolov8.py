"""YOLOv8 (ultralytics' cfg/models/v8/yolov8.yaml): C2f blocks, SPPF, a
decoupled head with plain class branches. Everything hpcyolo knows of the
family: its sizes, its body, its ultralytics layer map and its published
parameter counts."""

from __future__ import annotations

from hpcyolo_trainer.common import registry
from torch import nn

from ..blocks import SPPF, Backbone, C2f, Conv, Neck, Scaler

# Scale -> (depth multiple, width multiple, max channels), as published.
SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768), "l": (1.00, 1.00, 512),
          "x": (1.00, 1.25, 512)}
DEPTHWISE_CLS = False  # the head's class branches: plain 3x3 convolutions
REG_MAX = 16  # box regression: a distribution over 16 bins per side (DFL)
END2END = False  # one head, NMS after it
# Our module for each layer index of ultralytics' published table (None:
# upsample and concat layers, which hold no tensors): how its checkpoints load.
# yolov8.yaml: 0-9 backbone, 10 upsample, 11 concat, 12 C2f, 13 upsample,
# 14 concat, 15 C2f, 16 Conv, 17 concat, 18 C2f, 19 Conv, 20 concat, 21 C2f, 22 Detect.
ULTRALYTICS_LAYERS = ("backbone.stem.0", "backbone.stem.1", "backbone.stem.2", "backbone.stage3.0",
                      "backbone.stage3.1", "backbone.stage4.0", "backbone.stage4.1", "backbone.stage5.0",
                      "backbone.stage5.1", "backbone.stage5.2", None, None, "neck.td4", None, None, "neck.td3",
                      "neck.down3", None, "neck.bu4", "neck.down4", None, "neck.bu5", "head")
# Parameters at nc=80 as ultralytics prints them (the "summary" beside each
# scale in its YAML; the docs round them: 3.2/11.2/25.9/43.7/68.2 M).
PUBLISHED_PARAMETERS = registry.PUBLISHED_PARAMETERS["yolov8"]


def body(w: Scaler, d: Scaler, scale: str) -> tuple[Backbone, Neck]:
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


# yolov8-cls.yaml: its own sizes (m, l and x wider than the detector's, all up to 1024 channels).
CLASSIFY_SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 1024),
                   "l": (1.00, 1.00, 1024), "x": (1.00, 1.25, 1024)}

CLASSIFY_LAYERS = 9  # ultralytics' layer indices before the Classify head


def classify_body(w: Scaler, d: Scaler, scale: str) -> list[nn.Module]:
    """yolov8-cls.yaml's layers 0-8: the detector's backbone without SPPF."""
    return [Conv(3, w(64), 3, 2), Conv(w(64), w(128), 3, 2), C2f(w(128), w(128), d(3), shortcut=True),
            Conv(w(128), w(256), 3, 2), C2f(w(256), w(256), d(6), True),
            Conv(w(256), w(512), 3, 2), C2f(w(512), w(512), d(6), True),
            Conv(w(512), w(1024), 3, 2), C2f(w(1024), w(1024), d(3), True)]
