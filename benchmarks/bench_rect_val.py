"""Validation time with rectangular batches against the square letterbox.

    .venv/bin/python benchmarks/bench_rect_val.py [--data coco8.yaml] [--weights W | --untrained yolov8n]
                                                  [--imgsz 640] [--batch 16] [--runs 5]

`hpcyolo_trainer.eval.evaluate.evaluate` end to end (decode, letterbox, forward,
NMS, matching) with `rect=True` and `rect=False`, alternating so that machine
noise hits both, on CPU in one process. Rectangular batches sort the images
by aspect ratio and pad each batch only up to its own shape: on photos of
mixed shapes (coco8) the network sees fewer pixels. Printed: the median time
of each, the ratio rect / square, and both mAP50-95.

`--untrained NAME` times a freshly initialised model with the dataset's
classes, for data that no weights at hand were trained on (coco8's 80
classes); its mAP means nothing, its time does.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hpcyolo_trainer.run import checkpoint as ckpt
from hpcyolo_trainer.common.datayaml import load_data_spec
from hpcyolo_trainer.parallel.dist import Dist
from hpcyolo_trainer.eval.evaluate import evaluate
from hpcyolo_trainer.model.detector import build_model

COCO8 = Path("/work/shared/datasets/coco8/coco8.yaml")
ONE = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def untrained_weights(name: str, data: str, imgsz: int, folder: Path) -> str:
    """hpcyolo weights of a fresh `name` model (seed 0) for the classes of `data`."""
    names = load_data_spec(data).names
    torch.manual_seed(0)
    model = build_model(name, len(names))
    path = folder / f"{name}-untrained.pt"
    ckpt.save({"model": model.state_dict(), "scale": model.arch, "names": list(names), "imgsz": imgsz}, path)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(COCO8))
    parser.add_argument("--weights")
    parser.add_argument("--untrained", default="yolov8n", help="used when --weights is not given")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        weights = args.weights or untrained_weights(args.untrained, args.data, args.imgsz, Path(tmp))
        times: dict[bool, list[float]] = {True: [], False: []}
        maps: dict[bool, float] = {}
        for _ in range(args.runs):
            for rect in (True, False):
                t0 = time.perf_counter()
                result = evaluate(ONE, weights, args.data, imgsz=args.imgsz, batch=args.batch, rect=rect,
                                  warn=lambda m: None)
                times[rect].append(time.perf_counter() - t0)
                maps[rect] = result["map50_95"]
    rect, square = statistics.median(times[True]), statistics.median(times[False])
    print(f"{Path(args.data).name}, {Path(weights).name if args.weights else args.untrained + ' (untrained)'}, "
          f"imgsz {args.imgsz}, batch {args.batch}, {args.runs} runs, {torch.get_num_threads()} threads")
    print(f"rect    {rect:8.3f} s   mAP50-95 {maps[True]:.4f}")
    print(f"square  {square:8.3f} s   mAP50-95 {maps[False]:.4f}")
    print(f"ratio rect / square: {rect / square:.3f}")


if __name__ == "__main__":
    main()
