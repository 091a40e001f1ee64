"""Does fine-tuning pay? yolov8n from the ultralytics reference fixture's
weights (4 classes) against yolov8n from scratch, on a shapes set of another
class count, same settings, on this machine's CPU.

    .venv/bin/python benchmarks/bench_finetune.py [--epochs 3] [--classes 3] [--train 400]

Generates shapes (--train / a quarter as many val images, 160 px, --classes
classes, seed 7), trains each run with `hpcyolo train` (--weights for the
first: its class convs start fresh), then measures each run's last.pt with
`hpcyolo val` and prints mAP50 and mAP50-95 of both and the wall times.
Expected: from the weights clearly above from scratch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
WEIGHTS = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--weights", type=Path, default=WEIGHTS)
    parser.add_argument("--keep", type=Path, help="Keep the runs here instead of a temporary folder.")
    args = parser.parse_args()
    if not args.weights.is_file():
        sys.exit(f"no weights at {args.weights} (give --weights)")
    from hpcyolo.login.shapes import make_shapes

    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        data = make_shapes(root / "shapes", n_train=args.train, n_val=max(1, args.train // 4), imgsz=160,
                           classes=args.classes, seed=7)
        results = {}
        for name, extra in (("from weights", ["--weights", str(args.weights)]),
                            ("from scratch", ["--model", "yolov8n"])):
            run = root / name.replace(" ", "-")
            argv = [str(BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), *extra,
                    "--epochs", str(args.epochs), "--batch", "16", "--nbs", "16", "--imgsz", "160", "--workers", "1",
                    "--close-mosaic", "1", "--seed", "0"]
            start = time.perf_counter()
            code = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL).returncode
            wall = time.perf_counter() - start
            if code != 0:
                sys.exit(f"{name}: training failed with exit code {code}")
            measured = subprocess.run([str(BIN / "hpcyolo"), "val", str(run / "weights" / "last.pt"), "--data",
                                       str(data), "--imgsz", "160", "--batch", "16", "--json"], env=env,
                                      capture_output=True, text=True, check=True)
            results[name] = (json.loads(measured.stdout), wall)
        print(f"yolov8n, shapes {args.train}/{max(1, args.train // 4)} at 160 px with {args.classes} classes, "
              f"{args.epochs} epochs, batch 16, {os.cpu_count()} cores; last.pt by hpcyolo val")
        for name, (r, wall) in results.items():
            print(f"  {name}: mAP50 {r['map50']:.3f}  mAP50-95 {r['map50_95']:.3f}  (training {wall:.0f} s)")
        gain = results["from weights"][0]["map50_95"] - results["from scratch"][0]["map50_95"]
        print(f"  mAP50-95 gained by starting from {args.weights.name}: {gain:+.3f}")


if __name__ == "__main__":
    main()
