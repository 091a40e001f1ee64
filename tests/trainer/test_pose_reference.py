"""Keypoint models against ultralytics' own trained ones (the reference
script's trained-pose: yolo11n-pose and yolo26n-pose trained by ultralytics
8.4.190 on make-dataset shapes --task pose): `hpcyolo val` gives their boxes'
and keypoints' P, R, mAP50 and mAP50-95 within 0.005 on one rank and two;
`hpcyolo predict` finds every object ultralytics' predict found (same class,
box IoU >= 0.9, each keypoint it shows (confidence above 0.5) within 2 px);
YOLO26's NMS-free head (ultralytics' nms=False) likewise."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_segment import HPCYOLO, REFERENCE, gaps, predicted, trained_reference_set, val_argv
from test_yolo26_train import env

from hpcyolo.node.local import launch

MODELS = ("yolo11n-pose", "yolo26n-pose")  # ultralytics' own, trained on DATA
# The set the reference models were trained and validated on (their val.json says so).
DATA = "hpcyolo make-dataset shapes DIR --task pose --train 240 --val 40 --seed 3"


@pytest.fixture(scope="module")
def reference_set(tmp_path_factory) -> Path:
    return trained_reference_set(tmp_path_factory, "pose", MODELS, DATA)


def close(ours: dict, reference: dict) -> None:
    """The boxes' and the keypoints' figures within 0.005 of ultralytics'."""
    boxes, keypoints = gaps(ours, reference["box"]), gaps(ours["pose"], reference["pose"])
    print(boxes, keypoints)
    assert all(abs(a - b) <= 0.005 for a, b in [*boxes.values(), *keypoints.values()]), (boxes, keypoints)


@pytest.mark.parametrize("name", MODELS)
def test_val_of_ultralytics_pose_model_gives_its_figures_on_one_rank_and_two(reference_set, tmp_path, capfd, name):
    reference = json.loads((REFERENCE / name / "val.json").read_text())
    assert reference["pose"]["map50"] > 0.1  # a model that finds keypoints: the comparison means something
    args = val_argv(REFERENCE / name / "model.pt", reference_set)
    r = subprocess.run([*args, "--plots", str(tmp_path / "plots")], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    close(ours, reference)
    plots = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"BoxPR_curve.png", "PosePR_curve.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg"} <= plots
    if name != MODELS[0]:
        # Two ranks (evaluate.share_batches: every rank a share of the batches, rank 0 merging their stats in batch
        # order) is the task's path, not the model family's: the first model's two-rank launch shows it, the
        # second family's repeated it at a launch's cost.
        return
    capfd.readouterr()
    assert launch(args, 2, env=env()) == 0
    out = capfd.readouterr().out.strip().splitlines()
    assert len(out) == 1 and json.loads(out[0]) == ours


def box_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - ix * iy
    return ix * iy / union if union > 0 else 0.0


def finds(reference: list, ours: dict) -> int:
    """How many of ultralytics' objects (predict.json's) ours have,
    asserting each is there: the same class, box IoU >= 0.9, and each
    keypoint ultralytics shows (confidence above 0.5) within 2 px of ours."""
    found = 0
    for theirs in reference:
        mine = ours[theirs["image"]]["detections"]
        for obj in theirs["objects"]:
            same = [d for d in mine if d["class"] == obj["class"]]
            best = max(same, default=None, key=lambda d: box_iou(obj["box"], d["box_xyxy"]))
            assert best is not None and box_iou(obj["box"], best["box_xyxy"]) >= 0.9, (theirs["image"], obj, best)
            points, shown = np.array(obj["keypoints"]), np.array(obj["keypoints"])[:, 2] > 0.5
            gap = np.linalg.norm(np.array(best["keypoints"])[:, :2] - points[:, :2], axis=1)
            assert (gap[shown] <= 2.0).all(), (theirs["image"], obj, best)
            found += 1
    return found


@pytest.mark.parametrize("name", MODELS)
def test_predict_finds_ultralytics_objects_and_their_keypoints(reference_set, tmp_path, name):
    written = json.loads((REFERENCE / name / "predict.json").read_text())
    reference, conf = written["predictions"], str(written["conf"])
    images = reference_set.parent / "images" / "val"
    ours = predicted(REFERENCE / name / "model.pt", [images / p["image"] for p in reference], tmp_path, conf)
    assert finds(reference, ours) >= 3


def test_yolo26_pose_nms_free_gives_ultralytics_nms_false_val_and_predict(reference_set, tmp_path):
    trained = REFERENCE / "yolo26n-pose"
    reference = json.loads((trained / "end2end.json").read_text())
    assert reference["nms"] is False and reference["data"] == DATA
    r = subprocess.run(val_argv(trained / "model.pt", reference_set, "--end2end"), capture_output=True, text=True,
                       env=env())
    assert r.returncode == 0, r.stderr
    close(json.loads(r.stdout), reference)
    images = reference_set.parent / "images" / "val"
    ours = predicted(trained / "model.pt", [images / p["image"] for p in reference["predictions"]], tmp_path,
                     str(reference["conf"]), "--end2end")
    assert finds(reference["predictions"], ours) >= 3
