"""Exact resume: two gloo ranks on CPU, stopped inside an epoch by the
preemption path and resumed, end bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from hpcyolo.local import launch
from hpcyolo.preemption import DRILL_ENV, EXIT_CODE
from hpcyolo.shapes import make_shapes
from hpcyolo_trainer import checkpoint as ckpt

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")


def train(run: Path, data: Path, extra_env=None) -> int:
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--model", "n", "--epochs", "2",
            "--batch", "4", "--nbs", "4", "--imgsz", "64", "--workers", "1", "--seed", "3", "--close-mosaic", "1",
            "--keep", "10"]
    env = {k: v for k, v in os.environ.items() if k != DRILL_ENV}
    env.update(extra_env or {})
    return launch(argv, 2, env=env)


def final_state(run: Path) -> dict:
    return ckpt.load_latest(run / "checkpoints", warn=print)


def test_stopped_and_resumed_run_is_bit_identical(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=12, n_val=4, imgsz=64, classes=3, seed=0)
    assert train(tmp_path / "a", data) == 0

    # Run b: the preemption path fires after optimizer step 4 (epoch 2, batch 1 of 3).
    assert train(tmp_path / "b", data, {DRILL_ENV: "4"}) == EXIT_CODE
    stopped = final_state(tmp_path / "b")
    assert (stopped["epoch"], stopped["batch"], stopped["global_step"]) == (1, 1, 4)
    assert train(tmp_path / "b", data) == 0

    a, b = final_state(tmp_path / "a"), final_state(tmp_path / "b")
    assert a["global_step"] == b["global_step"] == 6
    for part in ("model",):
        for name, tensor in a[part].items():
            assert torch.equal(tensor, b[part][name]), f"{part}.{name} differs"
    for name, tensor in a["ema"]["module"].items():
        assert torch.equal(tensor, b["ema"]["module"][name]), f"ema.{name} differs"
    assert (tmp_path / "b" / "results.csv").read_text().count("\n") == 3  # header + 2 epochs
