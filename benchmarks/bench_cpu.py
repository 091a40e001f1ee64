"""The trainer's CPU cost against ultralytics': the same training (model,
data, settings as bench_ultralytics_train.py: a shapes set, imgsz 160,
batch 32, one process on the CPU) run by `hpcyolo train` and by
ultralytics' trainer, in pairs one after the other (ours, then theirs),
each a fresh process. Wall time and CPU time (user + sys of the process and
all its descendants: loader workers included, reaped by this process as
their subreaper even where the trainer leaves them) per run; medians over
the pairs, and the ratios ours / ultralytics.

    bash benchmarks/ultralytics_venv.sh            # once: builds /work/bench-ul-venv
    .venv/bin/python benchmarks/bench_cpu.py [--pairs 3] [--epochs 3] [--train 800] [--threads 1] [--workers 1]

Equal counts on both sides: --threads sets torch's intra-op threads in
both processes (ours: OMP_NUM_THREADS; ultralytics sets its own,
torch.set_num_threads(NUM_THREADS), min(8, CPUs - 1), when it selects the
CPU: patched to --threads), --workers the loader workers (ultralytics sets
0 on the CPU, `self.args.workers = 0` in BaseTrainer: set back to
--workers once its trainer is made; its validation loader then runs twice
as many, as ultralytics does on a GPU). --threads 0 / --workers -1 leave
each side its own choice. Each process reports torch.get_num_threads()
after training and its loader workers, printed per side.

History (2-core VM shared with other work, so the load varied; ultralytics
8.4.190, yolo26n, 800 images; wall / CPU s, ours against ultralytics):
- before this benchmark (3 epochs, each side's own choice, ours 2 threads
  and 1 worker, ultralytics 1 thread and 0 workers): wall 0.65x, CPU 1.21x;
- 1 epoch, 1 pair, before ours set a spin count: 2 threads, 1 worker:
  324 / 318 against 258 / 179 (both sides' libgomp spinning on a busy VM);
  1 thread, 1 worker: 39.7 / 32.9 against 37.3 / 33.6; own choices (ours 2
  threads and 2 workers, ultralytics 1 thread, 0 workers): 100.7 / 77.1
  against 43.7 / 33.7;
- 1 epoch, 3 pairs, 2 threads, 1 worker, ours with OMP_WAIT_POLICY=PASSIVE:
  medians 28.7 / 37.6 against 98.5 / 113.7 (0.29x, 0.33x), but in the
  quietest pair ultralytics' spinning was faster: 28.4 / 39.2 against
  23.7 / 42.6; hence the short spin (GOMP_SPINCOUNT=10000) ours sets now;
- with it, the same (`--threads 2 --workers 1 --epochs 1 --pairs 3`):
  pairs 23.8 / 39.2 against 28.7 / 49.8, 26.7 / 43.0 against 105.7 / 118.8,
  57.0 / 54.6 against 70.3 / 83.2; medians 26.7 / 43.0 against 70.3 / 83.2:
  wall 0.38x, CPU 0.52x (the load changed between runs; the quietest pair,
  the first: 0.83x, 0.79x).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
UL_PYTHON = "/work/bench-ul-venv/bin/python"
PR_SET_CHILD_SUBREAPER = 36

# Each side's process: the trainer, then what it ran with, as JSON, to the file named by argv[1].
UL_TRAIN = """
import json, os, sys
import torch
from ultralytics import YOLO
from ultralytics.utils import torch_utils
report, args, threads, workers = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if threads > 0:
    torch_utils.NUM_THREADS = threads  # select_device's torch.set_num_threads(NUM_THREADS)
seen = {}
def made(trainer):  # on_pretrain_routine_start: after BaseTrainer.__init__ set workers 0 on the CPU
    if workers >= 0:
        trainer.args.workers = workers
def started(trainer):
    seen.update(threads=torch.get_num_threads(), workers=trainer.train_loader.num_workers,
                val_workers=trainer.test_loader.num_workers)
model = YOLO(args.pop("model"))
model.add_callback("on_pretrain_routine_start", made)
model.add_callback("on_train_start", started)
model.train(**args)
seen.update(threads_after=torch.get_num_threads(), wait_policy=os.environ.get("OMP_WAIT_POLICY", "unset"),
            spin=os.environ.get("GOMP_SPINCOUNT", "unset"))
open(report, "w").write(json.dumps(seen))
"""

OURS_TRAIN = """
import atexit, json, os, sys
report = sys.argv.pop(1)
def done():
    torch = sys.modules.get("torch")
    if torch is not None:
        open(report, "w").write(json.dumps({"threads_after": torch.get_num_threads(),
                                            "wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
                                            "spin": os.environ.get("GOMP_SPINCOUNT", "unset")}))
atexit.register(done)
from hpcyolo.entry import main
sys.argv[0] = "hpcyolo"
main()
"""


def subreaper() -> None:
    """Orphans of our children (a loader worker its trainer left) are
    reparented to this process, so reap_all() counts their CPU time too."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_all() -> int:
    """Wait for every descendant left; how many there were."""
    n = 0
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return n
        n += 1


def measured_run(argv: list[str], env: dict, log: Path) -> tuple[float, float]:
    """(wall s, CPU s: user + sys of the process and all its descendants)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, _ = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    reap_all()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} exited {proc.returncode}; its output: {log}\n{log.read_text()[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_side(side: str, pair: int, args, root: Path, data: Path, absolute: Path) -> dict:
    run = root / f"{side}-{pair}"
    report = root / f"{side}-{pair}.json"
    own = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # each side's own choice, or --threads
    env = {k: v for k, v in os.environ.items() if k not in own}
    if args.threads > 0:
        env["OMP_NUM_THREADS"] = str(args.threads)
    if side == "ultralytics":
        ul = {"model": f"{args.model}.yaml", "data": str(absolute), "epochs": args.epochs, "imgsz": args.imgsz,
              "batch": args.batch, "nbs": args.batch, "optimizer": "SGD", "lr0": 0.01, "close_mosaic": 3, "seed": 0,
              "deterministic": True, "workers": max(args.workers, 0), "device": "cpu", "amp": False,
              "plots": args.plots, "val": True, "project": str(root), "name": run.name, "exist_ok": True,
              "pretrained": False, "verbose": False}
        argv = [args.ul_python, "-c", UL_TRAIN, str(report), json.dumps(ul), str(args.threads), str(args.workers)]
        env.update(YOLO_CONFIG_DIR=str(root / "ul-config"), YOLO_OFFLINE="1")
    else:
        argv = [sys.executable, "-c", OURS_TRAIN, str(report), "train", "--run-dir", str(run), "--data", str(data),
                "--model", args.model, "--epochs", str(args.epochs), "--imgsz", str(args.imgsz), "--batch",
                str(args.batch), "--nbs", str(args.batch), "--optimizer", "sgd", "--lr0", "0.01", "--close-mosaic",
                "3", "--seed", "0", "--no-tensorboard", *([] if args.plots else ["--no-plots"]),
                *(["--workers", str(args.workers)] if args.workers >= 0 else [])]
    wall, cpu = measured_run(argv, env, root / f"{side}-{pair}.log")
    seen = json.loads(report.read_text())
    if side == "hpcyolo":  # the trainer's own line: "..., N loader worker(s) per rank, ..."
        m = re.search(r"(\d+) loader worker\(s\) per rank", (root / f"{side}-{pair}.log").read_text())
        seen["workers"] = int(m.group(1)) if m else "?"
        seen["val_workers"] = seen["workers"]
    seen.update(wall=wall, cpu=cpu, omp=env.get("OMP_NUM_THREADS", "unset"))
    print(f"  pair {pair} {side:11s}: wall {wall:6.1f} s, CPU {cpu:6.1f} s ({cpu / wall:.2f} cores); torch threads "
          f"{seen.get('threads', seen['threads_after'])}, loader workers {seen['workers']} (validation "
          f"{seen['val_workers']}), OMP_NUM_THREADS {seen['omp']}, in the process OMP_WAIT_POLICY "
          f"{seen['wait_policy']}, GOMP_SPINCOUNT {seen['spin']}", flush=True)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="yolo26n")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train", type=int, default=800, help="Training images (a quarter as many to validate).")
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on both sides (0: each "
                        "side's own choice).")
    parser.add_argument("--workers", type=int, default=1, help="Loader workers on both sides (-1: each side's own "
                        "choice).")
    parser.add_argument("--plots", action="store_true", help="Both sides draw their plots (default: neither, as "
                        "ultralytics' plots=False; ours also without TensorBoard files).")
    parser.add_argument("--skip-ultralytics", action="store_true", help="Our side only (no benchmark venv needed).")
    parser.add_argument("--ul-python", default=UL_PYTHON)
    args = parser.parse_args()
    if not args.skip_ultralytics and not Path(args.ul_python).is_file():
        sys.exit(f"no ultralytics venv at {args.ul_python}: run bash benchmarks/ultralytics_venv.sh")
    from hpcyolo.login.shapes import make_shapes

    subreaper()
    sides = ("hpcyolo",) if args.skip_ultralytics else ("hpcyolo", "ultralytics")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = root / "shapes" / "data.yaml"
        make_shapes(root / "shapes", n_train=args.train, n_val=max(1, args.train // 4), imgsz=args.imgsz)
        absolute = root / "shapes" / "data.abs.yaml"  # ultralytics resolves a relative path against its own folders
        absolute.write_text(data.read_text().replace("path: .", f"path: {data.parent}"))
        print(f"{args.model}, {args.epochs} epochs, {args.train} train / {max(1, args.train // 4)} val shapes images, "
              f"imgsz {args.imgsz}, batch {args.batch}, one process on the CPU ({os.cpu_count()} CPUs); asked of "
              f"both sides: torch threads {args.threads or 'own choice'}, loader workers "
              f"{args.workers if args.workers >= 0 else 'own choice'}; {args.pairs} pairs, ours first", flush=True)
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for pair in range(args.pairs):
            for side in sides:
                runs[side].append(run_side(side, pair, args, root, data, absolute))
        medians = {side: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu")} for side, rs in runs.items()}
        for side, m in medians.items():
            print(f"{side:11s} medians of {args.pairs}: wall {m['wall']:.1f} s, CPU {m['cpu']:.1f} s (user+sys, "
                  f"with children)")
        if not args.skip_ultralytics:
            ours, theirs = medians["hpcyolo"], medians["ultralytics"]
            print(f"ratio hpcyolo / ultralytics: wall {ours['wall'] / theirs['wall']:.2f}x, "
                  f"CPU {ours['cpu'] / theirs['cpu']:.2f}x")


if __name__ == "__main__":
    main()
