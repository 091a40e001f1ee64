"""The model families, one module each (yolov8.py, yolo11.py): the sizes
(SCALES), `body(w, d, scale)` -> (Backbone, Neck), the head's variant
(DEPTHWISE_CLS), the layer map of ultralytics' checkpoints
(ULTRALYTICS_LAYERS), the published parameter counts, and the classifier's
sizes and layers (CLASSIFY_SCALES, `classify_body(w, d, scale)`, ultralytics'
`*-cls` tables). Their names are in
hpcyolo_trainer.common.registry (no torch); adding a family is its module here and
its name there."""

from __future__ import annotations

import importlib
from types import ModuleType


def load(family: str) -> ModuleType:
    """The module of a family named in registry.FAMILIES."""
    return importlib.import_module(f"{__name__}.{family}")
