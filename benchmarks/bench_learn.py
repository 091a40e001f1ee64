"""Does it learn? The n model from scratch on a generated shapes dataset, on
this machine's CPU.

    .venv/bin/python benchmarks/bench_learn.py [--epochs 12] [--ranks 1]

Generates shapes (800 train / 200 val, 160 px, 4 classes), trains with
`hpcyolo train` (through the local launcher when --ranks > 1), and prints
mAP@0.5, mAP@0.5:0.95 of the best epoch and of the last, and the wall time
of the training command. Target: mAP@0.5 >= 0.6 within 10 minutes.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="Keep the run here instead of a temporary folder.")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes (32 images of 64 px, 1 epoch): plumbing only.")
    args = parser.parse_args()
    n_train, n_val, imgsz = (32, 8, 64) if args.smoke else (800, 200, 160)
    if args.smoke:
        args.epochs = 1
    from hpcyolo.login.shapes import make_shapes
    from hpcyolo.node.local import launch

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        data = make_shapes(root / "shapes", n_train=n_train, n_val=n_val, imgsz=imgsz, classes=4, seed=0)
        run = root / "run"
        argv = [str(BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), "--model", "n",
                "--epochs", str(args.epochs), "--batch", "16", "--nbs", "16", "--imgsz", str(imgsz), "--workers", "1",
                "--close-mosaic", str(min(3, args.epochs - 1))]
        start = time.perf_counter()
        if args.ranks > 1:
            code = launch(argv, args.ranks)
        else:
            code = subprocess.run(argv, env={**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())}).returncode
        wall = time.perf_counter() - start
        if code != 0:
            sys.exit(f"training failed with exit code {code}")
        rows = list(csv.DictReader((run / "results.csv").open()))
        best = max(rows, key=lambda r: float(r["metrics/mAP50(B)"]))
        last = rows[-1]
        print(f"n model, shapes {n_train}/{n_val} at {imgsz} px, {args.epochs} epochs, {args.ranks} rank(s), "
              f"{os.cpu_count()} cores")
        print(f"  last epoch:  mAP50 {float(last['metrics/mAP50(B)']):.3f}  mAP50-95 {float(last['metrics/mAP50-95(B)']):.3f}")
        print(f"  best epoch {best['epoch']}: mAP50 {float(best['metrics/mAP50(B)']):.3f}  "
              f"mAP50-95 {float(best['metrics/mAP50-95(B)']):.3f}")
        ok = float(last["metrics/mAP50(B)"]) >= 0.6 and wall <= 600
        print(f"  wall time {wall:.0f} s; target mAP50 >= 0.6 within 600 s: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
