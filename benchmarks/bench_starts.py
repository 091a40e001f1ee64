"""Repeated two-rank starts: the run that once hung now and then, started
again and again, counting the starts that did not end cleanly.

    .venv/bin/python benchmarks/bench_starts.py [--starts 200] [--ranks 2] [--workers 2] [--timeout 300]

Each start is `hpcyolo train` on a tiny shapes set (16/8 images at 64 px, 2
epochs, a validation after each), its ranks launched together on this
machine (hpcyolo.node.local, gloo on loopback) with 2 loader workers: the
layout whose workers once hung (a worker forked while one of gloo's threads
held the interpreter's thread-state lock: rank 0 waiting in the loader's
__next__, rank 1 in a collective; parallel/workers.py). Each start gets its
own session, ended by its process group where it outlives --timeout. A
start that exits non-zero or times out is a failure, printed with its
output's tail; the figures: starts, failures, seconds per start (median).

History (2-core VM, Python 3.11.7, the workers' fork server, 2026-12-01): 200
starts, 0 failed, 13.6 s per start (median; the cores shared with a training
comparison). 2026-12-02, each worker ending with its rank (workers.in_worker):
200 starts, 0 failed, 17.1 s per start (median; the cores shared with two
training comparisons and test runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
LAUNCH = "import json, sys; from hpcyolo.node.local import launch; sys.exit(launch(json.loads(sys.argv[1]), {ranks}))"


def one_start(data: Path, run: Path, args) -> tuple[int | None, float, str]:
    """(exit code or None where it timed out, seconds, the output's tail)."""
    import json

    argv = [str(BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), "--epochs", "2", "--batch",
            "4", "--nbs", "4", "--imgsz", "64", "--workers", str(args.workers), "--close-mosaic", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    with open(run.parent / f"{run.name}.log", "w+") as log:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH.format(ranks=args.ranks), json.dumps(argv)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGKILL)  # this start's session: its launcher, ranks and workers
            proc.wait()
        log.seek(0)
        tail = log.read()[-3000:]
    return code, time.monotonic() - start, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="Seconds after which a start counts as hung.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "shapes"
        subprocess.run([str(BIN / "hpcyolo"), "make-dataset", "shapes", str(data), "--train", "16", "--val", "8",
                        "--imgsz", "64"], check=True, capture_output=True)
        seconds, failures = [], []
        for k in range(args.starts):
            run = Path(tmp) / f"run{k}"
            code, took, tail = one_start(data / "data.yaml", run, args)
            seconds.append(took)
            if code != 0:
                failures.append(k)
                print(f"start {k}: {'timed out' if code is None else f'exit {code}'} after {took:.0f} s; its "
                      f"output's tail:\n{tail}", flush=True)
            if (k + 1) % 10 == 0 or k + 1 == args.starts:
                print(f"{k + 1} starts, {len(failures)} failed, {statistics.median(seconds):.1f} s per start "
                      "(median)", flush=True)
            shutil.rmtree(run, ignore_errors=True)
    print(f"ran: {args.starts} starts of {args.ranks} ranks x {args.workers} loader workers, 2 epochs each; "
          f"Python {sys.version.split()[0]}")
    print(f"failed starts: {len(failures)} of {args.starts} {failures if failures else ''}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
