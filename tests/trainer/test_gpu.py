"""GPU path (NCCL device choice, AMP with autocast, cudnn.benchmark): runs
only where a GPU is present; skipped elsewhere."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")


def test_amp_training_on_gpu(tmp_path):
    from hpcyolo.shapes import make_shapes

    data = make_shapes(tmp_path / "shapes", n_train=32, n_val=8, imgsz=128, seed=0)
    r = subprocess.run([HPCYOLO, "train", "--run-dir", tmp_path / "run", "--data", data, "--epochs", "2",
                        "--batch", "8", "--imgsz", "128", "--workers", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "device cuda:0" in r.stdout
    rows = list(csv.DictReader((tmp_path / "run" / "results.csv").open()))
    assert len(rows) == 2 and all(math.isfinite(float(row["train/box_loss"])) for row in rows)
