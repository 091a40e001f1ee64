"""What the hang watchdog, the straggler report and torch's flight recorder
cost a training step: the demo's step time with all on, against all off.

    .venv/bin/python benchmarks/bench_health.py [--runs 3] [--epochs 3] [--every 10]
    .venv/bin/python benchmarks/bench_health.py --runs 1 --epochs 1 --train 64   # plumbing

The demo's settings (the n model, two processes on this machine, global
batch 32, imgsz 160, one loader worker per rank, 800 generated shapes images
and 200 held out), --epochs epochs, --runs pairs run one after the other:
"on" (the watchdog at its defaults, run.hang_factor 10, and the ranks
sharing their times every --every steps: more often than the default 50, so
that a 25-step epoch holds some; torch's flight recorder at hpcyolo's 2000
entries) and "off" (--hang-factor 0 --straggler-every 0,
TORCH_FR_BUFFER_SIZE=0). TensorBoard and the plots are off on both sides; the
same data, seeds and settings otherwise.

A run's step time is its training loop's time per optimizer step, from
results.csv (the `time` column, the loops' time so far as ultralytics keeps
it: an epoch's is its row's less the row before, over the epoch's steps).
Prints each run's per-epoch step times, the medians over all epochs of all
runs of each side, and the on / off ratio.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
LAUNCH = "import json, sys; from hpcyolo.node.local import launch; sys.exit(launch(json.loads(sys.argv[1]), 2))"


def train(data: Path, run: Path, on: bool, args) -> list[float]:
    """One run's seconds per optimizer step, one figure per epoch."""
    extra = ["--straggler-every", str(args.every)] if on else ["--hang-factor", "0", "--straggler-every", "0"]
    argv = [str(BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), "--model", "n", "--epochs",
            str(args.epochs), "--batch", "32", "--nbs", "32", "--imgsz", "160", "--workers", "1", "--close-mosaic",
            "0", "--seed", "0", "--no-tensorboard", "--no-plots", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // 2)), "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    if not on:
        env["TORCH_FR_BUFFER_SIZE"] = "0"  # hpcyolo keeps a value the environment sets
    code = subprocess.run([sys.executable, "-c", LAUNCH, json.dumps(argv)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env).returncode
    if code != 0:
        sys.exit(f"bench_health: {run.name} failed (exit code {code})")
    steps = -(-args.train // 32)
    with open(run / "results.csv", newline="") as f:
        elapsed = [float(row["time"]) for row in csv.DictReader(f)]  # ultralytics' column: the run's time so far
    return [(b - a) / steps for a, b in zip([0.0, *elapsed], elapsed)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="Pairs of runs (on, then off).")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every", type=int, default=10, help="Steps between the ranks' sharing of their times.")
    parser.add_argument("--train", type=int, default=800, help="Training images (a quarter as many held out).")
    args = parser.parse_args()

    from hpcyolo.login.shapes import make_shapes

    root = Path(tempfile.mkdtemp(prefix="bench-health-"))
    data = make_shapes(root / "shapes", n_train=args.train, n_val=max(8, args.train // 4), imgsz=160, classes=4,
                       seed=0)
    print(f"bench_health: the demo's settings (n model, 2 processes x 16 images, imgsz 160, {args.train} images, "
          f"{args.epochs} epochs), {args.runs} pair(s) run one after the other; on: watchdog (hang_factor 10) and "
          f"straggler sharing every {args.every} steps, flight recorder (2000); off: --hang-factor 0 "
          "--straggler-every 0 TORCH_FR_BUFFER_SIZE=0", flush=True)
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(args.runs):
        for on in (True, False):
            per_epoch = train(data, root / f"{'on' if on else 'off'}-{k}", on, args)
            times[on] += per_epoch
            print(f"  {'on ' if on else 'off'} {k}: seconds per step by epoch "
                  f"{' '.join(f'{t:.4f}' for t in per_epoch)}", flush=True)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"median step: on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms (of {len(times[True])} and {len(times[False])} "
          f"epochs); on / off {on / off:.3f}x")


if __name__ == "__main__":
    main()
