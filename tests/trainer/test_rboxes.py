"""Rotated-box geometry (model/rboxes.py) against ultralytics' own: its
probiou, batch_probiou, xywhr2xyxyxyxy, xyxyxyxy2xywhr, regularize_rboxes,
rbox2dist, dist2rbox and rotated NMS on the boxes
benchmarks/ultralytics_reference.py `rbox_inputs` makes from a seed, its
figures in tests/reference/ultralytics/rboxes.npz (written by that script's
`rboxes` in the benchmark venv)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import REPO
from test_task_models import reference_script

from hpcyolo_trainer.common.polygon import xyxyxyxy2xywhr
from hpcyolo_trainer.model import rboxes

REFERENCE = np.load(REPO / "tests" / "reference" / "ultralytics" / "rboxes.npz")


@pytest.fixture(scope="module")
def inputs():
    return reference_script().rbox_inputs()


def close(ours, name: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    theirs = REFERENCE[name]
    ours = np.asarray(ours)
    assert ours.shape == theirs.shape, name
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, err_msg=name)


def test_probiou_of_pairs_and_of_every_pair(inputs, one_thread):
    boxes, moved = inputs["boxes"], inputs["moved"]
    close(rboxes.probiou(boxes, moved), "probiou")
    close(rboxes.probiou(boxes, moved, floor=0.01), "probiou_floor")
    every = rboxes.batch_probiou(boxes, torch.cat([boxes, moved]))
    close(every, "batch_probiou")
    # the pairs overlap (most above 0.3) and a box with itself is 1: the comparison covers the whole range
    assert float(REFERENCE["probiou"].mean()) > 0.3 and np.allclose(np.diag(REFERENCE["batch_probiou"]), 1, atol=1e-3)


def test_corners_and_back(inputs, one_thread):
    boxes = inputs["boxes"]
    corners = rboxes.xywhr2xyxyxyxy(boxes)
    close(corners, "corners")
    close(xyxyxyxy2xywhr(corners.numpy()), "corners_xywhr", rtol=1e-4, atol=1e-4)
    close(xyxyxyxy2xywhr((corners[:20] + inputs["jitter"]).numpy()), "jittered_xywhr", rtol=1e-4, atol=1e-4)
    back = REFERENCE["corners_xywhr"]  # the canonical form: w the longer side, the angle in [-pi/4, 3pi/4)
    assert (back[:, 2] >= back[:, 3]).all()
    assert (back[:, 4] >= -math.pi / 4).all() and (back[:, 4] < 3 * math.pi / 4).all()


def test_regularize(inputs, one_thread):
    close(rboxes.regularize(inputs["boxes"]), "regularized")
    assert (REFERENCE["regularized"][:, 4] >= 0).all() and (REFERENCE["regularized"][:, 4] < math.pi / 2).all()


def test_distances_about_points_and_back(inputs, one_thread):
    boxes, points = inputs["boxes"], torch.from_numpy(REFERENCE["points"])
    ltrb = rboxes.rbox2dist(boxes[:, :4], points, boxes[:, 4:5])
    close(ltrb, "rbox2dist")
    close(rboxes.dist2rbox(ltrb, boxes[:, 4:5], points), "dist2rbox", atol=1e-4)


def test_fast_nms_keeps_what_ultralytics_keeps(inputs, one_thread):
    boxes = torch.cat([inputs["boxes"], inputs["moved"]])
    kept = rboxes.rotated_nms(boxes, torch.linspace(1, 0.01, 80), 0.3)
    assert kept.tolist() == REFERENCE["fast_nms"].tolist()
    assert 0 < len(kept) < len(boxes)  # some, not all, suppressed


@pytest.mark.parametrize("name, how", [("nms", {}), ("nms_agnostic", {"agnostic": True}),
                                       ("nms_multi_label", {"multi_label": True})])
def test_rotated_nms_of_a_decoded_output(inputs, name, how, one_thread):
    """Per image (cx, cy, w, h, conf, cls, angle), in ultralytics' order."""
    out = rboxes.non_max_suppression_obb(inputs["decoded"], conf_thres=0.25, iou_thres=0.5, **how)
    assert len(out) == 1
    close(out[0], name)


def test_rotated_matches_and_metrics_equal_ultralytics_obb_validator(one_thread):
    """The rotated predictions `obb_metric_inputs` draws from a seed (jittered
    and turned copies, weaker duplicates, wrong classes, false positives),
    matched by ProbIoU (eval/metrics.py match_rotated) and scored as
    ultralytics' OBB validator does (tests/reference/ultralytics/metrics.json, `obb`)."""
    import json

    from hpcyolo_trainer.eval.metrics import DetStats, match_rotated

    expected = json.loads((REPO / "tests" / "reference" / "ultralytics" / "metrics.json").read_text())["obb"]
    stats = DetStats(method="ultralytics")
    for image in reference_script().obb_metric_inputs():
        boxes = torch.tensor(image["pred_boxes"], dtype=torch.float32).reshape(-1, 5)
        pred = torch.cat([boxes[:, :4], torch.tensor([image["conf"], image["pred_cls"]], dtype=torch.float32).T
                          .reshape(-1, 2), boxes[:, 4:]], 1)
        gt_cls = torch.tensor(image["gt_cls"])
        stats.add(match_rotated(pred, torch.tensor(image["gt_boxes"], dtype=torch.float32), gt_cls, stats.method),
                  pred, gt_cls)
    state = DetStats.merge([stats.state()])
    assert state["tp"].astype(int).tolist() == expected["tp"]
    assert 0 < state["tp"].sum() < state["tp"].size  # matches at some thresholds, not all
    summary = DetStats.summary(state, 3, method="ultralytics")
    for key in ("map50", "map50_95", "precision", "recall"):
        assert summary[key] == pytest.approx(expected[key], abs=1e-6), key
