"""`hpcyolo train --weights`: a run starts from an ultralytics checkpoint (or
hpcyolo weights) on every rank; a run's own checkpoint wins on resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import SHARED
from hpcyolo.local import launch
from hpcyolo.shapes import make_shapes
from hpcyolo_trainer.weights import read_weights

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
V8 = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"
pytestmark = pytest.mark.skipif(not V8.is_file(), reason=f"no reference fixture {V8}")


def argv(run: Path, data: Path, *extra: str) -> list[str]:
    return ["nice", "-n", "19", HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--epochs", "1",
            "--batch", "4", "--nbs", "4", "--imgsz", "64", "--workers", "0", "--warmup-epochs", "0", *extra]


def run1(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def shapes4(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("d") / "shapes", n_train=8, n_val=4, imgsz=64, classes=4, seed=0)


def test_two_ranks_start_from_ultralytics_weights_and_resume_wins(tmp_path, shapes4, capfd):
    # lr0 0: the optimizer never moves a weight, so the run's weights must be the file's.
    code = launch(argv(tmp_path / "run", shapes4, "--weights", str(V8), "--lr0", "0")[3:], 2,
                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = capfd.readouterr().out
    assert code == 0, out
    assert out.count("weights: 354/354 tensors from model.pt (ultralytics yolov8n, 4 classes)") == 1
    assert "training yolov8n on 8 images" in out
    saved = torch.load(tmp_path / "run" / "weights" / "last.pt", weights_only=True)
    assert saved["scale"] == "yolov8n"
    source = read_weights(V8).state
    convs = [k for k in source if k.endswith(".weight") and source[k].dim() == 4]
    worst = max((saved["model"][k] - source[k].float()).abs().max().item() for k in convs)
    assert worst < 1e-5, worst

    # A second start of the same run resumes its checkpoint; the weights file is not read.
    r = run1(argv(tmp_path / "run", shapes4, "--weights", str(V8), "--epochs", "2"))
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "weights:" not in r.stdout


def test_weights_and_data_of_other_classes_is_one_line(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=4, n_val=2, imgsz=64, classes=3, seed=0)
    r = run1(argv(tmp_path / "run", data, "--weights", str(V8)))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"hpcyolo: error: {V8}: has 4 classes, the dataset 3; training onto "
                                             "other classes from these weights is not supported yet"]


def test_model_that_contradicts_the_weights_is_one_line(tmp_path, shapes4):
    r = run1(argv(tmp_path / "run", shapes4, "--weights", str(V8), "--model", "yolo11n"))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"hpcyolo: error: {V8}: holds yolov8n, but --model asks for yolo11n "
                                             "(leave --model out to train the weights' own architecture)"]
