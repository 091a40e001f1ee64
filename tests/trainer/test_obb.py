"""The oriented-box (OBB) model against ultralytics' own: ultralytics' OBBModel
of each family (yolov8n-obb, yolo11n-obb, yolo26n-obb at 3 classes), every
tensor set from its name (benchmarks/ultralytics_reference.py `fill`) and
evaluated on a fixed input there (tests/reference/ultralytics/forward/
MODEL-obb.pt); the same tensors renamed as an OBB checkpoint is read
(model/heads.py's OBB map) give the same raw maps and the same decoded
rotated boxes here."""

from __future__ import annotations

import math

import pytest
import torch
from test_task_models import reference_model

from hpcyolo_trainer.model.obb import OBBModel

FAMILIES = ["yolov8n", "yolo11n", "yolo26n"]


def relative(ours: torch.Tensor, reference: torch.Tensor, dim: int = 1) -> float:
    """The largest difference over the reference's largest magnitude (at least 1), each
    channel (along `dim`) by its own: an angle's radians beside boxes of many pixels."""
    assert ours.shape == reference.shape
    others = tuple(d for d in range(reference.dim()) if d != dim % reference.dim())
    scale = reference.abs().amax(dim=others).clamp(min=1.0)
    return ((ours - reference).abs().amax(dim=others) / scale).max().item()


@pytest.mark.parametrize("name", FAMILIES)
def test_ultralytics_obb_weights_mapped_by_name_give_ultralytics_outputs(name, one_thread):
    """The neck, every branch's raw maps (the angle branch's before the head
    maps it), the eval-mode output (cx, cy, w, h px, class scores, angle) and
    YOLO26's NMS-free picks (cx, cy, w, h, score, class, angle), within 1e-4
    relative."""
    model, ref, x = reference_model(name, "obb")
    worst = {}
    with torch.no_grad():
        feats = model.neck(model.backbone(x))
        worst["neck"] = max(relative(o, r) for o, r in zip(feats, ref["feats"]))
        branches = {"box": model.head.box, "cls": model.head.cls, "angle": model.head.angle}
        if model.end2end:
            branches.update(one2one_box=model.head.one2one_box, one2one_cls=model.head.one2one_cls,
                            one2one_angle=model.head.one2one_angle)
        assert sorted(branches) == sorted(k for k in ref if k in ("box", "cls", "angle") or k.startswith("one2one"))
        for key, modules in branches.items():
            worst[key] = max(relative(m(f), r) for m, f, r in zip(modules, feats, ref[key]))
        decoded = model.predict(x)
        assert decoded.shape == ref["decoded"].shape == (2, 4 + 3 + 1, 8 * 12 + 4 * 6 + 2 * 3)
        worst["decoded"] = relative(decoded, ref["decoded"])
        if model.end2end:
            picks = model.predict(x, end2end=True)
            assert picks.shape == ref["end2end"].shape
            worst["end2end"] = relative(picks, ref["end2end"], dim=-1)
        else:
            assert "end2end" not in ref
    print(name, {k: f"{v:.1e}" for k, v in worst.items()})
    assert max(worst.values()) <= 1e-4, worst


@pytest.mark.parametrize("name", FAMILIES)
def test_forward_gives_what_the_loss_trains_on(name, one_thread):
    """(maps, angles) per level; YOLO26's with the one-to-one head's, whose
    features are detached. YOLOv8's and YOLO11's angles lie in
    [-pi/4, 3pi/4) (a sigmoid mapped there); YOLO26's are the branch's raw
    output."""
    torch.manual_seed(0)
    model = OBBModel(3, name)
    x = torch.rand(2, 3, 64, 96)
    out = model(x)
    (maps, angles), one2one = (out if model.end2end else (out, None))
    assert [tuple(m.shape) for m in maps] == [(2, 4 * model.reg_max + 3, h, w) for h, w in ((8, 12), (4, 6), (2, 3))]
    assert [tuple(a.shape) for a in angles] == [(2, 1, h, w) for h, w in ((8, 12), (4, 6), (2, 3))]
    feats = model.neck(model.backbone(x))
    raw = [m(f) for m, f in zip(model.head.angle, feats)]
    if model.end2end:
        assert all(torch.allclose(a, r, atol=1e-6) for a, r in zip(angles, raw))
        (o2o_maps, o2o_angles) = one2one
        assert [m.shape for m in o2o_maps] == [m.shape for m in maps]
        o2o_maps[0].sum().backward()
        assert all(p.grad is None for p in model.backbone.parameters())  # detached from the body
        assert any(p.grad is not None for p in model.head.one2one_box.parameters())
    else:
        assert all(torch.allclose(a, (r.sigmoid() - 0.25) * math.pi, atol=1e-6) for a, r in zip(angles, raw))
        assert all(bool(((a >= -math.pi / 4) & (a <= 3 * math.pi / 4)).all()) for a in angles)
