"""Two-rank runs that tests in more than one file read, made once a pytest
session (a module-scoped fixture is one file's): the uninterrupted run of
an OBB resume test (test_obb_reference.py), which test_obb_train.py's
yolo11n run reads too; and the stopped-and-resumed twin of such a run
(the segment, pose and OBB resume tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

from conftest import max_abs_diff
from test_yolo26_train import LAUNCH, argv, env, hold_then_signal

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common.preemption import EXIT_CODE
from hpcyolo_trainer.run import checkpoint as ckpt

# 16 images, 2 ranks x 2: 4 steps an epoch; two loader workers a rank; mosaic, a rotating warp and mixup move
# the corners (test_obb_reference's resume test).
OBB_ARGS = ["--task", "obb", "--model", "yolo11n", "--epochs", "2", "--close-mosaic", "1", "--workers", "2",
            "--degrees", "10", "--mixup", "0.5"]

_MADE: dict[tuple[str, str], types.SimpleNamespace] = {}


def two_ranks(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LAUNCH, json.dumps(args)], capture_output=True, text=True, env=env())


def obb_run(tmp_path_factory) -> types.SimpleNamespace:
    """The OBB resume test's uninterrupted run (OBB_ARGS on 16 images of
    64 px, 2 ranks): data, run (its directory), out (its output)."""
    key = (str(tmp_path_factory.getbasetemp()), "obb")
    if key not in _MADE:
        tmp = tmp_path_factory.mktemp("obb-run")
        data = make_shapes(tmp / "shapes", n_train=16, n_val=4, imgsz=64, task="obb", seed=1)
        r = two_ranks(argv(tmp / "a", data, *OBB_ARGS))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        _MADE[key] = types.SimpleNamespace(data=data, run=tmp / "a", out=r.stdout)
    return _MADE[key]


def stopped_and_resumed_like(a: Path, data: Path, args: list[str], b: Path, columns: int) -> list[list[str]]:
    """Against a finished, uninterrupted run `a` (of `args` on `data`,
    2 ranks): run b, held after step 5 (epoch 2, batch
    1), stopped by SIGUSR2 and resumed, on 2 ranks. Asserts the two end with
    the same model, EMA and optimizer after 8 steps and the same results.csv
    but the time column (its first `columns` columns after `time`), and
    returns those rows."""
    code, out = hold_then_signal(argv(b, data, *args), 5)
    assert code == EXIT_CODE, out
    assert "stopping for preemption (SIGUSR2) at epoch 2, batch 1" in out
    r = two_ranks(argv(b, data, *args))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout
    first = ckpt.load_latest(a / "checkpoints", warn=print)
    second = ckpt.load_latest(b / "checkpoints", warn=print)
    assert first["global_step"] == second["global_step"] == 8
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(first[part], second[part], part) == 0.0, part

    def measured(run: Path) -> list[list[str]]:  # epoch, then `columns` after the time (second)
        return [(cells := row.split(","))[:1] + cells[2:2 + columns]
                for row in (run / "results.csv").read_text().splitlines()]

    rows = measured(a)
    assert rows == measured(b) and len(rows) == 3
    return rows
