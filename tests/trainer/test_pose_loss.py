"""The keypoint loss against ultralytics' v8PoseLoss on the same inputs
(tests/reference/ultralytics/loss.json `pose`, written by
benchmarks/ultralytics_reference.py from seeded inputs it rebuilds here):
COCO's [17, 3] with its OKS sigmas, [5, 3] and [4, 2] with 1/K sigmas,
keypoints visible, occluded and unlabelled; every item within 1e-5."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO

from hpcyolo_trainer.optim.pose_loss import PoseLoss, keypoint_sigmas

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "loss.json").read_text())["pose"]


def reference_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ultralytics_reference", REPO / "benchmarks" /
                                                  "ultralytics_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_maps(flat: torch.Tensor, hw: tuple[int, int], strides=(8, 16, 32)) -> list[torch.Tensor]:
    """[B, C, anchors] as ultralytics flattens the levels -> per level [B, C, H, W]."""
    sizes = [(hw[0] // s, hw[1] // s) for s in strides]
    parts = flat.split([h * w for h, w in sizes], dim=2)
    return [p.reshape(*flat.shape[:2], h, w) for p, (h, w) in zip(parts, sizes)]


@pytest.mark.parametrize("case", ["coco17", "five-with-visibility", "four-without"])
def test_pose_loss_equals_ultralytics(case):
    script = reference_script()
    ref = REFERENCE[case]
    x = script.pose_loss_inputs(case)
    kpt_shape = tuple(ref["kpt_shape"])
    assert keypoint_sigmas(kpt_shape).tolist() == pytest.approx(ref["sigmas"], rel=1e-6)
    hw = script.LOSS_HW
    maps = as_maps(torch.cat([x["boxes"], x["scores"]], 1), hw)
    kpts = as_maps(x["kpts"], hw)
    targets = torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1)
    hyp = ref["hyp"]
    # ultralytics 8.4's assignment, as the detect and segment tasks make it: STAL (16 px) and CIoU alignment
    loss_fn = PoseLoss(3, strides=script.LOSS_STRIDES, kpt_shape=kpt_shape, min_side=16, assign_ciou=True,
                       box=hyp["box"], cls=hyp["cls"], dfl=hyp["dfl"], pose=hyp["pose"], kobj=hyp["kobj"])
    loss, items = loss_fn((maps, kpts), targets, x["keypoints"])
    theirs = ref["items"]
    assert loss_fn.names == tuple(theirs)
    worst = 0.0
    for name, ours in zip(loss_fn.names, items.tolist()):
        assert ours == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), name
        worst = max(worst, abs(ours - theirs[name]) / max(abs(theirs[name]), 1e-12))
    assert float(loss) == pytest.approx(ref["total"], rel=1e-5)
    print(f"{case}: max relative difference of the items {worst:.1e}")
    if kpt_shape[1] == 3:  # a case with visibility: the terms are not zero
        assert theirs["pose_loss"] > 0 and theirs["kobj_loss"] > 0


def test_pose_loss_without_objects_is_zero_and_reaches_every_keypoint_output():
    """An empty batch: zero keypoint terms, still attached to the keypoint maps (DDP)."""
    torch.manual_seed(0)
    maps = [torch.randn(1, 64 + 2, s, s, requires_grad=True) for s in (8, 4, 2)]
    kpts = [torch.randn(1, 5 * 3, s, s, requires_grad=True) for s in (8, 4, 2)]
    loss, items = PoseLoss(2, kpt_shape=(5, 3))((maps, kpts), torch.zeros(0, 6), torch.zeros(0, 5, 3))
    loss.backward()
    assert items[1] == 0 and items[2] == 0
    assert all(k.grad is not None for k in kpts)
