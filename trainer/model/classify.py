"""The image classifier of each family (ultralytics' `*-cls` models): the
family's classification backbone (families/: `classify_body`, its own sizes
CLASSIFY_SCALES) and one head that pools it to class logits.

Written from ultralytics' published layer tables (yolov8-cls.yaml,
yolo11-cls.yaml, yolo26-cls.yaml) and the head's description: a 1x1 Conv to
1280 channels (EfficientNet-B0's width), global average pooling, dropout, one
linear layer. Training reads the logits, inference the softmax."""

from __future__ import annotations

import torch
from torch import nn

from .blocks import Conv, scale_depth, scale_width
from .detector import model_family

HIDDEN = 1280  # the head's width before the linear layer, whatever the backbone's


class Classify(nn.Module):
    """Conv 1x1 -> global average pool -> dropout -> linear: [B, C, H, W] to [B, nc] logits."""

    def __init__(self, c_in: int, nc: int, dropout: float = 0.0):
        super().__init__()
        self.conv = Conv(c_in, HIDDEN, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(p=dropout)
        self.linear = nn.Linear(HIDDEN, nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.drop(self.pool(self.conv(x)).flatten(1)))


class ClassificationModel(nn.Module):
    """A classifier of any family: `body` is ultralytics' layers 0..N-1 in
    order, `head` its layer N. forward gives logits (what the loss trains
    on), predict the class probabilities."""

    task = "classify"

    def __init__(self, nc: int, scale: str = "n", dropout: float = 0.0):
        super().__init__()
        family, size, spec = model_family(scale, nc)
        depth, width, max_channels = spec.CLASSIFY_SCALES[size]
        self.nc, self.scale, self.family, self.arch = nc, scale, family, family + size
        layers = spec.classify_body(lambda c: scale_width(c, width, max_channels), lambda n: scale_depth(n, depth), size)
        self.body = nn.Sequential(*layers)
        self.head = Classify(scale_width(1024, width, max_channels), nc, dropout)
        # Ultralytics' classifiers keep torch's BatchNorm settings (eps 1e-5, momentum 0.1), not the
        # detectors' (1e-3, 0.03): its ClassificationModel does not re-initialise them.
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = 1e-5, 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """[B, nc] class probabilities (softmax over the logits)."""
        return self.forward(x).softmax(dim=1)


def build_classifier(scale: str, nc: int, dropout: float = 0.0) -> ClassificationModel:
    """A freshly initialised classifier (yolov8n ... yolo26x, as `*-cls`) for nc classes."""
    return ClassificationModel(nc=nc, scale=scale, dropout=dropout)
