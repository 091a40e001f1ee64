"""Segmentation against ultralytics and across ranks: `hpcyolo val` of
ultralytics' own yolo11n-seg and yolo26n-seg, trained on a shapes set by
benchmarks/ultralytics_reference.py (tests/reference/ultralytics/trained),
gives ultralytics' box and mask figures on that set's val split, with one
rank and two; so do predict, export and the val/ loss columns; a YOLO26
segmenter trains, its results.csv's columns ultralytics'; a segment run
stopped by a real signal on two ranks with two loader workers each resumes
bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import SHARED
from shared_runs import stopped_and_resumed_like
from test_yolo26_train import argv, env

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.model.boxes import box_iou

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "ultralytics" / "trained"
SEGMENTERS = ("yolo11n-seg", "yolo26n-seg")  # ultralytics' own, trained on DATA
# The set the reference model was trained and validated on (its val.json says so): the same seed writes the same files.
DATA = "hpcyolo make-dataset shapes DIR --task segment --train 240 --val 40 --seed 3"


KEYS = ("precision", "recall", "map50", "map50_95")


def trained_reference_set(tmp_path_factory, task: str, models, data: str) -> Path:
    """The set ultralytics' trained `models` of `task` were trained and
    validated on (`make-dataset shapes --task TASK --train 240 --val 40
    --seed 3`, which their val.json names: `data`), written again here."""
    for name in models:
        reference = json.loads((REFERENCE / name / "val.json").read_text())
        assert reference["data"] == data and reference["ultralytics"] == "8.4.190" and reference["model"] == name
    return make_shapes(tmp_path_factory.mktemp(task) / "shapes", n_train=240, n_val=40, imgsz=160, task=task, seed=3)


def val_argv(weights: Path, data: Path, *extra: str) -> list[str]:
    """`hpcyolo val --json` of `weights` at the references' size and batch."""
    return [HPCYOLO, "val", str(weights), "--data", str(data), "--imgsz", "160", "--batch", "16", "--json", *extra]


def predicted(weights: Path, images: list[Path], out: Path, conf: str, *extra: str) -> dict:
    """`hpcyolo predict --format json` of `images`: each image's predictions by its file name."""
    r = subprocess.run([HPCYOLO, "predict", str(weights), *map(str, images), "--out", str(out), "--format", "json",
                        "--conf", conf, *extra], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    return {Path(p["image"]).name: p for p in json.loads((out / "predictions.json").read_text())}


def gaps(ours: dict, theirs: dict) -> dict:
    """Per figure of KEYS: (ours, ultralytics'), to the fourth digit."""
    return {key: (round(ours[key], 4), round(theirs[key], 4)) for key in KEYS}


@pytest.fixture(scope="module")
def reference_set(tmp_path_factory) -> Path:
    return trained_reference_set(tmp_path_factory, "segment", SEGMENTERS, DATA)


@pytest.mark.parametrize("name", SEGMENTERS)
def test_val_of_ultralytics_segmenter_gives_its_box_and_mask_figures_on_one_rank_and_two(reference_set, tmp_path,
                                                                                          capfd, name):
    reference = json.loads((REFERENCE / name / "val.json").read_text())
    args = val_argv(REFERENCE / name / "model.pt", reference_set)
    r = subprocess.run([*args, "--plots", str(tmp_path / "plots")], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    plots = {p.name for p in (tmp_path / "plots").iterdir()}  # ultralytics' files of a segmentation's validation
    assert {f"{kind}{curve}_curve.png" for kind in ("Box", "Mask") for curve in ("PR", "F1", "P", "R")} <= plots
    assert {"val_batch0_labels.jpg", "val_batch0_pred.jpg", "confusion_matrix.png"} <= plots
    found = {kind: gaps(figures, reference[kind]) for kind, figures in (("box", ours), ("mask", ours["masks"]))}
    print(name, found)
    assert all(abs(a - b) <= 0.005 for kind in found.values() for a, b in kind.values()), found
    assert reference["mask"]["map50"] > 0.1  # a model that finds objects: the comparison means something
    capfd.readouterr()
    assert launch(args, 2, env=env()) == 0
    out = capfd.readouterr().out.strip().splitlines()
    assert len(out) == 1 and json.loads(out[0]) == ours


def test_a_segment_run_stopped_by_a_signal_on_two_ranks_resumes_bit_identical(tmp_path):
    """16 images, 2 ranks x 2: 4 steps an epoch; held after step 5 (epoch 2,
    the last: close_mosaic's), stopped by SIGUSR2, resumed; two loader workers
    a rank; mosaic, a rotating warp and copy-paste move the polygons."""
    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=4, imgsz=64, task="segment", seed=1)
    args = ["--task", "segment", "--model", "yolo11n", "--epochs", "2", "--close-mosaic", "1", "--workers", "2",
            "--degrees", "10", "--copy-paste", "0.5"]
    assert launch(argv(tmp_path / "a", data, *args), 2, env=env()) == 0  # run a, uninterrupted
    # epoch, losses, box and mask figures, val losses, lrs
    rows = stopped_and_resumed_like(tmp_path / "a", data, args, tmp_path / "b", 21)
    assert rows[0][1:6] == ["train/box_loss", "train/seg_loss", "train/cls_loss", "train/dfl_loss", "train/sem_loss"]
    assert rows[0][10:14] == ["metrics/precision(M)", "metrics/recall(M)", "metrics/mAP50(M)", "metrics/mAP50-95(M)"]
    assert rows[0][14:22] == ["val/box_loss", "val/seg_loss", "val/cls_loss", "val/dfl_loss", "val/sem_loss", "lr/pg0",
                              "lr/pg1", "lr/pg2"]
    assert all(float(v) > 0 for row in rows[1:] for v in row[14:18])  # validated every epoch: a loss


def test_a_yolo26_segmenter_trains_and_logs_ultralytics_columns(tmp_path):
    """YOLO26's segmentation loss in a run (both heads, the mask-aware
    assignment, the semantic map): 2 epochs of yolo26n on 32 images at 160 px
    write results.csv with the loss and metric columns ultralytics' own
    training of yolo26n-seg wrote (trained/yolo26n-seg/val.json), every
    training item above 0; val/sem_loss 0, as ultralytics' (validation has
    no semantic map)."""
    data = make_shapes(tmp_path / "shapes", n_train=32, n_val=8, imgsz=160, task="segment", seed=0)
    r = subprocess.run([HPCYOLO, "train", "--task", "segment", "--model", "yolo26n", "--data", str(data), "--epochs",
                        "2", "--imgsz", "160", "--batch", "8", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    header, *rows = [line.split(",") for line in (tmp_path / "run" / "results.csv").read_text().splitlines()]
    logged = ("train/", "metrics/", "val/")
    theirs = json.loads((REFERENCE / "yolo26n-seg" / "val.json").read_text())["columns"]
    assert [c for c in header if c.startswith(logged)] == [c for c in theirs if c.startswith(logged)]
    assert header[:len(theirs)] == theirs  # ultralytics' order too (time second); hpcyolo's speed columns after
    assert header[2:7] == ["train/box_loss", "train/seg_loss", "train/cls_loss", "train/l1_loss", "train/sem_loss"]
    assert len(rows) == 2 and all(float(v) > 0 for row in rows for v in row[2:7])
    val = dict(zip(header, rows[-1]))
    assert float(val["val/sem_loss"]) == 0 and float(val["val/seg_loss"]) > 0


def filled(polygon, hw) -> np.ndarray:
    mask = np.zeros(hw, np.uint8)
    if len(polygon):
        cv2.fillPoly(mask, [np.round(np.asarray(polygon)).astype(np.int32)], 1)
    return mask.astype(bool)


@pytest.mark.parametrize("name", SEGMENTERS)
def test_predict_finds_ultralytics_objects_with_their_masks_outlines(reference_set, tmp_path, name):
    """Every object ultralytics' predict found at conf 0.3 on the first val
    images: ours has it, the same class, box IoU and mask IoU (the outlines
    filled at the image's size) at least 0.9."""
    trained = REFERENCE / name
    written = json.loads((trained / "predict.json").read_text())
    assert written.get("conf", 0.3) == 0.3  # (a file without it was written when 0.3 was the one threshold)
    reference, conf = written["predictions"], "0.3"
    images = reference_set.parent / "images" / "val"
    r = subprocess.run([HPCYOLO, "predict", str(trained / "model.pt"), *(str(images / p["image"]) for p in reference),
                        "--out", str(tmp_path), "--format", "json", "--conf", conf], capture_output=True, text=True,
                       env=env())
    assert r.returncode == 0, r.stderr
    ours = {Path(p["image"]).name: p for p in json.loads((tmp_path / "predictions.json").read_text())}
    assert finds(reference, ours) >= 3
    first = reference[0]["image"]
    r = subprocess.run([HPCYOLO, "predict", str(trained / "model.pt"), str(images / first), "--out",
                        str(tmp_path / "txt"), "--conf", conf], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "txt" / "labels" / f"{Path(first).stem}.txt").read_text().splitlines()
    assert len(rows) == len(ours[first]["detections"])
    for row, det in zip(rows, ours[first]["detections"]):  # class, the outline's x y pairs normalised, conf
        values = row.split()
        assert int(values[0]) == det["class"] and len(values) == 2 + 2 * len(det["polygon_xy"])
        assert all(0 <= float(v) <= 1 for v in values[1:])


def finds(reference: list, ours: dict) -> int:
    """How many of ultralytics' objects (`reference`: predict.json's
    predictions) our predictions (`ours`: by image name) have, asserting each
    is there: the same class, box IoU and mask IoU (the outlines filled at the
    image's size) at least 0.9."""
    found = 0
    for theirs in reference:
        mine = ours[theirs["image"]]
        hw = (mine["height"], mine["width"])
        for obj in theirs["objects"]:
            box = torch.tensor([obj["box"]])
            same = [d for d in mine["detections"] if d["class"] == obj["class"]]  # one box may hold two classes
            best = max(same, default=None, key=lambda d: float(box_iou(box, torch.tensor([d["box_xyxy"]]))))
            assert best is not None, (theirs["image"], obj)
            assert float(box_iou(box, torch.tensor([best["box_xyxy"]]))) >= 0.9, (theirs["image"], obj, best)
            a, b = filled(obj["polygon"], hw), filled(best["polygon_xy"], hw)
            assert (a & b).sum() / max((a | b).sum(), 1) >= 0.9, (theirs["image"], obj["class"])
            found += 1
    return found


def test_a_yolo26_segmenter_nms_free_gives_ultralytics_nms_false_val_predict_and_onnx(reference_set, tmp_path):
    """--end2end (ultralytics' nms=False: the one-to-one head's 300 best, no
    NMS) on ultralytics' own yolo26n-seg: `val` within 0.005 of its figures
    (end2end.json), `predict` finds its objects, `export` writes its NMS-free
    layout, output0 [B, 300, 6 + 32] beside the prototypes, within 1e-4 of
    torch; and the NMS-free figures are not the NMS ones."""
    from hpcyolo_trainer.eval.export import run_onnx_outputs

    trained = REFERENCE / "yolo26n-seg"
    reference = json.loads((trained / "end2end.json").read_text())
    assert reference["nms"] is False and reference["data"] == DATA and reference["conf"] == 0.3
    r = subprocess.run(val_argv(trained / "model.pt", reference_set, "--end2end"), capture_output=True, text=True,
                       env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    found = {kind: gaps(figures, reference[kind]) for kind, figures in (("box", ours), ("mask", ours["masks"]))}
    print(found)
    assert all(abs(a - b) <= 0.005 for kind in found.values() for a, b in kind.values()), found
    nms = json.loads((trained / "val.json").read_text())
    assert abs(nms["mask"]["map50"] - reference["mask"]["map50"]) > 0.01  # another head: other figures
    images = reference_set.parent / "images" / "val"
    r = subprocess.run([HPCYOLO, "predict", str(trained / "model.pt"),
                        *(str(images / p["image"]) for p in reference["predictions"]), "--out", str(tmp_path),
                        "--format", "json", "--conf", str(reference["conf"]), "--end2end"], capture_output=True,
                       text=True, env=env())
    assert r.returncode == 0, r.stderr
    predicted = {Path(p["image"]).name: p for p in json.loads((tmp_path / "predictions.json").read_text())}
    assert finds(reference["predictions"], predicted) >= 3
    onnx_file = tmp_path / "model.onnx"
    r = subprocess.run([HPCYOLO, "export", str(trained / "model.pt"), "-o", str(onnx_file), "--imgsz", "160",
                        "--end2end"], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(1)).numpy()
    out0, out1 = run_onnx_outputs(str(onnx_file), x)
    assert out0.shape == (1, 300, 6 + 32) and out1.shape == (1, 32, 40, 40)


@pytest.mark.parametrize("name", SEGMENTERS)
def test_onnx_export_of_a_segmenter_gives_ultralytics_two_outputs_matching_torch(tmp_path, name):
    """output0 [B, 4 + nc + 32, anchors] and output1, the prototypes [B, 32,
    H/4, W/4], as ultralytics exports a segmenter; with dynamic axes, at
    another batch and size, within 1e-4 of torch's."""
    from hpcyolo_trainer.eval.export import relative_diff, run_onnx_outputs
    from hpcyolo_trainer.model.weights import build_from, read_weights

    out = tmp_path / "seg.onnx"
    r = subprocess.run([HPCYOLO, "export", str(REFERENCE / name / "model.pt"), "-o", str(out), "--imgsz", "160",
                        "--dynamic"],
                       capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    x = torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(1))
    got = run_onnx_outputs(str(out), x.numpy())
    with torch.no_grad():
        preds, proto = build_from(read_weights(REFERENCE / name / "model.pt")).eval().predict(x)
    anchors = 12 * 16 + 6 * 8 + 3 * 4
    assert [g.shape for g in got] == [(2, 4 + 4 + 32, anchors), (2, 32, 24, 32)]
    assert relative_diff(got[0], preds.numpy()) < 1e-4 and relative_diff(got[1], proto.numpy()) < 1e-4


VAL_LOSS = REFERENCE.parent / "val_loss.json"
SHARED_FIXTURES = SHARED / "fixtures" / "ultralytics"


def val_losses(weights: Path, data: Path, task_name: str) -> dict:
    """validate's val/ loss items of `weights` on `data`'s val split, at
    imgsz 160 in rectangular batches of 32 (a training batch of 16's)."""
    from hpcyolo_trainer.common.settings import TrainConfig
    from hpcyolo_trainer.data.dataset import load_data_spec
    from hpcyolo_trainer.eval.evaluate import ValBatches
    from hpcyolo_trainer.model.weights import build_from, read_weights
    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.tasks.task import load

    task, spec = load(task_name), load_data_spec(data)
    model = build_from(read_weights(weights)).eval()
    cfg = TrainConfig(run_dir="unused", data=str(data), task=task_name, imgsz=160, batch=16)
    loss_fn = task.loss(model, len(spec.names), 1, cfg)
    batches = ValBatches(spec.val, len(spec.names), 160, 32, segments=task_name == "segment")
    summary = task.validate(Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")), model, batches,
                            loss_fn=loss_fn)
    return dict(zip(loss_fn.names, summary["val_losses"]))


@pytest.mark.parametrize("name", [*(f"trained/{m}" for m in SEGMENTERS), "yolov8n-shapes", "yolo11n-shapes",
                                  "yolo26n-shapes"])
def test_the_val_loss_columns_are_ultralytics_validation_loss(name, reference_set, one_thread):
    """The val/ columns of results.csv: the loss of the validated weights on
    each validation batch, averaged, as ultralytics' trainer logs them
    (benchmarks/ultralytics_reference.py val-loss)."""
    reference = json.loads(VAL_LOSS.read_text())
    if name.startswith("trained/"):
        ours = val_losses(REFERENCE / name.removeprefix("trained/") / "model.pt", reference_set, "segment")
    else:
        ours = val_losses(SHARED_FIXTURES / name / "model.pt", SHARED_FIXTURES / name / "data.yaml", "detect")
    theirs = reference[name]
    print(name, ours, theirs)
    assert set(ours) <= set(theirs) and {k for k, v in theirs.items() if v} <= set(ours)
    for key, value in ours.items():  # to float32's rounding (the masks from polygons resampled as ultralytics')
        assert value == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), (key, ours, theirs)
