"""The trainer's cost, measured on this machine (CPU).

    .venv/bin/python benchmarks/bench_trainer.py [--runs 3] [--batches 24]

1. Step time: `hpcyolo train` (one rank) against a minimal hand-written loop
   with the same model, batch, data and loader: forward, loss, backward, SGD
   step, nothing else. Target: at most 5% overhead. Both run as fresh
   processes, alternately; the figure is the median seconds per batch of the
   training loop (the trainer's own epoch time, without validation).
2. Loader throughput: images/s through a DataLoader, uncached vs RAM-cached.
3. Memory: two ranks on one node with the RAM cache: each rank's resident and
   proportional share (PSS) of the cache mapping; the sum of the PSS is what
   the node holds.
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
import time
from pathlib import Path

BIN = Path(sys.executable).parent
IMGSZ, BATCH = 160, 16

MINIMAL = """
import sys, time, torch
from torch.utils.data import DataLoader
from hpcyolo_trainer.data.dataset import YoloDataset, load_data_spec, collate, AugmentHyp
from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.optim.loss import DetectionLoss
data, imgsz, batch, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
spec = load_data_spec(data)
ds = YoloDataset(spec.train, imgsz, augment=True, hyp=AugmentHyp(), seed=0, names_count=len(spec.names))
ds.set_epoch(0)
torch.manual_seed(0)
model = build_model("n", len(spec.names)).train()
loss_fn = DetectionLoss(len(spec.names))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=1, collate_fn=collate)
t0 = time.perf_counter()
for i, (imgs, targets, _, _) in enumerate(loader):
    loss, _ = loss_fn(model(imgs.float() / 255), targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if i + 1 == batches:
        break
print((time.perf_counter() - t0) / batches)
"""

CACHE_PROBE = """
import json, os, sys, time
from hpcyolo_trainer.data.dataset import YoloDataset, load_data_spec, cache_bytes
spec = load_data_spec(sys.argv[1])
ds = YoloDataset(spec.train, int(sys.argv[2]), augment=False, cache="ram", cache_dir=sys.argv[3],
                 names_count=len(spec.names))
for i in range(len(ds)):
    ds[i]


def barrier(name):  # both ranks hold the mapping while either reads smaps
    open(os.path.join(sys.argv[4], f"{name}-{os.environ['RANK']}"), "w").close()
    while not all(os.path.exists(os.path.join(sys.argv[4], f"{name}-{r}")) for r in range(2)):
        time.sleep(0.05)


barrier("mapped")
rss = pss = 0
with open("/proc/self/smaps") as f:
    inside = False
    for line in f:
        if "-" in line.split()[0] and len(line.split()) >= 5:
            inside = line.rstrip().endswith("images.u8")
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1])
        elif inside and line.startswith("Pss:"):
            pss += int(line.split()[1])
report = {"rank": int(os.environ["RANK"]), "rss_kb": rss, "pss_kb": pss, "cache_bytes": cache_bytes(ds)}
with open(os.path.join(sys.argv[4], f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump(report, f)
barrier("measured")
"""


def shapes(root: Path, n_train: int) -> Path:
    from hpcyolo.login.shapes import make_shapes

    return make_shapes(root / "shapes", n_train=n_train, n_val=16, imgsz=IMGSZ, seed=0)


def trainer_step(data: Path, run: Path, batches: int) -> float:
    subprocess.run([str(BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), "--epochs", "1",
                    "--batch", str(BATCH), "--nbs", str(BATCH), "--imgsz", str(IMGSZ), "--workers", "1"],
                   check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    row = next(csv.DictReader((run / "results.csv").open()))
    return float(row["time"]) / batches


def minimal_step(data: Path, batches: int) -> float:
    out = subprocess.run([sys.executable, "-c", MINIMAL, str(data), str(IMGSZ), str(BATCH), str(batches)],
                         check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    return float(out.stdout.strip().splitlines()[-1])


def loader_rate(data: Path, cache: str, cache_dir: Path, workers: int) -> float:
    from torch.utils.data import DataLoader

    from hpcyolo_trainer.data.dataset import AugmentHyp, YoloDataset, collate, load_data_spec

    spec = load_data_spec(data)
    ds = YoloDataset(spec.train, IMGSZ, augment=True, hyp=AugmentHyp(), seed=0, cache=cache, cache_dir=cache_dir,
                     names_count=len(spec.names))
    ds.set_epoch(0)
    t0 = time.perf_counter()
    n = sum(len(b[0]) for b in DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate))
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        root = Path(tmp)
        data = shapes(root, args.batches * BATCH)

        trainer, minimal = [], []
        for r in range(args.runs):
            trainer.append(trainer_step(data, root / f"run{r}", args.batches))
            minimal.append(minimal_step(data, args.batches))
        t, m = statistics.median(trainer), statistics.median(minimal)
        print(f"step time, n model, batch {BATCH}, {IMGSZ} px, 1 rank, {args.batches} batches x {args.runs} runs:")
        print(f"  minimal loop: median {m * 1000:.0f} ms/batch  {[round(x * 1000) for x in minimal]}")
        print(f"  hpcyolo train: median {t * 1000:.0f} ms/batch  {[round(x * 1000) for x in trainer]}")
        print(f"  overhead: {100 * (t / m - 1):+.1f}% (target: at most +5%)")

        for workers in (0, 2):
            rates = {c: statistics.median(loader_rate(data, c, root / f"cache-{c}-{workers}", workers)
                                          for _ in range(args.runs)) for c in ("none", "ram")}
            print(f"loader, {workers} workers: uncached {rates['none']:.0f} images/s, RAM-cached {rates['ram']:.0f} "
                  f"images/s ({rates['ram'] / rates['none']:.2f}x)")

        from hpcyolo.node.local import launch

        probe = [sys.executable, "-c", CACHE_PROBE, str(data), str(IMGSZ), str(root / "ramcache"), str(root)]
        assert launch(probe, 2) == 0
        reports = [json.loads((root / f"rank-{r}.json").read_text()) for r in range(2)]
        size = reports[0]["cache_bytes"] / 2**20
        print(f"RAM cache, 2 ranks on one node: cache file {size:.1f} MiB; per rank resident "
              f"{[round(r['rss_kb'] / 1024, 1) for r in reports]} MiB, proportional "
              f"{[round(r['pss_kb'] / 1024, 1) for r in reports]} MiB; node total (sum of PSS) "
              f"{sum(r['pss_kb'] for r in reports) / 1024:.1f} MiB = "
              f"{sum(r['pss_kb'] for r in reports) / 1024 / size:.2f} copies")


if __name__ == "__main__":
    main()
