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


def segment26_preds(x: dict, head: str, semantic: bool, script) -> tuple:
    """One head's outputs of `segment26_loss_inputs` as our model gives them: (maps, coefficients, proto, semantic)."""
    maps = as_levels(torch.cat([x[head]["boxes"], x[head]["scores"]], 1), script.LOSS_HW, script.LOSS_STRIDES)
    coefficients = as_levels(x[head]["coefficients"], script.LOSS_HW, script.LOSS_STRIDES)
    return maps, coefficients, x["proto"], x["semantic"] if semantic else None


def close_to(ours: dict, theirs: dict, what: str) -> float:
    """Asserts every item within 1e-5 relative of ultralytics'; returns the largest relative difference."""
    assert list(ours) == list(theirs), (what, list(ours), list(theirs))
    worst = 0.0
    for name, value in ours.items():
        assert value == pytest.approx(theirs[name], rel=1e-6, abs=1e-7 if theirs[name] == 0 else 0), \
            (what, name, ours, theirs)
        worst = max(worst, abs(value - theirs[name]) / abs(theirs[name]) if theirs[name] else 0.0)
    return worst


@pytest.mark.parametrize("case", sorted(REFERENCE["segment26"]))
def test_equals_ultralytics_yolo26_segmentation_loss(case, one_thread):
    """YOLO26's loss (ultralytics' SegmentLoss26 of each head, E2ELoss over
    both): the mask-aware assignment, the semantic map's term, the one-to-one
    head's items; in training (the semantic map) and in validation (none)."""
    from hpcyolo_trainer.optim.segment_loss import EndToEndSegmentationLoss

    script = reference_script()
    x = script.segment26_loss_inputs(case)
    expected = REFERENCE["segment26"][case]
    gains = expected["hyp"]
    targets = (torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1), x["masks"])
    common = dict(reg_max=1, strides=script.LOSS_STRIDES, overlap=x["overlap"], min_side=16, assign_ciou=True,
                  mask_aware=True, **gains)
    worst = {}
    for head, topk in (("one2many", dict(topk=10)), ("one2one", dict(topk=7, topk2=1))):
        loss_fn = SegmentationLoss(3, **topk, **common)
        total, items = loss_fn(segment26_preds(x, head, True, script), targets)
        worst[head] = close_to(dict(zip(loss_fn.names, items.tolist())), expected[head]["items"], head)
        assert float(total) == pytest.approx(expected[head]["total"], rel=1e-5)
    e2e = EndToEndSegmentationLoss(3, epochs=100, strides=script.LOSS_STRIDES, overlap=x["overlap"], **gains)
    assert e2e.names == ("box_loss", "seg_loss", "cls_loss", "l1_loss", "sem_loss")
    assert e2e.one2many_share == expected["end2end"]["one2many_share"]
    for key, semantic in (("end2end", True), ("validation", False)):
        preds = tuple(segment26_preds(x, head, semantic, script) for head in ("one2many", "one2one"))
        total, items = e2e(preds, targets)
        worst[key] = close_to(dict(zip(e2e.names, items.tolist())), expected[key]["items"], key)
        assert float(total) == pytest.approx(expected[key]["total"], rel=1e-5), key
        worst[f"{key} total"] = abs(float(total) / expected[key]["total"] - 1)
    assert expected["end2end"]["items"]["sem_loss"] > 0 and expected["validation"]["items"]["sem_loss"] == 0
    print(case, "max relative difference", worst)


def test_the_mask_aware_assignment_changes_what_is_learnt():
    """Not a no-op on the reference's inputs: without the masks' IoU the one-to-many head's figures differ."""
    script = reference_script()
    x = script.segment26_loss_inputs("overlap")
    targets = (torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1), x["masks"])
    preds = segment26_preds(x, "one2many", True, script)
    kwargs = dict(reg_max=1, strides=script.LOSS_STRIDES, min_side=16, assign_ciou=True, topk=10)
    _, aware = SegmentationLoss(3, mask_aware=True, **kwargs)(preds, targets)
    _, boxes_only = SegmentationLoss(3, **kwargs)(preds, targets)
    assert not torch.allclose(aware[:4], boxes_only[:4], rtol=1e-3) and torch.equal(aware[4], boxes_only[4])
