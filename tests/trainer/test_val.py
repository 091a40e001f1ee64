"""`hpcyolo val`: ultralytics' validation protocol, numbers compared with
ultralytics' own on the reference fixtures, one rank or several."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, SHARED

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.model.boxes import non_max_suppression
from hpcyolo_trainer.eval.evaluate import letterbox_to, rect_batches
from hpcyolo_trainer.eval.metrics import ap_per_class, match_predictions

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
FIXTURES = SHARED / "fixtures" / "ultralytics"
NAMES = ["yolov8n-shapes", "yolo11n-shapes", "yolo26n-shapes"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def val(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nice", "-n", "19", HPCYOLO, "val", *args], capture_output=True, text=True, env=ENV)


@pytest.mark.parametrize("name", NAMES)
def test_val_matches_ultralytics_on_the_fixture(name):
    folder = FIXTURES / name
    if not (folder / "model.pt").is_file():
        pytest.skip(f"no reference fixture {folder}")
    ref = json.loads((folder / "reference.json").read_text())
    r = val(str(folder / "model.pt"), "--data", str(folder / "data.yaml"), "--imgsz", "160", "--batch", "16",
            "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    print(f"{name}: mAP50 {result['map50']:.4f} (ultralytics {ref['val_mAP50']}), "
          f"mAP50-95 {result['map50_95']:.4f} (ultralytics {ref['val_mAP50_95']})")
    # Both to the fourth digit, the reference's own precision (mAP50-95 was 0.007 to 0.008
    # above ultralytics' while predictions were clipped to the image before matching).
    assert round(result["map50"], 4) == ref["val_mAP50"]
    assert round(result["map50_95"], 4) == ref["val_mAP50_95"]
    assert result["images"] == ref["val_images"] == 40
    assert [c["class"] for c in result["classes"]] == [ref["names"][str(i)] for i in range(ref["nc"])]
    assert sum(c["instances"] for c in result["classes"]) == result["instances"] > 0


def v8_args() -> list[str]:
    """yolov8n-shapes at 160 px in batches of 8 (5 batches of its 40 images)."""
    folder = FIXTURES / "yolov8n-shapes"
    return [str(folder / "model.pt"), "--data", str(folder / "data.yaml"), "--imgsz", "160", "--batch", "8"]


@pytest.fixture(scope="module")
def inline() -> dict:
    """`hpcyolo val --json --workers 0` (the images read in the process) of
    v8_args: one rank's figures, for the two tests below (each ran it)."""
    r = val(*v8_args(), "--json", "--workers", "0")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_val_loader_workers_give_the_same_figures_as_loading_in_process(inline):
    """--workers 2 (loader processes, as ultralytics' val reads images) and
    --workers 0 (in the process) measure the same."""
    r = val(*v8_args(), "--json", "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert inline == json.loads(r.stdout) and inline["images"] == 40


def test_val_table_and_two_ranks_agree_with_one(tmp_path, capfd, inline):
    folder = FIXTURES / "yolov8n-shapes"
    if not (folder / "model.pt").is_file():
        pytest.skip(f"no reference fixture {folder}")
    args = v8_args()
    table = val(*args)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[1].split() == ["class", "images", "instances", "P", "R", "mAP50", "mAP50-95"]
    assert [line.split()[0] for line in lines[2:]] == ["all", "circle", "square", "triangle", "cross"]

    one = inline  # one rank's JSON figures (read in the process; the test above: loader workers measure the same)
    capfd.readouterr()
    # 5 batches of 8 over 2 ranks: rank 0 takes 3, rank 1 takes 2.
    assert launch([HPCYOLO, "val", *args, "--json"], 2, env=ENV) == 0
    out = capfd.readouterr().out.strip().splitlines()
    assert len(out) == 1, out  # rank 0 alone prints
    assert json.loads(out[0]) == one


def test_val_of_weights_for_other_classes_is_one_line(tmp_path):
    folder = FIXTURES / "yolov8n-shapes"
    if not (folder / "model.pt").is_file():
        pytest.skip(f"no reference fixture {folder}")
    data = make_shapes(tmp_path / "shapes", n_train=2, n_val=2, imgsz=64, classes=3, seed=0)
    r = val(str(folder / "model.pt"), "--data", str(data))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"hpcyolo: error: {folder / 'model.pt'}: has 4 classes, {data} "
                                             "names 3"]


def test_rect_batches_follow_ultralytics():
    # h/w ratios: 0.5 (wide), 1, 2 (tall), 0.75; sorted: 0.5, 0.75 | 1, 2
    shapes = [(100, 200), (100, 100), (200, 100), (75, 100)]
    batches = rect_batches(shapes, 2, 160)
    assert batches[0] == ([0, 3], (160, 192))  # ratio 0.75 * 160 / 32 + 0.5 = 4.25 -> 5 * 32, 160/32 + .5 -> 6
    assert batches[1] == ([1, 2], (192, 192))  # mixed: square
    assert rect_batches([(160, 160)], 16, 160) == [([0], (192, 192))]
    canvas, gain, (left, top) = letterbox_to(np.zeros((120, 160, 3), np.uint8), (192, 192))
    assert canvas.shape == (192, 192, 3) and gain == 1.0 and (left, top) == (16, 36)
    assert (canvas[0, 0] == 114).all() and (canvas[100, 100] == 0).all()


def test_multi_label_nms_keeps_one_box_per_class_above_conf():
    # One anchor scoring 0.9 for class 0 and 0.5 for class 1, 0.0005 for class 2.
    preds = torch.tensor([[50.0, 50.0, 20.0, 20.0, 0.9, 0.5, 0.0005]]).T[None]
    single = non_max_suppression(preds, conf_thres=0.001)[0]
    multi = non_max_suppression(preds, conf_thres=0.001, multi_label=True)[0]
    assert single[:, 5].tolist() == [0.0]
    assert multi[:, 5].tolist() == [0.0, 1.0] and multi[:, 4].tolist() == pytest.approx([0.9, 0.5])


def test_ultralytics_matching_prefers_the_first_prediction():
    # Two predictions of one gt: the first (most confident) overlaps less.
    gt = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    pred = torch.tensor([[0.0, 0.0, 10.0, 8.0, 0.9, 0], [0.0, 0.0, 10.0, 10.0, 0.8, 0]])
    coco = match_predictions(pred, gt, torch.tensor([0]))
    ultra = match_predictions(pred, gt, torch.tensor([0]), method="ultralytics")
    assert coco[:, 0].tolist() == [False, True]  # greedy by IoU
    assert ultra[:, 0].tolist() == [True, False]  # per gt, the first prediction


def test_ultralytics_ap_gives_no_credit_beyond_the_highest_recall():
    # One class, 2 ground truths, one prediction found one: recall 0.5 at precision 1.
    r = ap_per_class(np.array([[True]]), np.array([0.9]), np.array([0]), np.array([0, 0]), 1, "ultralytics")
    coco = ap_per_class(np.array([[True]]), np.array([0.9]), np.array([0]), np.array([0, 0]), 1)
    # Ultralytics 8.4: the envelope is 1 up to recall 0.5 and drops to 0 there (before 8.4 it fell
    # linearly to recall 1: 0.75); at recall 0.5 itself it reads the drop's foot, so the trapezoid
    # over the 101 points loses half a step: 0.495.
    assert r["ap"][0, 0] == pytest.approx(0.495, abs=1e-9)
    assert coco["ap"][0, 0] == pytest.approx(51 / 101)  # COCO: recall points 0..0.5 count, the rest 0
    none = ap_per_class(np.zeros((0, 1), bool), np.zeros(0), np.zeros(0), np.array([0]), 1, "ultralytics")
    assert none["ap"][0, 0] == 0.0


def test_val_takes_hpcyolo_weights(tmp_path):
    """Our own weights/*.pt (here: the fixture's tensors saved as hpcyolo
    weights) measure exactly as the ultralytics file they came from."""
    folder = FIXTURES / "yolo11n-shapes"
    if not (folder / "model.pt").is_file():
        pytest.skip(f"no reference fixture {folder}")
    from hpcyolo_trainer.model.weights import read_weights

    w = read_weights(folder / "model.pt")
    torch.save({"model": w.state, "scale": w.arch, "names": w.names, "imgsz": 160}, tmp_path / "best.pt")
    args = ["--data", str(folder / "data.yaml"), "--batch", "16", "--json"]
    ours, theirs = val(str(tmp_path / "best.pt"), *args), val(str(folder / "model.pt"), *args)
    assert ours.returncode == 0, ours.stderr
    a, b = json.loads(ours.stdout), json.loads(theirs.stdout)
    assert a["imgsz"] == b["imgsz"] == 160  # both files say their training size
    assert {k: v for k, v in a.items() if k != "weights"} == {k: v for k, v in b.items() if k != "weights"}


# == images resized on loading, against ultralytics' own val ===================

VAL_REFERENCE = REPO / "tests" / "reference" / "ultralytics" / "val.json"


def resized_cases() -> list[tuple[str, str]]:
    cases = json.loads(VAL_REFERENCE.read_text())
    return [tuple(key.split("/")) for key in cases if key != "ultralytics"]


@pytest.mark.parametrize("name, path", resized_cases())
def test_val_on_resized_images_matches_ultralytics(name, path, tmp_path):
    """Each fixture's images enlarged (benchmarks/ultralytics_reference.py
    `resized_set`: 403 x 301, 251 x 397, 333 x 333 in turn), so that every one
    is resized on loading; ultralytics' own `val` figures of the same files
    (tests/reference/ultralytics/val.json, made by that script in the
    benchmark venv), with NMS and, for YOLO26, NMS-free. Measured: equal
    to the fourth digit on every figure, since images are shrunk bilinearly
    as ultralytics 8.4 does (they were shrunk with INTER_AREA, 0.0035 off);
    held to 0.0005 here."""
    from test_task_models import reference_script

    script = reference_script()
    ref = json.loads(VAL_REFERENCE.read_text())[f"{name}/{path}"]
    data = script.resized_set(FIXTURES / name, tmp_path / name)
    r = val(str(FIXTURES / name / "model.pt"), "--data", str(data), "--imgsz", "160", "--batch", "16", "--json",
            *(["--end2end"] if path == "end2end" else []))
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    print(f"{name} {path}: mAP50 {result['map50']:.4f} (ultralytics {ref['map50']:.4f}), "
          f"mAP50-95 {result['map50_95']:.4f} (ultralytics {ref['map50_95']:.4f})")
    for key in ("map50", "map50_95", "precision", "recall"):
        assert abs(result[key] - ref[key]) <= 0.0005, (key, result[key], ref[key])
