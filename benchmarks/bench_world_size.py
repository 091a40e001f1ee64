"""One rank against many, end to end: does a run learn the same with 1, 2 and
4 processes at the same global batch?

    .venv/bin/python benchmarks/bench_world_size.py [--epochs 12] [--layouts 1,2,4] [--seeds 3]
    .venv/bin/python benchmarks/bench_world_size.py --smoke     # plumbing only, in about a minute

Generates the demo's shapes set (800 train / 200 held-out val images, 160 px,
4 classes), trains the n model with `hpcyolo train` through the local launcher
--seeds times per layout (seeds 0, 1, ...; same global batch, nbs and epochs:
only the number of processes differs). Prints the final mAP50-95 (and
mAP50) of each run, the one-process mean and spread (the band: the spread,
or the mean +- 0.02, whichever is wider), and per multi-process layout its
mean and whether that mean and each of its runs lie within the band. A
multi-process run draws its augmentation per rank, so even exact maths
gives another sample of the seed-to-seed spread: compare the means.

BatchNorm normalises over the whole global batch at any layout (SyncBatchNorm
on GPUs, trainer/parallel/syncbn.py on CPU process groups), so nothing in the maths
depends on the split; what is left is the order of floating-point sums and
the loader's augmentation draws per rank.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
MARGIN = 0.02  # the band around the one-process mean when the seeds agree more closely than this


def train(data: Path, run: Path, nproc: int, seed: int, args) -> tuple[dict, float]:
    """The last results.csv row of one run, and its wall time."""
    from hpcyolo.node.local import launch

    argv = [str(BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), "--model", "n",
            "--epochs", str(args.epochs), "--batch", str(args.batch), "--nbs", str(args.batch), "--imgsz",
            str(args.imgsz), "--workers", "1", "--close-mosaic", str(min(3, args.epochs - 1)), "--seed", str(seed)]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
    start = time.perf_counter()
    code = launch(argv, nproc, env=env)
    wall = time.perf_counter() - start
    if code != 0:
        sys.exit(f"bench_world_size: {nproc} process(es), seed {seed}: training failed with exit code {code}")
    return list(csv.DictReader((run / "results.csv").open()))[-1], wall


def verdict(value: float, lo: float, hi: float) -> str:
    return "within" if lo <= value <= hi else "OUTSIDE"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12,
                        help="Epochs per run. At 6 the runs are still in the noisy early climb (mAP50-95 about "
                             "0.1): 12 reaches the phase where the layouts can be compared.")
    parser.add_argument("--batch", type=int, default=32, help="Global batch (and nbs), as the demo job.")
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--train-images", type=int, default=800)
    parser.add_argument("--val-images", type=int, default=200)
    parser.add_argument("--layouts", default="1,2,4", help="Process counts, comma-separated.")
    parser.add_argument("--seeds", type=int, default=3, help="Runs per layout, with seeds 0..N-1.")
    parser.add_argument("--smoke", action="store_true",
                        help="Tiny sizes (16 images of 64 px, 1 epoch, 1 process with 2 seeds and 2 processes with "
                             "1): plumbing only.")
    parser.add_argument("--keep", type=Path, help="Keep dataset and runs here instead of a temporary folder.")
    args = parser.parse_args()
    if args.smoke:
        args.epochs, args.batch, args.imgsz, args.train_images, args.val_images = 1, 8, 64, 16, 4
        args.layouts, args.seeds = "1,2", 2
    layouts = [int(n) for n in args.layouts.split(",")]
    if any(n < 1 or args.batch % n for n in layouts) or args.seeds < 2 or args.epochs < 2 and not args.smoke:
        sys.exit("bench_world_size: each layout must divide --batch, --seeds >= 2, --epochs >= 2")
    from hpcyolo.login.shapes import make_shapes

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        data = make_shapes(root / "shapes", n_train=args.train_images, n_val=args.val_images, imgsz=args.imgsz,
                           classes=4, seed=0)
        print(f"bench_world_size: n model from scratch, shapes {args.train_images} train / {args.val_images} held-out "
              f"val at {args.imgsz} px, global batch {args.batch} (nbs {args.batch}), {args.epochs} epochs, SGD, "
              f"{os.cpu_count()} cores, OMP threads = cores / processes", flush=True)
        runs = []  # (processes, seed, last row, wall)
        for n in sorted(set(layouts) | {1}):
            # The smoke's multi-process layout trains one seed: the band needs two one-process seeds, not more.
            for seed in range(1 if args.smoke and n > 1 else args.seeds):
                runs.append((n, seed, *train(data, root / f"run-{n}x-seed{seed}", n, seed, args)))
                print(f"  done: {n} process(es), seed {seed}", flush=True)

    print("\n| processes x images | seed | mAP50-95 | mAP50 | wall s |")
    print("|---|---|---|---|---|")
    for n, seed, row, wall in runs:
        print(f"| {n} x {args.batch // n} | {seed} | {float(row['metrics/mAP50-95(B)']):.3f} | "
              f"{float(row['metrics/mAP50(B)']):.3f} | {wall:.0f} |")
    single = [float(row["metrics/mAP50-95(B)"]) for n, _, row, _ in runs if n == 1]
    mean = statistics.mean(single)
    lo, hi = min(min(single), mean - MARGIN), max(max(single), mean + MARGIN)
    print(f"\n1 process, {len(single)} seeds: mAP50-95 mean {mean:.3f}, spread {min(single):.3f} .. {max(single):.3f} "
          f"(stdev {statistics.stdev(single):.3f}); band {lo:.3f} .. {hi:.3f} (the spread, or mean +- {MARGIN})")
    for n in sorted(set(layouts) - {1}):
        values = [float(row["metrics/mAP50-95(B)"]) for m, _, row, _ in runs if m == n]
        within = sum(lo <= v <= hi for v in values)
        layout_mean = statistics.mean(values)
        print(f"{n} processes x {args.batch // n}, {len(values)} seeds: mAP50-95 "
              f"{' '.join(f'{v:.3f}' for v in values)}, mean {layout_mean:.3f} ({layout_mean - mean:+.3f} from the "
              f"one-process mean): mean {verdict(layout_mean, lo, hi)} the band, {within} of {len(values)} runs within")
    if args.smoke:
        print("(smoke: tiny sizes, the figures mean nothing)")


if __name__ == "__main__":
    main()
