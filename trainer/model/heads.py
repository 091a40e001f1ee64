"""How each task's head sits in an ultralytics checkpoint: one `HeadMap` per
head hpcyolo builds, in HEADS by task (common/registry.py's TASKS).

model/weights.py maps an ultralytics checkpoint's backbone and neck by the
family's ULTRALYTICS_LAYERS and its last layer, the head, by the HeadMap of
the checkpoint's task: the head's module class, its child modules' names,
the children whose tensors hpcyolo computes rather than loads (checked to
hold what it computes), and the head's records that its tensors do not show.
A task with a new head adds its HeadMap here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from ..common.errors import HpcyoloError
from .detector import REG_MAX


@dataclass(frozen=True)
class HeadMap:
    kind: str  # ultralytics' head class: "Detect"
    branches: Mapping[str, str] = field(default_factory=dict)  # its children's names -> ours (others keep theirs)
    # children hpcyolo computes rather than stores -> the check of the stored tensor (value, name, path)
    computed: Mapping[str, Callable[[torch.Tensor, str, str], None]] = field(default_factory=dict)
    # (the head module's pickled state, our whole model) -> (what, theirs, ours) for each option it records
    records: Callable[[dict, object], Iterable[tuple[str, object, object]]] = lambda state, ours: ()


def check_dfl(value: torch.Tensor, name: str, path: str) -> None:
    """The DFL's 1x1 conv holds the fixed bins 0..reg_max-1; ours computes them."""
    if value.numel() != REG_MAX or not torch.equal(value.float().flatten(), torch.arange(REG_MAX).float()):
        raise HpcyoloError(f"{path}: {name} is not the fixed DFL bins 0..{REG_MAX - 1}")


def detect_records(state: dict, ours) -> list[tuple[str, object, object]]:
    """The Detect head's options that its tensors do not show."""
    children = state.get("_modules") or {}
    return [("box regression bins (reg_max)", state.get("reg_max"), ours.reg_max),
            ("an end-to-end head (end2end)", "one2one_cv2" in children, ours.end2end)]


# ultralytics' Detect: cv2/cv3 (and YOLO26's one2one_ copies) are our box/cls branches; its DFL is computed
DETECT = HeadMap(kind="Detect",
                 branches={"cv2": "box", "cv3": "cls", "one2one_cv2": "one2one_box", "one2one_cv3": "one2one_cls"},
                 computed={"dfl": check_dfl}, records=detect_records)

HEADS = {"detect": DETECT}
