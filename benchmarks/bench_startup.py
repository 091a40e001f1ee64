"""Start-up: the time from `hpcyolo train` start to its first optimizer step,
at a first start (no dataset index anywhere), a second one (the index in the
run directory, the dataset unchanged, as after a requeue) and a new run's
first start on the same data (another run directory: the index in the user's
cache, as for the next element of a sweep), and the files each rank opens
under the dataset before it exits; the same for ultralytics' trainer on the
same data (first start: no labels.cache; cached start, which is both its
requeue and its new run).

    .venv/bin/python benchmarks/bench_startup.py [--sizes 1000,10000,50000] [--ranks 1,4] [--runs 3]
    .venv/bin/python benchmarks/bench_startup.py --sizes 64 --ranks 1 --runs 1 --skip-ultralytics   # smoke
    .venv/bin/python benchmarks/bench_startup.py --sizes 50000 --ranks 1 --skip-ultralytics \
        --baseline /work/main/.venv/bin/hpcyolo --datasets /tmp/bench-startup-data   # against another checkout

Generates one dataset per size: SIZE training images (tiny JPEGs: the cost is
per file, not per pixel) with COCO-like label files (a mean of about 7 boxes,
about 1% background images), and SIZE/25 validation images. Each start runs
with the drill HPCYOLO_DRILL_KILL=HOST:1 (every rank kills itself after the
first optimizer step), so its wall time, from launch to exit, is the time to
the first step. Ultralytics runs in its benchmark venv with a callback that
ends the process at its first on_train_batch_end (nbs = batch: a step per
batch), one process (its DDP needs CUDA). Opens are counted by a
sitecustomize audit hook (the `open` event: Python's and Pillow's opens;
OpenCV's reads of the first batches' images are C-level and not counted),
per process, summed per rank (its loader workers included); the other
starts of a repetition are measured the same way. Medians of --runs; the
ratio is the median of second / first start, each pair measured in the same
repetition. --baseline HPCYOLO: another checkout's `hpcyolo` (its venv's),
started the same way in each repetition, before ours (its commit printed);
--datasets DIR: the generated datasets kept there and used again by a later
run (generated anew where DIR has none of that size). "set-up" is the part of our start from the process group's set-up
to the training loop (data, model, resume: rank 0's ledger); the rest is
Python's and torch's imports, the rendezvous and the first step. "floor", per rank count N: N fresh
processes started at once, to the end of the last one's `import torch`
(with N ranks sharing this machine's cores, their imports compete), measured
first; the summary gives it as a fraction of each first start of N ranks,
the least a second start's ratio can be.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent
UL_PYTHON = "/work/bench-ul-venv/bin/python"
IMGSZ = 64
BATCH = 16
AUDIT_SITE = Path(__file__).resolve().parent / "audit_opens"  # its sitecustomize.py logs the opens
UL_TRAIN = """
import json, os, sys
from ultralytics import YOLO
args = json.loads(sys.argv[1])
model = YOLO(args.pop("model"))
model.add_callback("on_train_batch_end", lambda trainer: os._exit(0))  # the first batch's optimizer step is done
model.train(**args)
"""


def make_dataset(folder: Path, n: int, seed: int = 0) -> Path:
    """n training and n/25 validation images, 64 px JPEGs, with COCO-like label files."""
    import cv2

    rng = np.random.default_rng(seed)
    blobs = [cv2.imencode(".jpg", rng.integers(0, 255, (IMGSZ, IMGSZ, 3), dtype=np.uint8))[1].tobytes()
             for _ in range(16)]
    for split, count in (("train", n), ("val", max(16, n // 25))):
        images, labels = folder / "images" / split, folder / "labels" / split
        images.mkdir(parents=True)
        labels.mkdir(parents=True)
        for i in range(count):
            (images / f"{i:07d}.jpg").write_bytes(blobs[i % len(blobs)])
            boxes = 0 if rng.random() < 0.01 else 1 + min(int(rng.geometric(1 / 7)), 60)
            rows = [f"{rng.integers(0, 80)} {rng.uniform(0.2, 0.8):.6f} {rng.uniform(0.2, 0.8):.6f} "
                    f"{rng.uniform(0.05, 0.3):.6f} {rng.uniform(0.05, 0.3):.6f}" for _ in range(boxes)]
            (labels / f"{i:07d}.txt").write_text("\n".join(rows) + ("\n" if rows else ""))
    names = "\n".join(f"  {k}: c{k}" for k in range(80))
    (folder / "data.yaml").write_text(f"path: {folder}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return folder / "data.yaml"


def opens(log: Path, root: Path) -> dict[str, Counter]:
    """Per rank: files opened under the dataset, labels and images."""
    out: dict[str, Counter] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        rank, _, path = line.split(" ", 2)
        kind = "labels" if path.startswith(str(root / "labels")) else "images" \
            if path.startswith(str(root / "images")) else "other"
        out.setdefault(rank, Counter())[kind] += 1
    return out


def audit_env(site: Path, root: Path, log: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
            "AUDIT_ROOT": str(root), "AUDIT_LOG": str(log)}


def ours(data: Path, run: Path, nproc: int, site: Path, log: Path, hpcyolo: str = str(BIN / "hpcyolo"),
         cache: Path | None = None) -> tuple[float, float]:
    """One start of `hpcyolo train` (the executable `hpcyolo`) to its first
    optimizer step: seconds, and of them rank 0's set-up (data, model,
    resume: its ledger's setup to loop). `cache`: its XDG_CACHE_HOME (the
    user's cache of dataset indexes)."""
    from hpcyolo.node.local import launch

    argv = [hpcyolo, "train", "--run-dir", str(run), "--data", str(data), "--model", "n",
            "--imgsz", str(IMGSZ), "--epochs", "1", "--batch", str(BATCH), "--nbs", str(BATCH), "--workers", "0",
            "--no-plots"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc)),
           "HPCYOLO_DRILL_KILL": f"{socket.gethostname()}:1", **audit_env(site, data.parent, log),
           **({"XDG_CACHE_HOME": str(cache)} if cache else {})}
    start = time.perf_counter()
    with open(log.with_suffix(".out"), "w") as out:
        code = run_quiet(lambda: launch(argv, nproc, env=env), out)
    seconds = time.perf_counter() - start
    if code != -9 or "drill: killing this rank" not in log.with_suffix(".out").read_text():
        sys.exit(f"bench_startup: hpcyolo train ({nproc} rank(s)) did not reach its first step (exit {code}); "
                 f"see {log.with_suffix('.out')}")
    times = json.loads((run / "ledger" / "local-0.json").read_text())["times"]
    return seconds, times["loop"] - times["setup"]


def run_quiet(fn, out):
    """fn() with this process's stdout and stderr (which the ranks inherit) sent to `out`."""
    saved = [os.dup(1), os.dup(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    try:
        return fn()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def theirs(args, data: Path, project: Path, site: Path, log: Path) -> float:
    """One start of ultralytics' trainer to its first optimizer step: seconds."""
    ul = {"model": "yolov8n.yaml", "data": str(data), "epochs": 1, "imgsz": IMGSZ, "batch": BATCH, "nbs": BATCH,
          "workers": 0, "device": "cpu", "amp": False, "plots": False, "val": False, "project": str(project),
          "name": "ul", "exist_ok": True, "verbose": False}
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1), "YOLO_CONFIG_DIR": str(project / "ul-config"),
           "YOLO_OFFLINE": "1", **audit_env(site, data.parent, log)}
    start = time.perf_counter()
    with open(log.with_suffix(".out"), "w") as out:
        r = subprocess.run([args.ul_python, "-c", UL_TRAIN, json.dumps(ul)], stdout=out, stderr=out, env=env)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"bench_startup: ultralytics exited {r.returncode}; see {log.with_suffix('.out')}")
    return seconds


def torch_floor(runs: int, nproc: int) -> float:
    """Median seconds from launching `nproc` fresh `python` processes at once
    (each with the OMP_NUM_THREADS a rank of that many gets) to the end of
    the last one's `import torch`, their exits not counted: the part of every
    start with that many ranks on this machine, first or second, that no
    index can save."""
    code = "import os, sys, time, torch; sys.stdout.write(repr(time.time())); sys.stdout.flush(); os._exit(0)"
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
    times = []
    for _ in range(runs):
        start = time.time()
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
                 for _ in range(nproc)]
        ends = [float(p.communicate()[0]) for p in procs]
        if any(p.returncode for p in procs):
            sys.exit("bench_startup: `python -c 'import torch'` failed")
        times.append(max(ends) - start)
    return statistics.median(times)


def commit_of(hpcyolo: str) -> str:
    """The checkout the `hpcyolo` executable runs (its venv's package): its commit, and whether it has changes."""
    python = Path(hpcyolo).parent / "python"
    where = subprocess.run([str(python), "-c", "import hpcyolo_trainer, os; print(os.path.dirname("
                            "hpcyolo_trainer.__file__))"], capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", where or ".", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", where or ".", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return f"{where}: commit {head or '?'}{' with uncommitted changes' if dirty else ''}"


def dataset(args, tmp: Path, n: int) -> Path:
    """The data YAML of the generated dataset of n images: made in tmp, or kept in (and taken from) --datasets."""
    if not args.datasets:
        return make_dataset(tmp / f"data-{n}", n)
    folder = Path(args.datasets) / f"data-{n}"
    if (folder / "complete").exists():
        print(f"\n{n} training images: using {folder}, generated by an earlier run", flush=True)
        return folder / "data.yaml"
    shutil.rmtree(folder, ignore_errors=True)
    data = make_dataset(folder, n)
    (folder / "complete").write_text("")
    return data


def per_rank(counts: dict[str, Counter], kind: str) -> str:
    """Opens of `kind` by rank 0, and by the busiest other rank where there are others."""
    zero = counts.get("0", Counter())[kind]
    others = [c[kind] for rank, c in counts.items() if rank != "0"]
    return f"{zero}" if not others else f"{zero} (0), {max(others)} (others)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,50000", help="training images per dataset, comma-separated")
    parser.add_argument("--ranks", default="1,4", help="processes per hpcyolo start, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="repetitions (each: a first and a second start)")
    parser.add_argument("--skip-ultralytics", action="store_true")
    parser.add_argument("--ul-python", default=UL_PYTHON)
    parser.add_argument("--keep", action="store_true", help="keep the generated datasets and runs")
    parser.add_argument("--baseline", help="another checkout's hpcyolo executable, measured the same way")
    parser.add_argument("--datasets", help="a folder to keep the generated datasets in and take them from")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ranks = [int(r) for r in args.ranks.split(",")]
    if not args.skip_ultralytics and not Path(args.ul_python).exists():
        sys.exit(f"bench_startup: no {args.ul_python}: run `bash benchmarks/ultralytics_venv.sh` or --skip-ultralytics")
    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    site = AUDIT_SITE
    print(f"{os.cpu_count()} CPUs; hpcyolo train --model n --imgsz {IMGSZ} --batch {BATCH} --nbs {BATCH} "
          f"--workers 0 --no-plots, HPCYOLO_DRILL_KILL=HOST:1; ultralytics: YOLO('yolov8n.yaml').train(imgsz={IMGSZ}, "
          f"batch={BATCH}, nbs={BATCH}, workers=0, device='cpu', val=False, plots=False) ending at its first "
          f"on_train_batch_end; {args.runs} repetition(s), medians", flush=True)
    ours_bin = str(BIN / "hpcyolo")
    print(f"hpcyolo: {ours_bin} ({commit_of(ours_bin)})", flush=True)
    if args.baseline:
        print(f"baseline: {args.baseline} ({commit_of(args.baseline)})", flush=True)
    floors = {r: torch_floor(max(3, args.runs), r) for r in ranks}
    for r, seconds in floors.items():
        print(f"floor, {r} rank(s): {r} fresh process(es) started at once, Python's start and `import torch`, take "
              f"{seconds:.2f} s to the last one's end (median of {max(3, args.runs)})", flush=True)
    rows, nprocs = [], {}
    try:
        for n in sizes:
            t0 = time.perf_counter()
            data = dataset(args, tmp, n)
            print(f"\n{n} training images ready in {time.perf_counter() - t0:.1f} s ({data.parent})", flush=True)
            sides = [(f"hpcyolo, {r} rank(s)", r, ours_bin) for r in ranks]
            if args.baseline:  # each repetition: the baseline's pair of starts, then ours
                sides = [(f"baseline, {r} rank(s)", r, args.baseline) for r in ranks] + sides
            sides += [] if args.skip_ultralytics else [("ultralytics, 1 process", 0, None)]
            nprocs.update((name, nproc) for name, nproc, _ in sides)
            results = {}
            for rep in range(args.runs):
                for name, nproc, hpcyolo in sides:
                    first, second, fresh, counts, setup = results.setdefault(name, ([], [], [], {}, ([], [], [])))
                    kinds = ("first", "second", "new run") if nproc else ("first", "second")
                    tag = f"{n}-{name.split(',')[0]}-{nproc}-{rep}"
                    logs = [tmp / f"{tag}-{k.replace(' ', '-')}.log" for k in kinds]
                    if nproc:
                        run, new, cache = tmp / f"run-{tag}", tmp / f"run-{tag}-new", tmp / f"cache-{tag}"
                        for times, part, log, folder in zip((first, second, fresh), setup, logs, (run, run, new)):
                            # The first start finds no index anywhere (`cache` is empty); the new run the cache's.
                            seconds, inside = ours(data, folder, nproc, site, log, hpcyolo, cache)
                            times.append(seconds)
                            part.append(inside)
                        for folder in (run, new, cache):
                            shutil.rmtree(folder)
                    else:
                        for cache in (data.parent / "labels").glob("*.cache"):
                            cache.unlink()
                        first.append(theirs(args, data, tmp / "ul", site, logs[0]))
                        second.append(theirs(args, data, tmp / "ul", site, logs[1]))
                    counts.update({k: opens(log, data.parent) for k, log in zip(kinds, logs)})
                    print(f"  {name}, repetition {rep + 1}: first start {first[-1]:.2f} s, second "
                          f"{second[-1]:.2f} s" + (f", new run {fresh[-1]:.2f} s" if fresh else ""), flush=True)
            for name, (first, second, fresh, counts, setup) in results.items():
                a, b = statistics.median(first), statistics.median(second)
                ratio = statistics.median(y / x for x, y in zip(first, second))
                c = statistics.median(fresh) if fresh else None
                new_ratio = statistics.median(y / x for x, y in zip(first, fresh)) if fresh else None
                parts = " / ".join(f"{statistics.median(p):.2f}" for p in setup) if setup[0] else "n/a"
                print(f"  {name}: medians {a:.2f} s, {b:.2f} s, second / first {ratio:.3f}"
                      + (f"; new run {c:.2f} s, new run / first {new_ratio:.3f}" if fresh else ""), flush=True)
                rows.append((n, name, a, b, ratio, "n/a" if c is None else f"{c:.2f}",
                             "n/a" if new_ratio is None else f"{new_ratio:.3f}", parts,
                             *(per_rank(counts[k], kind) if k in counts else "n/a"
                               for k in ("first", "second", "new run") for kind in ("labels", "images"))))
        print("\n| images | trainer | first start s | second start s | second / first | new run s | new run / first "
              "| set-up s, first / second / new run | label opens per rank, first | image opens per rank, first "
              "| label opens per rank, second | image opens per rank, second | label opens per rank, new run "
              "| image opens per rank, new run |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, name, a, b, ratio, *o in rows:
            print(f"| {n} | {name} | {a:.2f} | {b:.2f} | {ratio:.3f} | " + " | ".join(o) + " |")
        for n, name, a, b, ratio, *_ in rows:
            if not name.startswith("ultralytics"):
                floor = floors[nprocs[name]]
                print(f"second start / first: {ratio:.3f} at {n} images, {name} "
                      f"({'within' if ratio < 0.1 else 'OUTSIDE'} the goal: < 0.1); the floor alone: "
                      f"{floor / a:.3f} of the first start")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")


if __name__ == "__main__":
    main()
