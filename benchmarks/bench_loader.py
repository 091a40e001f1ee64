"""Training loader throughput: ours against ultralytics', images/s per CPU core.

    bash benchmarks/ultralytics_venv.sh            # once: builds /work/bench-ul-venv
    .venv/bin/python benchmarks/bench_loader.py [--images 320] [--workers 2] [--batch 16] [--repeats 5]

Generates COCO-like data in a temporary folder (ultralytics layout: images/,
labels/, data.yaml): photo-like JPEGs of 640x480-ish pixels and 50-250 KB,
about 7 boxes each. Then times, alternately and on the same images, one epoch
of our training loader (YoloDataset with mosaic, random affine, HSV, flip,
through a DataLoader as `hpcyolo train` builds it) and one of ultralytics'
(build_yolo_dataset + build_dataloader with its default train augmentations,
mosaic on), same imgsz, batch and worker count. Ultralytics runs in a
subprocess with the python of a separate venv (--ul-python, default
/work/bench-ul-venv/bin/python; built by benchmarks/ultralytics_venv.sh, never
a dependency of hpcyolo).

Per core is measured in CPU time, not wall time, so that other load on the
machine does not distort the figure: images delivered after the warm-up
batches, divided by the CPU seconds that the main process and all loader
workers used meanwhile (from /proc). Wall images/s is printed too. Medians
over --repeats, and the median of each repeat's own ratio (ours and
ultralytics' epochs alternate, so a slower spell of the machine hits both).
Ours is measured twice: with the HSV jitter in the loader (as on a CPU) and
with it left to the device (as `hpcyolo train` loads on a GPU, where
photometric.hsv_jitter_batch applies the loader's gains to the batch).
Also printed: where our per-image time goes (one process, one core):
decode, mosaic + affine, HSV + flip, letterbox (the non-mosaic path), the
rest of an item and collate (host-to-device does not exist on CPU); and the
wait for an epoch's first batch after a pause standing in for validation,
with a loader made per epoch and with the trainer's one iterator for the run.

History (2-core VM, medians of 5 epochs of 320 images, ultralytics 8.4.190
without albumentations): before the loader work ours ran at 0.95x
ultralytics per core (decode 11.6 and mosaic + affine 7.0 ms per image: four
decodes per mosaic, a 1280 px canvas). Mosaic partners from the batch (one
decode per image), mosaic and affine as one resize per part, batches stacked
in shared memory: 1.49x. Workers keeping freed buffers
(data.keep_freed_memory): 1.31-1.71x over seven runs. Images written
straight into the batch's shared tensor as channel planes (cv2.split in
place: no transposing copy, no stacking copy): the per-image time 5.85 ->
4.83 ms in one process, 1.51-1.70x over five runs. HSV on the device: 2.19x.
Unchanged code, two later runs on an idle machine: 1.66x and 1.77x (the
repeats' own ratios 1.67x both times); HSV on the device 2.33x and 2.56x.
Mosaic partners drawn from the whole dataset again, four decodes per mosaic
(bench_mosaic_partners.py: those from the batch trained a worse detector):
the figures above predate that and were not measured again. At imgsz 640,
batch 32, 640 images, 3 repeats: 1.07x per core with HSV on the device.
Partners from each batch's pool of recent images (sampler.STREAM, as
ultralytics' buffer): 1.42x per core, 1.95x with HSV on the device (173.0
against 88.7 images/s per core; decode 7.69 of 12.61 ms per image).
Pools of 1000 images around each batch (805d932): 1.31x per core, 1.81x
with HSV on the device (167.9 against 92.7). Each epoch here is a loader of
its own, 20 batches, whose pools reach into the epochs after it: images
decoded for batches this benchmark never loads.
Tried and dropped, slower in alternating A/B runs: collating HWC views with
one transposing copy, OpenCV's RGB decode plus in-place HSV lookups, one
3-channel HSV lookup, persistent_workers (no change per core; the one
iterator for the run gives its benefit, the epoch-start wait, without it).
Decoding at 1/2-1/8 scale (OpenCV's IMREAD_REDUCED, JPEG draft mode) is
1.6x-2.2x faster for 1280-4032 px JPEGs but does nothing for COCO-sized
images at imgsz 640, and it would change the pixels of validation against
ultralytics' reference figures: not adopted.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UL_PYTHON = "/work/bench-ul-venv/bin/python"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SIZES = [(640, 480), (480, 640), (640, 427), (640, 360), (500, 375), (640, 640), (427, 640)]


# == data ====================================================================

def generate(root: Path, count: int, seed: int = 0, first: int = 0) -> Path:
    """COCO-like images and labels, numbered from `first`; returns the data
    YAML (of the whole folder: chunks written in parallel share it)."""
    import cv2
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for sub in ("images/train", "labels/train"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    sizes, boxes = [], 0
    for k in range(first, first + count):
        w, h = SIZES[k % len(SIZES)]
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        phase = rng.uniform(0, 6.28, 3)
        base = np.stack([127 + 100 * np.sin(xx / rng.uniform(20, 90) + phase[c]) * np.cos(yy / rng.uniform(20, 90))
                         for c in range(3)], axis=-1)
        img = np.clip(base + rng.normal(0, rng.uniform(8, 20), base.shape), 0, 255).astype(np.uint8)
        rows = []
        for _ in range(int(np.clip(rng.poisson(7), 1, 20))):
            bw, bh = rng.uniform(0.05, 0.5) * w, rng.uniform(0.05, 0.5) * h
            x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            colour = rng.integers(0, 255, 3).tolist()
            cv2.rectangle(img, (int(x1), int(y1)), (int(x1 + bw), int(y1 + bh)), colour, -1)
            cv2.circle(img, (int(x1 + bw / 2), int(y1 + bh / 2)), int(min(bw, bh) / 3), colour[::-1], -1)
            rows.append(f"{int(rng.integers(0, 80))} {(x1 + bw / 2) / w:.6f} {(y1 + bh / 2) / h:.6f} "
                        f"{bw / w:.6f} {bh / h:.6f}")
        path = root / "images" / "train" / f"{k:06d}.jpg"
        Image.fromarray(img).save(path, quality=int(rng.integers(88, 97)))
        (root / "labels" / "train" / f"{k:06d}.txt").write_text("\n".join(rows) + "\n")
        sizes.append(path.stat().st_size)
        boxes += len(rows)
    names = "\n".join(f"  {i}: class{i}" for i in range(80))
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n{names}\n")
    print(f"data: {count} JPEGs in {root}, {min(sizes) / 1024:.0f}-{max(sizes) / 1024:.0f} KB "
          f"(median {statistics.median(sizes) / 1024:.0f} KB), {boxes / count:.1f} boxes per image")
    return yaml


# == measuring one epoch =====================================================

def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (/proc/PID/stat)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def time_epoch(batches, count: int, workers_of, warmup: int) -> dict:
    """Take `count` batches from the iterator `batches`, ignore the first
    `warmup`, and return images, wall seconds and CPU seconds (this process +
    workers) of the rest, read at the last batch (before workers exit)."""
    images, start = 0, None
    for k in range(count):
        batch = next(batches)
        if k + 1 == warmup:
            pids = workers_of()
            start = (time.perf_counter(), time.process_time(), cpu_seconds(pids))
        elif k >= warmup:
            images += len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch["img"])
    wall = time.perf_counter() - start[0]
    main_cpu = time.process_time() - start[1]
    cpu = main_cpu + cpu_seconds(pids) - start[2]
    return {"images": images, "wall": wall, "cpu": cpu, "main_cpu": main_cpu}


def worker_pids(iterator) -> list[int]:
    return [w.pid for w in getattr(iterator, "_workers", [])]


# == ours ====================================================================

def ours_dataset(yaml: Path, imgsz: int, hsv_on_device: bool = False):
    from hpcyolo_trainer.data.dataset import AugmentHyp, YoloDataset, load_data_spec

    spec = load_data_spec(yaml)
    return YoloDataset(spec.train, imgsz, augment=True, hyp=AugmentHyp(), seed=0, names_count=len(spec.names),
                       hsv_on_device=hsv_on_device)


def ours_epoch(dataset, epoch: int, batch: int, workers: int, warmup: int) -> dict:
    """One epoch as `hpcyolo train` loads it (trainer/run/train.py: RunBatches
    over an EvenShardSampler, our collate, no pinning on CPU)."""
    from torch.utils.data import DataLoader

    from hpcyolo_trainer.data.dataset import collate
    from hpcyolo_trainer.data.sampler import EvenShardSampler, RunBatches
    from hpcyolo_trainer.run.inputs import ignore_signals

    batches = RunBatches(EvenShardSampler(len(dataset), 0, 1, seed=0), batch, epoch, 0, epoch + 1, epoch + 1)
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=workers, collate_fn=collate,
                        worker_init_fn=functools.partial(ignore_signals, ("USR1", "TERM")))
    it = iter(loader)
    return time_epoch(it, len(batches), lambda: worker_pids(it), warmup)


def epoch_start_waits(dataset, batch: int, workers: int, epochs: int = 4, pause: float = 1.0) -> dict:
    """Seconds the training loop waits for each epoch's first batch (epochs
    2+, median), after a `pause` that stands in for validation: with a new
    DataLoader per epoch (workers start, then make the first batch) and
    with the trainer's one iterator for the run (RunBatches), whose workers
    prepared it during the pause."""
    from torch.utils.data import DataLoader

    from hpcyolo_trainer.data.dataset import collate
    from hpcyolo_trainer.data.sampler import EvenShardSampler, RunBatches

    per = math.ceil(len(dataset) / batch)
    waits: dict[str, list[float]] = {"loader per epoch": [], "one loader for the run": []}
    for epoch in range(epochs):
        time.sleep(pause)
        one = RunBatches(EvenShardSampler(len(dataset), 0, 1, seed=0), batch, epoch, 0, epoch + 1, epoch + 1)
        it = iter(DataLoader(dataset, batch_sampler=one, num_workers=workers, collate_fn=collate))
        t = time.perf_counter()
        next(it)
        if epoch:
            waits["loader per epoch"].append(time.perf_counter() - t)
        del it
    whole = RunBatches(EvenShardSampler(len(dataset), 0, 1, seed=0), batch, 0, 0, epochs, epochs)
    it = iter(DataLoader(dataset, batch_sampler=whole, num_workers=workers, collate_fn=collate))
    for epoch in range(epochs):
        time.sleep(pause)
        t = time.perf_counter()
        next(it)
        if epoch:
            waits["one loader for the run"].append(time.perf_counter() - t)
        for _ in range(per - 1):
            next(it)
    return {k: statistics.median(v) for k, v in waits.items()}


def ours_breakdown(dataset, batch: int, batches: int) -> dict:
    """ms per image of each stage, in this process alone: the dataset's own
    functions wrapped with timers, items fetched as a DataLoader worker does."""
    import hpcyolo_trainer.data.augment as augment
    import hpcyolo_trainer.data.dataset as data

    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker
    data.keep_freed_memory()  # likewise
    totals: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    stages = {"decode": ["decode_resized"], "mosaic": ["mosaic4"], "mosaic+affine (one resize/warp)": ["mosaic_affine"],
              "affine (non-mosaic samples)": ["random_affine"],
              "hsv+flip": ["apply_hsv", "flip_lr"], "letterbox": ["letterbox", "letterbox_to"]}
    saved = {}
    for stage, names in stages.items():
        for name in names:
            for module in (data, augment):
                if hasattr(module, name):
                    saved[(module, name)] = getattr(module, name)
                    setattr(module, name, timed(stage, getattr(module, name)))
    try:
        dataset.set_epoch(99)
        order = list(range(len(dataset)))
        images, t_items, t_collate = 0, 0.0, 0.0
        for b in range(batches):
            idx = [order[(b * batch + j) % len(order)] for j in range(batch)]
            t = time.perf_counter()
            items = dataset.__getitems__(idx) if hasattr(dataset, "__getitems__") else [dataset[i] for i in idx]
            t_items += time.perf_counter() - t
            t = time.perf_counter()
            data.collate(items)
            t_collate += time.perf_counter() - t
            images += len(idx)
        per = {k: v / images * 1e3 for k, v in totals.items() if k != "letterbox"}
        per["other (labels, to-tensor)"] = t_items / images * 1e3 - sum(per.values())
        per["collate"] = t_collate / images * 1e3
        per["total"] = (t_items + t_collate) / images * 1e3
        # the letterbox of the non-mosaic path (validation, close-mosaic epochs), timed apart
        loaded = [dataset.load(i)[0] for i in range(min(len(dataset), 64))]
        t = time.perf_counter()
        for img in loaded:
            saved[(augment, "letterbox")](img, dataset.imgsz)
        per["letterbox (non-mosaic path)"] = (time.perf_counter() - t) / len(loaded) * 1e3
    finally:
        for (module, name), fn in saved.items():
            setattr(module, name, fn)
    return per


# == ultralytics (runs in its own venv) ======================================

def ul_child(yaml: str, imgsz: int, batch: int, workers: int, warmup: int, epoch: int) -> None:
    """In the ultralytics venv: one epoch of its training loader; prints JSON."""
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils import DEFAULT_CFG

    torch.manual_seed(epoch)
    cfg = get_cfg(DEFAULT_CFG, {"imgsz": imgsz, "batch": batch, "workers": workers})
    data = check_det_dataset(yaml)
    dataset = build_yolo_dataset(cfg, data["train"], batch, data, mode="train", stride=32)
    loader = build_dataloader(dataset, batch, workers, shuffle=True, rank=-1, device="cpu")
    it = iter(loader)
    result = time_epoch(it, math.ceil(len(dataset) / batch), lambda: worker_pids(loader.iterator), warmup)
    result["workers"] = loader.num_workers
    print("RESULT " + json.dumps(result), flush=True)


def ul_epoch(python: str, yaml: Path, args, epoch: int) -> dict:
    cmd = [python, __file__, "--ul-child", str(yaml), "--imgsz", str(args.imgsz), "--batch", str(args.batch),
           "--workers", str(args.workers), "--warmup", str(args.warmup), "--epoch", str(epoch)]
    env = {**os.environ, "YOLO_CONFIG_DIR": str(yaml.parent / "ul-config"), "YOLO_VERBOSE": "False"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"ultralytics child failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][7:])


# == main ====================================================================

def rates(results: list[dict]) -> tuple[float, float, float]:
    """(median images per CPU second, median wall images/s, median share of
    the CPU time spent in the main process)."""
    return (statistics.median(r["images"] / r["cpu"] for r in results),
            statistics.median(r["images"] / r["wall"] for r in results),
            statistics.median(r["main_cpu"] / r["cpu"] for r in results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=320)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="batches of each epoch not timed")
    p.add_argument("--ul-python", default=UL_PYTHON)
    p.add_argument("--skip-ultralytics", action="store_true")
    p.add_argument("--ul-child", metavar="YAML", help=argparse.SUPPRESS)
    p.add_argument("--epoch", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ul_child:
        ul_child(args.ul_child, args.imgsz, args.batch, args.workers, args.warmup, args.epoch)
        return
    if not args.skip_ultralytics and not Path(args.ul_python).exists():
        sys.exit(f"{args.ul_python} not found: build it with `bash benchmarks/ultralytics_venv.sh` "
                 "(or pass --skip-ultralytics)")

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        yaml = generate(Path(tmp) / "coco-like", args.images)
        dataset = ours_dataset(yaml, args.imgsz)
        on_gpu_node = ours_dataset(yaml, args.imgsz, hsv_on_device=True)
        ours, ours_gpu, ul = [], [], []
        print(f"imgsz {args.imgsz}, batch {args.batch}, {args.workers} workers, {args.repeats} repeats, "
              f"first {args.warmup} batches of each epoch untimed; load average before: {os.getloadavg()}")
        for r in range(args.repeats):  # alternately, so that machine noise hits both alike
            ours.append(ours_epoch(dataset, r, args.batch, args.workers, args.warmup))
            ours_gpu.append(ours_epoch(on_gpu_node, r, args.batch, args.workers, args.warmup))
            if not args.skip_ultralytics:
                ul.append(ul_epoch(args.ul_python, yaml, args, r))
            print(f"  repeat {r + 1}: ours {ours[-1]['images'] / ours[-1]['cpu']:.1f} img/CPU-s "
                  f"(HSV on the device: {ours_gpu[-1]['images'] / ours_gpu[-1]['cpu']:.1f})"
                  + (f", ultralytics {ul[-1]['images'] / ul[-1]['cpu']:.1f} img/CPU-s" if ul else ""), flush=True)
        breakdown = ours_breakdown(dataset, args.batch, batches=max(4, 64 // args.batch))
        starts = epoch_start_waits(dataset, args.batch, args.workers)
        load = os.getloadavg()

    ours_core, ours_wall, ours_main = rates(ours)
    gpu_core, gpu_wall, _ = rates(ours_gpu)
    print(f"\nours:        {ours_core:7.1f} images/s per CPU core   ({ours_wall:.1f} images/s wall, "
          f"{args.workers} workers, {ours_main:.0%} of the CPU time in the main process)")
    print(f"ours, HSV on the device (as `hpcyolo train` loads on a GPU): {gpu_core:.1f} images/s per CPU core "
          f"({gpu_wall:.1f} wall)")
    if ul:
        ul_core, ul_wall, ul_main = rates(ul)
        print(f"ultralytics: {ul_core:7.1f} images/s per CPU core   ({ul_wall:.1f} images/s wall, "
              f"{ul[0]['workers']} workers, {ul_main:.0%} of the CPU time in the main process)")
        paired = statistics.median((o["images"] / o["cpu"]) / (u["images"] / u["cpu"]) for o, u in zip(ours, ul))
        print(f"ratio ours/ultralytics: {ours_core / ul_core:.2f}x per core (target >= 1.5; median of the "
              f"repeats' own ratios {paired:.2f}x), {ours_wall / ul_wall:.2f}x wall")
        print(f"ratio with HSV on the device: {gpu_core / ul_core:.2f}x per core, {gpu_wall / ul_wall:.2f}x wall")
    print("\nour step time per image, one process on one core (ms):")
    for name, ms in breakdown.items():
        print(f"  {name:28s} {ms:6.2f}")
    print("  host-to-device               n/a on CPU (no copy; on CUDA the batch is pinned and copied uint8)")
    print("\nwait for an epoch's first batch after a 1 s pause (validation's stand-in), median of epochs 2-4:")
    for name, seconds in starts.items():
        print(f"  {name:28s} {seconds * 1e3:6.0f} ms")
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
