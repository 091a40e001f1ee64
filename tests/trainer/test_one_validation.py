"""One validation: the mAP of a run's last row of results.csv is what
`hpcyolo val` reports for weights/last.pt with the same settings (image
size, and the validation batch the trainer uses: twice the per-rank training
batch, as ultralytics' trainer). Ultralytics' own yolov8n weights fine-tuned
for one epoch on its shapes fixture, so the figures are far from 0; one
process, and two with the batch split over them."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED

from hpcyolo.node.local import launch

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
FIXTURE = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes"
BATCH, IMGSZ = 8, 160
COLUMNS = {"precision": "metrics/precision(B)", "recall": "metrics/recall(B)", "map50": "metrics/mAP50(B)",
           "map50_95": "metrics/mAP50-95(B)"}


@pytest.mark.parametrize("nproc", [1, 2])
def test_results_csv_equals_hpcyolo_val_on_last_pt(tmp_path, nproc):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(FIXTURE / "data.yaml"), "--weights",
             str(FIXTURE / "model.pt"), "--epochs", "1", "--batch", str(BATCH), "--nbs", str(BATCH), "--imgsz",
             str(IMGSZ), "--workers", "2", "--optimizer", "sgd", "--lr0", "0.001", "--warmup-epochs", "0"]
    assert launch(train, nproc, env=env) == 0
    row = list(csv.DictReader((run / "results.csv").open()))[-1]

    val_batch = 2 * BATCH // nproc
    r = subprocess.run([HPCYOLO, "val", str(run / "weights" / "last.pt"), "--data", str(FIXTURE / "data.yaml"),
                        "--imgsz", str(IMGSZ), "--batch", str(val_batch), "--json"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["map50_95"] > 0.3, result  # a trained model: the comparison means something
    for key, column in COLUMNS.items():
        assert float(row[column]) == pytest.approx(round(result[key], 5), abs=1e-5), \
            f"{column}: results.csv {row[column]}, hpcyolo val {result[key]:.5f}"
