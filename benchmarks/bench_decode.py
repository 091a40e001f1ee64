"""Which decoder the dataset should use: Pillow or OpenCV, measured.

    .venv/bin/python benchmarks/bench_decode.py [--runs 5] [--imgsz 640]

Times, on the coco8 images and on a few larger generated JPEGs, what the
dataset does per image: decode to an RGB uint8 array ("decode"), and decode
then resize so the long side is --imgsz ("decode+resize"). Both libraries run
alternately in the same loop so machine noise hits them alike, each in one
thread (a DataLoader worker is one process; cv2's own pool is switched off
there too). Prints images/s per library and set, and the median over images of
the Pillow/OpenCV time ratio (> 1: OpenCV is faster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
COCO8 = REPO.parent / "shared" / "datasets" / "coco8" / "images"
LARGE_SIZES = [(1280, 720), (1920, 1080), (4032, 3024)]


def pil_decode(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def cv2_decode(path: Path) -> np.ndarray:
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _target(w: int, h: int, imgsz: int) -> tuple[int, int]:
    r = imgsz / max(w, h)
    return max(1, round(w * r)), max(1, round(h * r))


def pil_decode_resize(path: Path, imgsz: int) -> np.ndarray:
    with Image.open(path) as im:
        im = im.convert("RGB")
        return np.asarray(im.resize(_target(*im.size, imgsz), Image.BILINEAR))


def cv2_decode_resize(path: Path, imgsz: int) -> np.ndarray:
    img = cv2_decode(path)
    h, w = img.shape[:2]
    return cv2.resize(img, _target(w, h, imgsz), interpolation=cv2.INTER_LINEAR)  # as the trainer (decode_resized)


def generate_large(folder: Path) -> list[Path]:
    """Photo-like JPEGs (smooth gradients plus noise and edges, quality 90):
    pure noise would decode unrealistically slowly, flat colour too fast."""
    rng = np.random.default_rng(0)
    paths = []
    for w, h in LARGE_SIZES:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([xx / w * 255, yy / h * 255, (xx + yy) / (w + h) * 255], axis=-1)
        img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        for _ in range(20):
            x, y = int(rng.integers(0, w - 50)), int(rng.integers(0, h - 50))
            cv2.rectangle(img, (x, y), (x + w // 8, y + h // 8), rng.integers(0, 255, 3).tolist(), -1)
        path = folder / f"large_{w}x{h}.jpg"
        Image.fromarray(img).save(path, quality=90)
        paths.append(path)
    return paths


def time_one(fn, path: Path, runs: int) -> float:
    """Best of `runs`: the least disturbed measurement of a short call."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn(path)
        best = min(best, time.perf_counter() - start)
    return best


def compare(paths: list[Path], pil_fn, cv2_fn, runs: int) -> tuple[float, float, float]:
    """(Pillow images/s, OpenCV images/s, median Pillow/OpenCV time ratio)."""
    pil_t, cv_t = [], []
    for path in paths:
        pil_fn(path), cv2_fn(path)  # warm the page cache and library state
        pil_t.append(time_one(pil_fn, path, runs))
        cv_t.append(time_one(cv2_fn, path, runs))
    ratios = [p / c for p, c in zip(pil_t, cv_t)]
    return len(paths) / sum(pil_t), len(paths) / sum(cv_t), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--imgsz", type=int, default=640)
    args = parser.parse_args()
    cv2.setNumThreads(0)  # one thread, as in a DataLoader worker
    coco8 = sorted(COCO8.rglob("*.jpg"))
    with tempfile.TemporaryDirectory() as tmp:
        sets = {"coco8": coco8, "large": generate_large(Path(tmp))}
        print(f"Pillow {Image.__version__}, OpenCV {cv2.__version__}; best of {args.runs} runs per image")
        print(f"{'set':>6} {'op':>14} {'Pillow img/s':>13} {'OpenCV img/s':>13} {'Pillow/OpenCV':>14}")
        ratios = []
        for name, paths in sets.items():
            ops = {
                "decode": (pil_decode, cv2_decode),
                "decode+resize": (lambda p: pil_decode_resize(p, args.imgsz),
                                  lambda p: cv2_decode_resize(p, args.imgsz)),
            }
            for op, (pil_fn, cv2_fn) in ops.items():
                pil_ips, cv_ips, ratio = compare(paths, pil_fn, cv2_fn, args.runs)
                ratios.append(ratio)
                print(f"{name:>6} {op:>14} {pil_ips:13.1f} {cv_ips:13.1f} {ratio:13.2f}x")
    overall = statistics.median(ratios)
    faster = "OpenCV" if overall > 1 else "Pillow"
    print(f"median Pillow/OpenCV time ratio: {overall:.2f} -> {faster} is faster")


if __name__ == "__main__":
    main()
