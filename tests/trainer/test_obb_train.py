"""`hpcyolo train --task obb` end to end on CPU: YOLO11 (v8OBBLoss) and
YOLO26 (E2ELoss of it) train on a make-dataset obb set and validate by
ProbIoU, results.csv's header ultralytics' own (its training of
yolo11n-obb and yolo26n-obb on the same kind of set, the reference
script's trained-obb), every figure finite, the plots drawn, the weights
read back as an OBB model; a bad OBB row stops the run in one line
before anything is written."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from shared_runs import obb_run
from test_yolo26_train import env

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.model.weights import read_weights

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "ultralytics" / "trained"


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory) -> Path:
    return make_shapes(tmp_path_factory.mktemp("obb") / "shapes", n_train=16, n_val=8, imgsz=96, task="obb", seed=0)


def train(data: Path, run: Path, model: str, epochs: int) -> subprocess.CompletedProcess:
    return subprocess.run([HPCYOLO, "train", "--task", "obb", "--model", model, "--data", str(data), "--epochs",
                           str(epochs), "--imgsz", "96", "--batch", "8", "--workers", "0", "--run-dir", str(run)],
                          capture_output=True, text=True, env=env())


@pytest.mark.parametrize("model, epochs", [("yolo11n", 2), ("yolo26n", 1)])
def test_an_obb_run_trains_and_logs_ultralytics_columns(tiny_set, tmp_path, tmp_path_factory, model, epochs):
    """yolo11n: the uninterrupted run of test_obb_reference.py's resume test
    (shared_runs.obb_run: 2 ranks, 2 epochs, 64 px), which this test's own
    run (one rank, 96 px) repeated for the same columns, plots and weights;
    yolo26n: a run of its own (1 rank, 1 epoch, 96 px)."""
    if model == "yolo11n":
        run = obb_run(tmp_path_factory).run
    else:
        r = train(tiny_set, tmp_path / "run", model, epochs)
        assert r.returncode == 0, r.stderr
        run = tmp_path / "run"
    header, *rows = [line.split(",") for line in (run / "results.csv").read_text().splitlines()]
    theirs = json.loads((REFERENCE / f"{model}-obb" / "val.json").read_text())["columns"]
    assert header[:len(theirs)] == theirs  # ultralytics' names and order; hpcyolo's speed columns after
    third = "l1_loss" if model == "yolo26n" else "dfl_loss"
    assert header[2:6] == ["train/box_loss", "train/cls_loss", f"train/{third}", "train/angle_loss"]
    assert len(rows) == epochs
    for row in rows:
        figures = dict(zip(header, row))
        assert all(math.isfinite(float(figures[c])) for c in theirs[1:])
        assert all(float(figures[f"train/{k}"]) > 0 for k in ("box_loss", "cls_loss", third, "angle_loss"))
        assert all(0 <= float(figures[c]) <= 1 for c in theirs if c.startswith("metrics/"))
    drawn = {p.name for p in run.iterdir()}
    assert {"train_batch0.jpg", "val_batch0_labels.jpg", "val_batch0_pred.jpg", "BoxPR_curve.png",
            "confusion_matrix.png", "results.png"} <= drawn
    weights = read_weights(run / "weights" / "best.pt")
    assert (weights.task, weights.arch, weights.nc) == ("obb", model, 4)


@pytest.mark.parametrize("line, said", [("1 0.1 0.1 0.3 0.1 0.3 0.3", "6 coordinates where train.task obb needs"),
                                        ("2 0.1 0.1 0.2 0.2 0.3 0.3 0.4 0.4", "a degenerate oriented box")])
def test_a_bad_obb_row_stops_the_run_in_one_line_before_anything_is_written(tiny_set, tmp_path, line, said):
    refused_in_one_line(tiny_set, tmp_path, "train", line, said, train)


def refused_in_one_line(data: Path, tmp_path: Path, split: str, row: str, said: str, train) -> None:
    """A copy of `data`'s set with `row` added to a label file of `split`:
    `train` (data.yaml, run, model, epochs) exits 1 with one error line,
    `file:line: said`, no traceback and no run directory."""
    shutil.copytree(data.parent, tmp_path / "set")
    label = next(p for p in sorted((tmp_path / "set" / "labels" / split).glob("*.txt")) if p.read_text().strip())
    number = len(label.read_text().splitlines()) + 1
    label.write_text(label.read_text() + row + "\n")
    r = train(tmp_path / "set" / "data.yaml", tmp_path / "run", "yolo11n", 1)
    assert r.returncode == 1 and not (tmp_path / "run").exists(), r.stderr
    errors = [text for text in r.stderr.splitlines() if text.startswith("hpcyolo: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{label}:{number}: {said}" in errors[0]
