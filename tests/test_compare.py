"""`hpcyolo compare`: two real runs (one rank, two epochs, two learning
rates) in one folder, as a sweep leaves them: ranked by their best fitness
read back from results.csv, the one differing setting named, one PNG, and
no torch imported by the command."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED
from PIL import Image

from hpcyolo.login.shapes import make_shapes

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
V8 = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    data = make_shapes(root / "data" / "shapes", n_train=8, n_val=8, imgsz=96, classes=4, seed=1)
    for lr in ("0.002", "0.0"):
        r = subprocess.run([HPCYOLO, "train", "--run-dir", str(root / "runs" / f"s-lr0_{lr}"), "--data", str(data),
                            "--weights", str(V8), "--epochs", "2", "--batch", "4", "--imgsz", "96", "--workers", "0",
                            "--optimizer", "sgd", "--lr0", lr, "--close-mosaic", "0", "--no-tensorboard"],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr[-2000:]
    return root / "runs"


def best_fitness(run: Path) -> float:
    rows = list(csv.DictReader((run / "results.csv").open()))
    return max(float(r["metrics/mAP50-95(B)"]) for r in rows)  # ultralytics 8.4's fitness


def test_a_sweeps_runs_ranked_with_the_setting_that_differs(sweep, tmp_path):
    out = tmp_path / "cmp.png"
    code = (
        "import sys\n"
        "from hpcyolo.cli import main\n"
        "try:\n"
        f"    main(['compare', {str(sweep)!r}, '-o', {str(out)!r}, '--json'])\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')\n"
        "print('IMPORTED', bad, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert "IMPORTED []" in r.stderr, r.stderr[-2000:]
    rows = json.loads(r.stdout)
    want = sorted(((best_fitness(p), p.name) for p in sweep.iterdir()), reverse=True)
    assert [(pytest.approx(row["fitness"], abs=1e-9), row["run"]) for row in rows] == want
    assert all(list(row["settings"]) == ["lr0"] for row in rows)  # the one setting that differs
    assert {row["settings"]["lr0"] for row in rows} == {0.002, 0.0} and all(row["epochs"] == 2 for row in rows)
    with Image.open(out) as im:
        im.verify()
        assert im.size[0] >= 1000
    # The table: both runs, best first; a path that is not a run: one line, exit 1 (as `hpcyolo status`).
    table = subprocess.run([HPCYOLO, "compare", str(sweep / "s-lr0_0.0"), str(sweep / "s-lr0_0.002"), "-o",
                            str(tmp_path / "two.png")], capture_output=True, text=True)
    assert table.returncode == 0 and table.stdout.splitlines()[1].split()[1] == want[0][1]
    assert "2 run(s); curves in" in table.stderr
    bad = subprocess.run([HPCYOLO, "compare", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "neither a run" in bad.stderr
