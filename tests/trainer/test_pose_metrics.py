"""Keypoint metrics against ultralytics' own pose validator: the predictions
benchmarks/ultralytics_reference.py `pose_metric_inputs` draws from a seed
(COCO's 17 keypoints, labelled, occluded and unlabelled; jittered objects,
weaker duplicates, wrong classes, false positives), their OKS (its kpt_iou),
matched by box IoU and by OKS with ultralytics 8.4's match_predictions and
scored by its ap_per_class; its figures in
tests/reference/ultralytics/metrics.json `pose`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import REPO
from test_task_models import reference_script

from hpcyolo_trainer.eval.pose_metrics import AREA_SCALE, PoseStats, keypoint_similarity
from hpcyolo_trainer.model.pose import keypoint_sigmas

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "metrics.json").read_text())["pose"]


def tensors(image: dict):
    def stack(key, shape):
        return torch.tensor(np.stack(image[key]), dtype=torch.float32) if image[key] else torch.zeros(shape)

    pred = torch.cat([stack("pred_boxes", (0, 4)), torch.tensor(image["conf"]).reshape(-1, 1),
                      torch.tensor(image["pred_cls"], dtype=torch.float32).reshape(-1, 1)], 1)
    return pred, stack("pred_kpts", (0, 17, 3)), stack("gt_boxes", (0, 4)), torch.tensor(image["gt_cls"]), \
        stack("gt_kpts", (0, 17, 3))


def test_keypoint_similarity_equals_ultralytics_kpt_iou():
    script = reference_script()
    sigmas = keypoint_sigmas(REFERENCE["kpt_shape"])
    worst = 0.0
    for image, theirs in zip(script.pose_metric_inputs(), REFERENCE["oks"]):
        pred, pred_kpts, gt_boxes, _, gt_kpts = tensors(image)
        if not len(pred):
            assert theirs == []
            continue
        area = (gt_boxes[:, 2] - gt_boxes[:, 0]) * (gt_boxes[:, 3] - gt_boxes[:, 1]) * AREA_SCALE
        ours, theirs = keypoint_similarity(gt_kpts, pred_kpts, area, sigmas), torch.tensor(theirs)
        assert ours.shape == theirs.shape
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-7)
        worst = max(worst, (ours - theirs).abs().max().item())
    assert 0 < max(max(row) for rows in REFERENCE["oks"] for row in rows) < 1  # similarities that tell apart
    print(f"OKS: max absolute difference {worst:.1e}")


def test_box_and_pose_metrics_equal_ultralytics():
    script = reference_script()
    stats = PoseStats(keypoint_sigmas(REFERENCE["kpt_shape"]), method="ultralytics")
    for image in script.pose_metric_inputs():
        stats.update(*tensors(image))
    state = PoseStats.merge([stats.state()])
    assert state["boxes"]["tp"].astype(int).tolist() == REFERENCE["box"]["tp"]
    assert state["keypoints"]["tp"].astype(int).tolist() == REFERENCE["pose"]["tp"]
    summary = PoseStats.summary(state, 3, method="ultralytics")
    for key in ("map50", "map50_95", "precision", "recall"):
        assert summary[key] == pytest.approx(REFERENCE["box"][key], abs=1e-6), key
        assert summary[f"{key}_pose"] == pytest.approx(REFERENCE["pose"][key], abs=1e-6), key
    assert PoseStats.fitness(summary) == pytest.approx(REFERENCE["fitness"], abs=1e-9)
    assert 0 < summary["map50_95_pose"] < summary["map50_95"]  # the keypoints match less well: told apart
