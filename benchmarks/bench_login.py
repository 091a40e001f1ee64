"""What the login-node commands cost: CPU time (user + system of the child
process, from wait4) and wall time, medians over --runs, all commands taking
turns in one loop so that machine noise hits them alike.

    .venv/bin/python benchmarks/bench_login.py [--runs 5] [--torchx PATH] [--hpcyolo PATH] [--requeues 100]
                                               [--sweep 1000]

  render   hpcyolo render site_configs/testbed.yaml examples/coco8.yaml
  torchx   torchx run --dryrun -s slurm dist.ddp -j 2x8 --script train.py, the
           same kind of answer from TorchX (its sbatch script for a 2-node DDP
           job), in a temporary folder; left out where --torchx names no
           executable (default: /work/bench-torchx-venv/bin/torchx, a venv with
           `pip install torchx`)
  pass     python -c pass: the floor of any Python command
  status   hpcyolo status RUN of a run written here with --requeues requeues:
           a start line, a ledger (.times, .json, .step) and a results.csv
           row per start, a failure row every 10th start, a straggler row per
           start, the job journal of one submitit job, two checkpoints. Slurm
           is a stub `scontrol` on PATH that prints one `scontrol show job -o`
           line (Restarts=N): the one process status starts, without a cluster
  submit   hpcyolo submit --dry-run SITE JOB with sweeps of three keys whose
           product is --sweep elements (submitit's sbatch script of one array)

Every command runs with its modules' bytecode cached, as an installed
command does (pip compiles torchx's at install; PYTHONDONTWRITEBYTECODE is
dropped from the children's environment, so that the warm-up run writes
hpcyolo's where a checkout has none yet).

Targets: render's CPU time at most one third of torchx's; status and submit
each under 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcyolo_trainer.common import rundir

REPO = Path(__file__).resolve().parent.parent
TORCHX = "/work/bench-torchx-venv/bin/torchx"


def measure(argv: list[str], cwd: str | None, env: dict) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of `argv`; it must succeed."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{err}")
    return usage.ru_utime + usage.ru_stime, wall


def synthetic_run(run: Path, requeues: int) -> None:
    """A run directory as a job requeued `requeues` times leaves it."""
    job, host, t = "4242", "node001", 1.7e9
    logs = str(run / "submitit" / f"{job}_{{rank}}_log.out")
    rundir.record_job(run, {"job": job, "via": "submitit", "name": run.name, "logs": logs})
    for restart in range(requeues + 1):
        rundir.record_start(run, rundir.start_line(job, str(restart), host, via="submitit"))
        stamps = {"submit": t - 60, "start": t} if restart == 0 else {"start": t}
        stamps |= {"begin": t, "preflight": t + 1, "stage": t + 3, "train": t + 20, "end": t + 3560,
                   "exit": t + 3570}
        times = rundir.ledger_file(run, job, str(restart), ".times")
        times.parent.mkdir(parents=True, exist_ok=True)
        times.write_text("".join(f"{k} {v:.6f}\n" for k, v in stamps.items()))
        steps = {"resumed": 1000 * restart, "reached": 1000 * restart + 1010, "checkpoint": 1000 * restart + 1000}
        record = {"times": {"process": t + 21, "rendezvous": t + 25, "setup": t + 26, "loop": t + 40,
                            "exit": t + 3555}, "seconds": {"validation": 120.0, "checkpoint": 3.5},
                  "steps": steps, "updated": t + 3555}
        times.with_suffix(".json").write_text(json.dumps(record) + "\n")
        times.with_suffix(".step").write_text(f"{steps['reached']:>12}\n")
        rundir.write_result(run, (restart + 1, 3500.0, 1.2, 0.9, 1.1, 0.5, 0.4, 0.45, 0.3, 1.3, 1.0, 1.2, 0.01, 0.01,
                                  0.01, 120.0, 0.05, "n/a"))  # rundir.RESULTS_COLUMNS
        rundir.append_row(run / rundir.STRAGGLERS, rundir.STRAGGLER_COLUMNS,
                          {"time": "2026-01-01T00:00:00", "job": job, "step": steps["reached"], "rank": 3,
                           "host": host, "ms": 900, "median_ms": 300, "on": "forward"})
        if restart % 10 == 9:
            rundir.append_row(run / rundir.FAILURES, rundir.FAILURE_COLUMNS,
                              {"time": "2026-01-01T00:00:00", "job": job, "restart": restart, "nodes": host,
                               "ranks": "3", "reason": "NCCL timeout", "retried": "yes", "lost_steps": 10})
        t += 3600
    (run / rundir.CHECKPOINTS).mkdir()
    for step in (1000 * requeues, 1000 * requeues + 1000):
        (run / rundir.CHECKPOINTS / f"ckpt-{step:09d}.pt").write_bytes(b"")


def stub_scontrol(folder: Path, requeues: int) -> None:
    folder.mkdir()
    line = (f"JobId=4242 JobName=bench JobState=RUNNING Reason=None Restarts={requeues} RunTime=00:10:00 "
            f"TimeLimit=01:00:00 NodeList=node001 ExitCode=0:0 StdOut=/dev/null")
    (folder / "scontrol").write_text(f"#!/bin/sh\necho '{line}'\n")
    (folder / "scontrol").chmod(0o755)


def sweep_options(elements: int) -> list[str]:
    """--sweep options over three training keys whose product is `elements`
    (a cube where it is one; else all of them on one key)."""
    side = round(elements ** (1 / 3))
    if side ** 3 != elements:
        return ["--sweep", "train.lr0=" + ",".join(f"{0.001 * (i + 1):g}" for i in range(elements))]
    keys = {"train.lr0": (0.001, 0.001), "train.momentum": (0.85, 0.01), "train.weight_decay": (0.0001, 0.0001)}
    return [w for key, (first, step) in keys.items()
            for w in ("--sweep", f"{key}=" + ",".join(f"{first + i * step:.6g}" for i in range(side)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--torchx", default=TORCHX, help="the torchx executable (left out where absent)")
    parser.add_argument("--hpcyolo", help="the hpcyolo executable (default: this Python's), e.g. another checkout's")
    parser.add_argument("--requeues", type=int, default=100)
    parser.add_argument("--sweep", type=int, default=1000, help="elements of the sweep submitted (dry run)")
    args = parser.parse_args()
    hpcyolo = args.hpcyolo or str(Path(sys.executable).parent / "hpcyolo")
    site, job = str(REPO / "site_configs" / "testbed.yaml"), str(REPO / "examples" / "coco8.yaml")

    with tempfile.TemporaryDirectory(prefix="hpcyolo-bench-login-") as tmp:
        run, stubs = Path(tmp) / "run", Path(tmp) / "bin"
        synthetic_run(run, args.requeues)
        stub_scontrol(stubs, args.requeues)
        plain = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        stubbed = {**plain, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
        commands: dict[str, tuple[list[str], str | None, dict]] = {
            "render": ([hpcyolo, "render", site, job], None, plain),
            "python -c pass": ([sys.executable, "-c", "pass"], None, plain),
            f"status ({args.requeues} requeues)": ([hpcyolo, "status", str(run)], None, stubbed),
            f"submit --dry-run ({args.sweep} elements)": ([hpcyolo, "submit", "--dry-run", site, job,
                                                          *sweep_options(args.sweep)], None, plain),
        }
        if os.access(args.torchx, os.X_OK):
            commands["torchx dryrun"] = ([args.torchx, "run", "--dryrun", "-s", "slurm", "dist.ddp", "-j", "2x8",
                                          "--script", "train.py"], tmp, plain)
        else:
            print(f"torchx: {args.torchx} is not an executable: left out (pip install torchx in a venv)")
        for name, (argv, cwd, env) in commands.items():
            print(f"{name}: {' '.join(argv)[:200]}", flush=True)
            measure(argv, cwd, env)  # warm the page cache (and the template's bytecode cache)
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        wall: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, (argv, cwd, env) in commands.items():
                c, w = measure(argv, cwd, env)
                cpu[name].append(c)
                wall[name].append(w)

    print(f"\nmedians over {args.runs} runs each:")
    print(f"  {'command':<40} {'CPU ms':>8} {'wall ms':>8}")
    for name in commands:
        print(f"  {name:<40} {statistics.median(cpu[name]) * 1e3:8.1f} {statistics.median(wall[name]) * 1e3:8.1f}")
    med = {name: statistics.median(values) for name, values in cpu.items()}
    if "torchx dryrun" in med:
        ratio = med["render"] / med["torchx dryrun"]
        verdict = "meets" if ratio <= 1 / 3 else "MISSES"
        print(f"render / torchx in CPU time: {ratio:.2f}x  (target <= 0.33x: {verdict})")
    for name in commands:
        if name.startswith(("status", "submit")):
            w = statistics.median(wall[name])
            print(f"{name}: {w * 1e3:.0f} ms wall  (target < 1000 ms: {'meets' if w < 1 else 'MISSES'})")


if __name__ == "__main__":
    main()
