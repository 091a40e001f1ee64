"""What seeing a run costs: the demo's per-epoch time with everything that
logs and draws on, against with it off.

    .venv/bin/python benchmarks/bench_logging.py [--runs 3] [--epochs 3]
    .venv/bin/python benchmarks/bench_logging.py --runs 1 --epochs 2 --train 32   # plumbing

The demo's settings (the n model, two processes on this machine, global
batch 32, imgsz 160, one loader worker per rank, 800 generated shapes images
and 200 held out), --epochs epochs, --runs pairs run one after the other:
"on" (TensorBoard, the plots, MLflow to a local store and W&B offline, where
those extras are installed) and "off" (--no-tensorboard --no-plots, no
trackers). The same data, seeds and settings on both sides.

Each run's output is read as it comes: its epoch time is the time between
rank 0's epoch lines (the first from its "training" line), which covers
training, validation and everything an epoch writes; the start (process
start to the "training" line: imports, data, the trackers' start) and the
end (the last epoch line to the exit: the last plots, TensorBoard's images,
the trackers' close) are printed apart. Prints the medians over the runs
and the on / off ratio of the mean epoch time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
LAUNCH = "import json, sys; from hpcyolo.node.local import launch; sys.exit(launch(json.loads(sys.argv[1]), 2))"
EPOCH_LINE = re.compile(r"^epoch \d+/\d+: loss ")


def train(data: Path, run: Path, on: bool, args) -> dict:
    """One run's start, epoch and end seconds."""
    extra = ["--no-tensorboard", "--no-plots"]
    if on:
        extra = [*(["--mlflow", "local"] if importlib.util.find_spec("mlflow") else []),
                 *(["--wandb", "bench-logging"] if importlib.util.find_spec("wandb") else [])]
    argv = [str(BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), "--model", "n", "--epochs",
            str(args.epochs), "--batch", "32", "--nbs", "32", "--imgsz", "160", "--workers", "1", "--close-mosaic",
            str(min(3, args.epochs - 1)), "--seed", "0", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // 2)), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(argv)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=env)
    training, marks = None, []
    for line in p.stdout:
        now = time.perf_counter()
        if line.startswith("training ") and training is None:
            training = now
        elif EPOCH_LINE.match(line):
            marks.append(now)
    code = p.wait()
    ended = time.perf_counter()
    if code != 0 or training is None or len(marks) != args.epochs:
        sys.exit(f"bench_logging: {run.name} failed (exit code {code}, {len(marks)} epoch lines)")
    epochs = [b - a for a, b in zip([training, *marks], marks)]
    return {"on": on, "start": training - started, "epochs": epochs, "end": ended - marks[-1], "extra": extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="Pairs of runs (on, then off).")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train", type=int, default=800, help="Training images (a quarter as many held out).")
    args = parser.parse_args()

    from hpcyolo.login.shapes import make_shapes

    root = Path(tempfile.mkdtemp(prefix="bench-logging-"))
    data = make_shapes(root / "shapes", n_train=args.train, n_val=max(8, args.train // 4), imgsz=160, classes=4,
                       seed=0)
    print(f"bench_logging: the demo's settings (n model, 2 processes x 16 images, imgsz 160, {args.train} images, "
          f"{args.epochs} epochs), {args.runs} pair(s) run one after the other", flush=True)
    rows = []
    for k in range(args.runs):
        for on in (True, False):
            row = train(data, root / f"{'on' if on else 'off'}-{k}", on, args)
            rows.append(row)
            print(f"  {'on ' if on else 'off'} {k}: start {row['start']:.1f} s, epochs "
                  f"{' '.join(f'{e:.1f}' for e in row['epochs'])} s, end {row['end']:.1f} s "
                  f"({' '.join(row['extra'])})", flush=True)
    medians = {}
    for on in (True, False):
        mine = [r for r in rows if r["on"] == on]
        medians[on] = {key: statistics.median(statistics.mean(r["epochs"]) if key == "epoch" else r[key]
                                              for r in mine) for key in ("start", "epoch", "end")}
        print(f"{'on ' if on else 'off'}: median of {len(mine)}: start {medians[on]['start']:.1f} s, mean epoch "
              f"{medians[on]['epoch']:.2f} s, end {medians[on]['end']:.1f} s")
    print(f"per-epoch time on / off: {medians[True]['epoch'] / medians[False]['epoch']:.3f}x "
          f"(start {medians[True]['start'] - medians[False]['start']:+.1f} s, "
          f"end {medians[True]['end'] - medians[False]['end']:+.1f} s, once per job)")


if __name__ == "__main__":
    main()
