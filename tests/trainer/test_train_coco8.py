"""Real data: training and validation on COCO8 run, over-fitting its four
training images drives the loss down, the run directory holds every output,
and the weights predict."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from conftest import COCO8
from PIL import Image

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")


def test_overfit_coco8_and_predict(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([HPCYOLO, "train", "--run-dir", run, "--data", COCO8, "--model", "n", "--epochs", "25",
                        "--batch", "4", "--nbs", "4", "--imgsz", "160", "--workers", "0", "--no-augment",
                        "--warmup-epochs", "0", "--optimizer", "adamw", "--lr0", "0.002"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert [int(row["epoch"]) for row in rows] == list(range(1, 26))
    loss = [sum(float(row[f"train/{k}_loss"]) for k in ("box", "cls", "dfl")) for row in rows]
    assert max(loss[-3:]) < 0.5 * loss[0], loss  # seen: 13.5 -> 4.8, 4.7, 4.6 (0.36x; 30 epochs 0.24x, 20 0.48x)
    for name in ("config.yaml", "results.png", "weights/best.pt", "weights/last.pt", "val_pred_0.jpg"):
        assert (run / name).is_file(), name
    Image.open(run / "results.png").verify()

    out = tmp_path / "pred"
    r = subprocess.run([HPCYOLO, "predict", run / "weights" / "last.pt", Path(COCO8).parent / "images" / "val",
                        "--out", out, "--format", "json", "--conf", "0.01"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 4 and all("detections" in p for p in predictions)
    assert len(list(out.glob("*.jpg"))) == 4
