"""The segmentation loss against ultralytics' own v8SegmentationLoss: the
same head outputs, targets and masks (benchmarks/ultralytics_reference.py
`segment_loss_inputs`, from a seed), ultralytics' figures in
tests/reference/ultralytics/loss.json, written by that script in the
benchmark venv. Overlapping masks and one per object; masks at the
prototypes' resolution and at the input's (the prototypes upsampled)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO
from test_task_models import reference_script

from hpcyolo_trainer.optim.segment_loss import SegmentationLoss

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "loss.json").read_text())


def as_levels(flat: torch.Tensor, hw: tuple[int, int], strides) -> list[torch.Tensor]:
    """[B, C, anchors] as ultralytics flattens the levels -> per level [B, C, H, W]."""
    sizes = [(hw[0] // s, hw[1] // s) for s in strides]
    parts = flat.split([h * w for h, w in sizes], dim=2)
    return [p.reshape(*p.shape[:2], h, w) for p, (h, w) in zip(parts, sizes)]


@pytest.mark.parametrize("case", sorted(REFERENCE["segment"]))
def test_equals_ultralytics_segmentation_loss(case, one_thread):
    script = reference_script()
    x = script.segment_loss_inputs(case)
    expected = REFERENCE["segment"][case]
    hyp = expected["hyp"]
    loss_fn = SegmentationLoss(3, reg_max=16, strides=script.LOSS_STRIDES, overlap=x["overlap"], min_side=16,
                               assign_ciou=True, box=hyp["box"], cls=hyp["cls"], dfl=hyp["dfl"])
    maps = as_levels(torch.cat([x["boxes"], x["scores"]], 1), script.LOSS_HW, script.LOSS_STRIDES)
    coefficients = as_levels(x["coefficients"], script.LOSS_HW, script.LOSS_STRIDES)
    targets = torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1)
    total, items = loss_fn((maps, coefficients, x["proto"]), targets, x["masks"])
    theirs = expected["items"]
    ours = dict(zip(loss_fn.names, items.tolist()))
    assert loss_fn.names == ("box_loss", "seg_loss", "cls_loss", "dfl_loss", "sem_loss")
    for name, value in ours.items():
        assert value == pytest.approx(theirs[name], rel=1e-5), (name, ours, theirs)
    assert float(total) == pytest.approx(expected["total"], rel=1e-5)


def test_the_mask_term_is_zero_but_attached_without_a_foreground(one_thread):
    """No object in the batch: no mask loss, yet a gradient (of zeros) for the
    coefficients and prototypes, as DDP needs for every parameter."""
    coefficients = [torch.randn(1, 32, 8, 12, requires_grad=True)]
    proto = torch.randn(1, 32, 16, 24, requires_grad=True)
    maps = [torch.randn(1, 64 + 3, 8, 12, requires_grad=True)]
    loss_fn = SegmentationLoss(3, strides=(8,))
    total, items = loss_fn(([maps[0]], coefficients, proto), torch.zeros(0, 6), torch.zeros(1, 16, 24))
    assert items[1] == 0
    total.backward()
    assert proto.grad is not None and coefficients[0].grad is not None and not proto.grad.any()
