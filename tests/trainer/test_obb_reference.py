"""Oriented boxes against ultralytics and across ranks: `hpcyolo val` of
ultralytics' own yolo11n-obb and yolo26n-obb, trained on a make-dataset obb
set by benchmarks/ultralytics_reference.py (trained-obb), gives its P, R,
mAP50 and mAP50-95 on that set's val split with one rank and two; predict
finds its objects (same class, rotated-box IoU >= 0.9, four corners in
image pixels); YOLO26's NMS-free head likewise; ONNX in ultralytics' OBB
layout within 1e-4 of torch; an obb run stopped by a real signal on two
ranks with two loader workers each resumes bit-identical."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from shared_runs import OBB_ARGS, obb_run, stopped_and_resumed_like
from test_segment import HPCYOLO, REFERENCE, gaps, predicted, trained_reference_set, val_argv
from test_yolo26_train import env

from hpcyolo.node.local import launch

MODELS = ("yolo11n-obb", "yolo26n-obb")  # ultralytics' own, trained on DATA
# The set the reference models were trained and validated on (their val.json says so).
DATA = "hpcyolo make-dataset shapes DIR --task obb --train 240 --val 40 --seed 3"


@pytest.fixture(scope="module")
def reference_set(tmp_path_factory) -> Path:
    return trained_reference_set(tmp_path_factory, "obb", MODELS, DATA)


@pytest.mark.parametrize("name", MODELS)
def test_val_of_ultralytics_obb_model_gives_its_figures_on_one_rank_and_two(reference_set, tmp_path, capfd, name):
    reference = json.loads((REFERENCE / name / "val.json").read_text())
    args = val_argv(REFERENCE / name / "model.pt", reference_set)
    r = subprocess.run([*args, "--plots", str(tmp_path / "plots")], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    found = gaps(ours, reference["box"])
    print(name, found)
    assert all(abs(a - b) <= 0.005 for a, b in found.values()), found
    assert reference["box"]["map50"] > 0.1  # a model that finds objects: the comparison means something
    plots = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"BoxPR_curve.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg", "confusion_matrix.png"} <= plots
    if name != MODELS[0]:
        # Two ranks (evaluate.share_batches: every rank a share of the batches, rank 0 merging their stats in batch
        # order) is the task's path, not the model family's: the first model's two-rank launch shows it, the
        # second family's repeated it at a launch's cost.
        return
    capfd.readouterr()
    assert launch(args, 2, env=env()) == 0
    out = capfd.readouterr().out.strip().splitlines()
    assert len(out) == 1 and json.loads(out[0]) == ours


def rotated_iou(a, b) -> float:
    """IoU of two convex quadrilaterals (corners [4, 2], pixels), exactly (OpenCV's convex intersection)."""
    a, b = np.asarray(a, np.float32).reshape(4, 2), np.asarray(b, np.float32).reshape(4, 2)
    inter, _ = cv2.intersectConvexConvex(cv2.convexHull(a), cv2.convexHull(b))
    union = cv2.contourArea(cv2.convexHull(a)) + cv2.contourArea(cv2.convexHull(b)) - inter
    return inter / union if union > 0 else 0.0


def finds(reference: list, ours: dict) -> int:
    """How many of ultralytics' oriented boxes (predict.json's) ours have,
    asserting each is there: the same class, rotated-box IoU >= 0.9."""
    found = 0
    for theirs in reference:
        mine = ours[theirs["image"]]["detections"]
        for obj in theirs["objects"]:
            same = [d for d in mine if d["class"] == obj["class"]]
            best = max(same, default=None, key=lambda d: rotated_iou(obj["corners"], d["corners_xy"]))
            assert best is not None, (theirs["image"], obj)
            assert rotated_iou(obj["corners"], best["corners_xy"]) >= 0.9, (theirs["image"], obj, best)
            found += 1
    return found


@pytest.mark.parametrize("name", MODELS)
def test_predict_finds_ultralytics_oriented_boxes_by_their_corners(reference_set, tmp_path, name):
    """Every oriented box ultralytics' predict found on the first val images:
    ours has it (same class, IoU of the rotated boxes >= 0.9, corners in the
    image's pixels); the txt rows are class, four normalised corners, conf."""
    written = json.loads((REFERENCE / name / "predict.json").read_text())
    reference, conf = written["predictions"], str(written["conf"])
    images = reference_set.parent / "images" / "val"
    ours = predicted(REFERENCE / name / "model.pt", [images / p["image"] for p in reference], tmp_path, conf)
    assert finds(reference, ours) >= 3
    first = reference[0]["image"]
    r = subprocess.run([HPCYOLO, "predict", str(REFERENCE / name / "model.pt"), str(images / first), "--out",
                        str(tmp_path / "txt"), "--conf", conf], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "txt" / "labels" / f"{Path(first).stem}.txt").read_text().splitlines()
    assert len(rows) == len(ours[first]["detections"]) > 0
    for row, det in zip(rows, ours[first]["detections"]):
        values = row.split()
        assert int(values[0]) == det["class"] and len(values) == 10
        np.testing.assert_allclose(np.array(values[1:9], float).reshape(4, 2) * 160, det["corners_xy"], atol=0.06)


def test_yolo26_obb_nms_free_gives_ultralytics_nms_false_val_predict_and_onnx(reference_set, tmp_path):
    """--end2end (ultralytics' nms=False) on its yolo26n-obb: val within
    0.005 of its figures, predict finds its boxes, export writes output0
    [B, 300, 7] within 1e-4 of torch (rows whose scores tie to rounding in either order)."""
    from hpcyolo_trainer.eval.export import end2end_diff, run_onnx_outputs
    from hpcyolo_trainer.model.weights import build_from, read_weights

    trained = REFERENCE / "yolo26n-obb"
    reference = json.loads((trained / "end2end.json").read_text())
    assert reference["nms"] is False and reference["data"] == DATA
    r = subprocess.run(val_argv(trained / "model.pt", reference_set, "--end2end"), capture_output=True, text=True,
                       env=env())
    assert r.returncode == 0, r.stderr
    found = gaps(json.loads(r.stdout), reference["box"])
    print(found)
    assert all(abs(a - b) <= 0.005 for a, b in found.values()), found
    images = reference_set.parent / "images" / "val"
    ours = predicted(trained / "model.pt", [images / p["image"] for p in reference["predictions"]], tmp_path,
                     str(reference["conf"]), "--end2end")
    assert finds(reference["predictions"], ours) >= 3
    onnx_file = tmp_path / "model.onnx"
    r = subprocess.run([HPCYOLO, "export", str(trained / "model.pt"), "-o", str(onnx_file), "--imgsz", "160",
                        "--end2end"], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(1))
    out0, = run_onnx_outputs(str(onnx_file), x.numpy())
    with torch.no_grad():
        expected = build_from(read_weights(trained / "model.pt")).eval().predict(x, end2end=True)
    assert out0.shape == (1, 300, 7) and end2end_diff(out0, expected.numpy()) < 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_onnx_export_of_an_obb_model_gives_ultralytics_layout_matching_torch(tmp_path, name):
    """output0 [B, 4 + nc + 1, anchors] (boxes, class scores, the angle), as
    ultralytics exports an OBB model; with dynamic axes, at another batch and
    size, within 1e-4 of torch's."""
    from hpcyolo_trainer.eval.export import relative_diff, run_onnx_outputs
    from hpcyolo_trainer.model.weights import build_from, read_weights

    out = tmp_path / "obb.onnx"
    r = subprocess.run([HPCYOLO, "export", str(REFERENCE / name / "model.pt"), "-o", str(out), "--imgsz", "160",
                        "--dynamic"], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    x = torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(1))
    got, = run_onnx_outputs(str(out), x.numpy())
    with torch.no_grad():
        expected = build_from(read_weights(REFERENCE / name / "model.pt")).eval().predict(x)
    assert got.shape == (2, 4 + 4 + 1, 12 * 16 + 6 * 8 + 3 * 4)
    assert relative_diff(got, expected.numpy()) < 1e-4


def test_an_obb_run_stopped_by_a_signal_on_two_ranks_resumes_bit_identical(tmp_path_factory, tmp_path):
    """16 images, 2 ranks x 2: 4 steps an epoch; held after step 5 (epoch 2,
    the last: close_mosaic's), stopped by SIGUSR2, resumed; two loader
    workers a rank; mosaic, a rotating warp and mixup move the corners. The
    uninterrupted run is shared_runs.obb_run (test_obb_train.py reads it too)."""
    a = obb_run(tmp_path_factory)
    # epoch, losses, figures, val losses, lrs
    rows = stopped_and_resumed_like(a.run, a.data, OBB_ARGS, tmp_path / "b", 15)
    assert rows[0][1:5] == ["train/box_loss", "train/cls_loss", "train/dfl_loss", "train/angle_loss"]
    assert all(float(v) > 0 for row in rows[1:] for v in row[9:13])  # validated every epoch: a loss
