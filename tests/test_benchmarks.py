"""Every benchmark runs, at its smallest size: a benchmark that nobody runs
rots (an argument renamed in the trainer, a column renamed in results.csv)
and is found broken the day its figures are needed. The figures printed
here mean nothing (tiny sizes, a busy machine); that each benchmark gets to
its summary line does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

# The benchmark venv (benchmarks/ultralytics_venv.sh): a smoke that can run ultralytics' side does.
UL_VENV = [] if Path("/work/bench-ul-venv/bin/python").is_file() else ["--skip-ultralytics"]

# (benchmark, its smallest arguments, a line of its summary)
SMOKES = [
    ("bench_world_size.py", ["--smoke"], "band"),
    ("bench_gpu.py", ["--smoke", "--skip-ultralytics", "--input-path"], "validation pass:"),
    ("bench_loader.py", ["--skip-ultralytics", "--images", "32", "--repeats", "1", "--imgsz", "160", "--batch", "8"],
     "one loader for the run"),
    ("bench_learn.py", ["--smoke"], "wall time"),
    ("bench_render.py", ["--runs", "3"], "ratio:"),
    ("bench_rendezvous.py", ["--runs", "1", "--ranks", "2", "--late", "0.5"], "early / late"),
    ("bench_login.py", ["--runs", "1", "--requeues", "3", "--sweep", "8", "--torchx", "none"], "submit --dry-run"),
    ("bench_decode.py", ["--runs", "1", "--imgsz", "160"], "median Pillow/OpenCV time ratio"),
    ("bench_stage.py", ["--images", "200", "--runs", "1"], "second stage / first"),
    ("bench_startup.py", ["--sizes", "32", "--ranks", "1", "--runs", "1", "--skip-ultralytics"],
     "second start / first"),
    ("bench_checkpoint.py", ["--checkpoints", "1", "--steps", "1", "--classes", "3"], "background / synchronous"),
    ("bench_trainer.py", ["--runs", "1", "--batches", "1"], "RAM cache, 2 ranks on one node"),
    ("bench_rect_val.py", ["--runs", "1", "--imgsz", "160"], "ratio rect / square"),
    ("bench_finetune.py", ["--epochs", "1", "--train", "16"], "mAP50-95 gained by starting from"),
    ("bench_logging.py", ["--runs", "1", "--epochs", "1", "--train", "32"], "per-epoch time on / off"),
    ("bench_health.py", ["--runs", "1", "--epochs", "1", "--train", "32", "--every", "1"], "on / off"),
    ("bench_mosaic_partners.py", ["--sets", "1", "--seeds", "1", "--epochs", "1", "--train", "16"],
     "seed spread"),
    ("bench_cpu.py", ["--pairs", "1", "--epochs", "1", "--train", "16", *UL_VENV], "medians of 1: wall"),
    ("bench_starts.py", ["--starts", "1"], "failed starts: 0 of 1"),
    ("bench_loader_workers.py", ["--images", "16", "--repeats", "1", "--imgsz", "64", "--batch", "4"], "server/fork"),
    ("bench_ultralytics_train.py", ["--skip-ultralytics", "--epochs", "1", "--train", "16", "--seeds", "1",
                                    "--set", "mixup=0.1", "--set", "cos_lr=true"], "last.pt mAP50-95 by hpcyolo val"),
]


def test_every_benchmark_is_listed_here():
    assert sorted(name for name, _, _ in SMOKES) == sorted(p.name for p in (REPO / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("name, args, summary", SMOKES, ids=[name for name, _, _ in SMOKES])
def test_benchmark_runs_to_its_summary(name, args, summary):
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / name), *args], capture_output=True, text=True,
                       timeout=600, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0, f"{name} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert summary in r.stdout, r.stdout[-3000:]
