"""Loader workers forked by the workers' server (parallel/workers.py, what
`hpcyolo train` does) against workers forked by the training process (what
it did before: DataLoader's default, fork): what the server costs.

    .venv/bin/python benchmarks/bench_loader_workers.py [--images 64] [--workers 2] [--repeats 7]

On COCO-like images (bench_loader.py's generator, imgsz 320, batch 16), the
two contexts alternating, medians over --repeats:
- start: from iter() of the training loader (RunBatches, mosaic) to its
  first batch: the workers start and make it; once per run (and per restart);
- validation: one whole pass of a validation loader (no augmentation) over
  the images, its workers started for it, as each epoch's validation does;
- the server's own start: workers.start() (which returns at once), and its
  first worker's answer while the server is still importing torch (a
  run's first loader comes seconds later, after the dataset index and the
  model are built; that wait is the bound of what it can cost).
The server's workers get the dataset pickled (labels and file names; the
image cache is a file, mapped again); fork's copy it with the process.

History (2-core VM, Python 3.11.7, 64 images, 2 workers, 7 repeats, 2026-12-01):
with torch, numpy and the data modules preloaded, start fork 0.181 s, server
0.313 s (1.73x), validation 0.159 / 0.314 s (1.98x); most of that was
modules each worker imported itself (numpy.random's extensions, the
multiprocessing queues, the validation's eval/evaluate.py). With those in
PRELOAD: start 0.173 / 0.167 s (0.96x), validation 0.148 / 0.167 s (1.13x,
+0.020 s an epoch); workers.start() 7 ms, a first loader while the server
still imports torch 1.8 s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# Only what `hpcyolo train`'s main module imports at the top: a worker started
# by the server runs the main module again (spawn's rule), here this script.


def datasets(yaml: Path, imgsz: int):
    from hpcyolo_trainer.data.dataset import AugmentHyp, YoloDataset, load_data_spec

    spec = load_data_spec(yaml)
    train = YoloDataset(spec.train, imgsz, augment=True, hyp=AugmentHyp(), seed=0, names_count=len(spec.names))
    val = YoloDataset(spec.train, imgsz, augment=False, hyp=AugmentHyp(), seed=0, names_count=len(spec.names))
    return train, val


def loader(dataset, batch: int, workers: int, context, augment: bool):
    import functools

    from torch.utils.data import DataLoader

    from hpcyolo_trainer.data.dataset import collate
    from hpcyolo_trainer.data.sampler import EvenShardSampler, RunBatches
    from hpcyolo_trainer.run.inputs import ignore_signals

    init = functools.partial(ignore_signals, ("USR1", "TERM"))
    if augment:
        batches = RunBatches(EvenShardSampler(len(dataset), 0, 1, seed=0), batch, 0, 0, 1, 1)
        return DataLoader(dataset, batch_sampler=batches, num_workers=workers, collate_fn=collate,
                          multiprocessing_context=context, worker_init_fn=init)
    return DataLoader(dataset, batch_size=batch, num_workers=workers, collate_fn=collate,
                      multiprocessing_context=context, worker_init_fn=init)


def first_batch(train, batch: int, workers: int, context) -> float:
    start = time.perf_counter()
    it = iter(loader(train, batch, workers, context, augment=True))
    next(it)
    seconds = time.perf_counter() - start
    del it
    return seconds


def whole_pass(val, batch: int, workers: int, context) -> float:
    start = time.perf_counter()
    for _ in loader(val, batch, workers, context, augment=False):
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import multiprocessing
    import statistics

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_loader import generate

    from hpcyolo_trainer.parallel import workers

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        yaml = generate(Path(tmp) / "data", args.images)
        train, val = datasets(yaml, args.imgsz)
        t = time.perf_counter()
        server = workers.start()
        started = time.perf_counter() - t
        cold = first_batch(train, args.batch, args.workers, server)
        fork = multiprocessing.get_context("fork")
        figures: dict[str, dict[str, list[float]]] = {"fork": {"start": [], "validation": []},
                                                      "server": {"start": [], "validation": []}}
        for _ in range(args.repeats):
            for name, context in (("fork", fork), ("server", server)):
                figures[name]["start"].append(first_batch(train, args.batch, args.workers, context))
                figures[name]["validation"].append(whole_pass(val, args.batch, args.workers, context))
    print(f"ran: {args.images} images at imgsz {args.imgsz}, batch {args.batch}, {args.workers} workers, "
          f"{args.repeats} repeats alternating; torch {torch.__version__}, Python {sys.version.split()[0]}")
    print(f"server: workers.start() {started * 1000:.1f} ms; the first loader's first batch while it imports "
          f"torch: {cold:.2f} s")
    for what in ("start", "validation"):
        f, s = (statistics.median(figures[n][what]) for n in ("fork", "server"))
        print(f"{what:<11} fork {f:.3f} s   server {s:.3f} s   server/fork {s / f:.2f}x   ({s - f:+.3f} s)")


if __name__ == "__main__":
    main()
