"""How each task's model sits in an ultralytics checkpoint: one `HeadMap` per
head hpcyolo builds, in HEADS by task (ultralytics' task names).

model/weights.py maps an ultralytics checkpoint's layers by the HeadMap of
the checkpoint's task: our module for each of ultralytics' layer indices
(`layers`: a detector's and a segmenter's are the family's
ULTRALYTICS_LAYERS, a classifier's its body in order, then the head), the
head's module classes, its child modules' names, the children whose tensors
hpcyolo computes rather than loads (checked to hold what it computes), and
the head's records that its tensors do not show. A task with a new head
adds its HeadMap here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from ..common.errors import HpcyoloError
from . import families
from .detector import REG_MAX
from .pose import RealNVP


def detector_layers(family: str) -> tuple[str | None, ...]:
    """Ultralytics' layer indices of a detector (and a segmenter) -> our modules: the family's table."""
    return families.load(family).ULTRALYTICS_LAYERS


def classifier_layers(family: str) -> tuple[str | None, ...]:
    """A classifier's: its body's layers in order (ClassificationModel.body), then the head."""
    return (*(f"body.{i}" for i in range(families.load(family).CLASSIFY_LAYERS)), "head")


@dataclass(frozen=True)
class HeadMap:
    kinds: tuple[str, ...]  # ultralytics' head classes: ("Detect",)
    layers: Callable[[str], tuple[str | None, ...]] = detector_layers  # family -> our module per layer index
    branches: Mapping[str, str] = field(default_factory=dict)  # its children's names -> ours (others keep theirs)
    # children (or their tensors: "flow_model.loc") hpcyolo computes rather than stores -> the check of the
    # stored tensor (value, name, path)
    computed: Mapping[str, Callable[[torch.Tensor, str, str], None]] = field(default_factory=dict)
    # (the head module's pickled state, our whole model) -> (what, theirs, ours) for each option it records
    records: Callable[[dict, object], Iterable[tuple[str, object, object]]] = lambda state, ours: ()
    # where `kinds` name variants that compute differently: our whole model -> the kind it computes as
    kind_of: Callable[[object], str] | None = None


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
DETECT_BRANCHES = {"cv2": "box", "cv3": "cls", "one2one_cv2": "one2one_box", "one2one_cv3": "one2one_cls"}
DETECT = HeadMap(kinds=("Detect",), branches=DETECT_BRANCHES, computed={"dfl": check_dfl}, records=detect_records)
# Segment (Segment26 on YOLO26): Detect's, with cv4 (and one2one_cv4) our mask-coefficient branches;
# its Proto (Proto26) keeps ultralytics' names
SEGMENT = HeadMap(kinds=("Segment", "Segment26"),
                  branches={**DETECT_BRANCHES, "cv4": "mask", "one2one_cv4": "one2one_mask"},
                  computed={"dfl": check_dfl}, records=detect_records)


def check_constant(expected: Callable[[], torch.Tensor]) -> Callable[[torch.Tensor, str, str], None]:
    """The check of a stored tensor that hpcyolo computes as `expected()`."""
    def check(value: torch.Tensor, name: str, path: str) -> None:
        want = expected()
        if value.shape != want.shape or not torch.equal(value.float(), want):
            raise HpcyoloError(f"{path}: {name} is not the constant {want.tolist()} hpcyolo computes")
    return check


# Pose (Pose26 on YOLO26): Detect's, with cv4 our keypoint branches; Pose26's cv4 is their shared Convs, cv4_kpts
# and cv4_sigma the 1x1s after them, flow_model the loss's RealNVP, whose loc, cov (no longer read by ultralytics
# 8.4: a standard normal prior) and coupling masks are constants
POSE = HeadMap(kinds=("Pose", "Pose26"),
               branches={**DETECT_BRANCHES, "cv4": "kpt", "one2one_cv4": "one2one_kpt", "cv4_kpts": "kpt_out",
                         "one2one_cv4_kpts": "one2one_kpt_out", "cv4_sigma": "kpt_sigma",
                         "one2one_cv4_sigma": "one2one_kpt_sigma", "flow_model": "flow"},
               computed={"dfl": check_dfl, "flow_model.loc": check_constant(lambda: torch.zeros(2)),
                         "flow_model.cov": check_constant(lambda: torch.eye(2)),
                         "flow_model.mask": check_constant(lambda: torch.tensor(RealNVP.MASKS))},
               records=detect_records)
# Classify: conv, pool, drop, linear under their own names (`conv` is a Conv module here, not a Conv's layer)
CLASSIFY = HeadMap(kinds=("Classify",), layers=classifier_layers, branches={"conv": "conv"})


def obb_records(state: dict, ours) -> list[tuple[str, object, object]]:
    """The OBB head's: Detect's, and the values its angle branches predict per anchor (ne)."""
    from .obb import ANGLES

    return [*detect_records(state, ours), ("angle values per anchor (ne)", state.get("ne"), ANGLES)]


# OBB (OBB26 on YOLO26): Detect's, with cv4 (and one2one_cv4) our angle branches; OBB bounds the angle
# ((sigmoid - 1/4) pi), OBB26 takes the branch's output as it is: the class says which
OBB = HeadMap(kinds=("OBB", "OBB26"), branches={**DETECT_BRANCHES, "cv4": "angle", "one2one_cv4": "one2one_angle"},
              computed={"dfl": check_dfl}, records=obb_records,
              kind_of=lambda ours: "OBB26" if ours.head.raw_angle else "OBB")

HEADS = {"detect": DETECT, "segment": SEGMENT, "classify": CLASSIFY, "obb": OBB, "pose": POSE}
