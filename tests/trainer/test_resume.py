"""Exact resume: four gloo ranks on CPU with two loader workers each, stopped
inside an epoch by the preemption path (at a step that is neither an epoch
boundary nor a checkpoint interval) and resumed, end bit-identical to an
uninterrupted run: model, EMA, optimizer state and results.csv. Batches of
8 and nbs 16: an optimizer step sums 1 batch, then 2 as the warm-up ramps up."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import torch
from conftest import max_abs_diff

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.run import checkpoint as ckpt
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")


def train(run: Path, data: Path, extra_env=None) -> int:
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--model", "n", "--epochs", "2",
            "--batch", "8", "--nbs", "16", "--imgsz", "64", "--workers", "2", "--seed", "3", "--close-mosaic", "1",
            "--save-every", "3", "--keep", "10"]
    env = {k: v for k, v in os.environ.items() if k != DRILL_ENV}
    env.update(extra_env or {}, OMP_NUM_THREADS="1")
    return launch(argv, 4, env=env)


def test_four_ranks_stopped_mid_epoch_resume_bit_identical(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=24, n_val=8, imgsz=64, classes=3, seed=0)
    assert train(tmp_path / "a", data) == 0

    # 3 batches an epoch, a warm-up of 3 batches: steps after batches 1, 2 and 3 (1, 1, then 2 but
    # the epoch ends), 5 (2: the warm-up's last value) and 6 (the epoch ends): 5 steps.
    # Run b: the preemption path fires after optimizer step 4 (epoch 2, batch 2 of 3;
    # checkpoints every 3 steps, so the stop is not on a checkpoint interval).
    assert train(tmp_path / "b", data, {DRILL_ENV: "4"}) == EXIT_CODE
    stopped = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert (stopped["epoch"], stopped["batch"], stopped["global_step"]) == (1, 2, 4)
    assert len(stopped["loss_sums"]) == 4 and not all(torch.equal(s, stopped["loss_sums"][0])
                                                       for s in stopped["loss_sums"])
    # results.csv's time is the run's seconds so far (ultralytics' seconds since training began), the
    # first job's counted: make them unmistakable (the time column is the only thing they change).
    ckpt.save({**stopped, "run_seconds": 1000.0}, ckpt.path_for(tmp_path / "b" / "checkpoints", 4))
    assert train(tmp_path / "b", data) == 0

    a = ckpt.load_latest(tmp_path / "a" / "checkpoints", warn=print)
    b = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert a["global_step"] == b["global_step"] == 5
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part

    rows = [list(csv.DictReader((tmp_path / run / "results.csv").open())) for run in ("a", "b")]
    assert len(rows[0]) == len(rows[1]) == 2
    for ra, rb in zip(*rows):
        assert ({k: v for k, v in ra.items() if k not in rundir.TIMING_COLUMNS}
                == {k: v for k, v in rb.items() if k not in rundir.TIMING_COLUMNS})
    times = [[float(row["time"]) for row in run] for run in rows]
    assert 0 < times[0][0] < times[0][1] and times[1][0] < 1000 <= times[1][1] < 1000 + 10 * times[0][1]
