"""`hpcyolo status|logs|cancel RUN`: follow a run from its run directory.

A run directory records its jobs: RUN/hpcyolo-jobs (one JSON line per
`hpcyolo submit`: job id, how, where the logs go) and RUN/hpcyolo-run (one
line per start of the job, requeues included, written by the batch script or
the submitted task). The job's state comes from Slurm: `scontrol show job`
while slurmctld remembers it, then `sacct` where accounting runs; where
neither answers, the run directory alone tells what happened.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import HpcyoloError

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


@dataclass
class JobRecord:
    job: str
    via: str
    logs: str | None  # a path, with {rank} for per-rank logs


def jobs(run: Path) -> list[JobRecord]:
    """The run's jobs, oldest first."""
    if not run.is_dir():
        raise HpcyoloError(f"{run}: no such run directory")
    out: list[JobRecord] = []
    submitted = run / "hpcyolo-jobs"
    if submitted.exists():
        for line in submitted.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            out.append(JobRecord(str(entry["job"]), entry.get("via", "?"), entry.get("logs")))
    known = {r.job for r in out}
    started = run / "hpcyolo-run"
    if started.exists():  # a job submitted by `hpcyolo render | sbatch`
        for m in re.finditer(r"^job (\S+) restart", started.read_text(), flags=re.MULTILINE):
            if m[1] not in known:
                known.add(m[1])
                out.append(JobRecord(m[1], "sbatch", None))
    if not out:
        raise HpcyoloError(f"{run}: no job recorded here (not a run directory of hpcyolo?)")
    return out


def slurm_state(job: str) -> dict[str, str] | None:
    """What Slurm says of the job: scontrol, then sacct; None if neither knows."""
    try:
        r = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    except FileNotFoundError:  # no Slurm here (the local site)
        return None
    if r.returncode == 0 and r.stdout.strip():
        fields = dict(w.split("=", 1) for w in r.stdout.split() if "=" in w)
        return {"state": fields.get("JobState", "?"), "elapsed": fields.get("RunTime", "?"),
                "limit": fields.get("TimeLimit", "?"), "nodes": fields.get("NodeList", "?"),
                "restarts": fields.get("Restarts", "0"), "exit": fields.get("ExitCode", "?"),
                "reason": fields.get("Reason", "None"), "stdout": fields.get("StdOut", ""), "source": "scontrol"}
    try:
        r = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "State,Elapsed,Timelimit,NodeList,ExitCode"],
                           capture_output=True, text=True)
    except FileNotFoundError:
        return None
    line = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
    if not line:
        return None
    state, elapsed, limit, nodes, exit_code = (line.split("|") + ["?"] * 5)[:5]
    return {"state": state.split()[0], "elapsed": elapsed, "limit": limit, "nodes": nodes, "restarts": "?",
            "exit": exit_code, "reason": "None", "stdout": "", "source": "sacct"}


def local_state(record: JobRecord) -> dict[str, str]:
    """A job of the local site: a process of this machine, and submitit's log."""
    alive = record.job.isdigit() and _alive(int(record.job))
    log = log_path(record, 0)
    text = log.read_text(errors="replace") if log and log.exists() else ""
    state = "RUNNING" if alive else "COMPLETED" if "Job completed successfully" in text else "FAILED"
    return {"state": state, "elapsed": "?", "limit": "?", "nodes": os.uname().nodename, "restarts": "0",
            "exit": "?" if alive else "0" if state == "COMPLETED" else "non-zero", "reason": "None", "stdout": "",
            "source": f"process {record.job}"}


def _alive(pid: int) -> bool:
    """A running process (a zombie, exited but not yet reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def progress(run: Path) -> str:
    """What the run directory says of the training."""
    parts = []
    results = run / "results.csv"
    if results.exists():
        rows = list(csv.DictReader(results.open()))
        if rows:
            last = rows[-1]
            parts.append(f"epoch {last['epoch']} done: mAP50 {float(last['metrics/mAP50']):.3f}, "
                         f"mAP50-95 {float(last['metrics/mAP50-95']):.3f}")
    ckpts = sorted((run / "checkpoints").glob("ckpt-*.pt")) if (run / "checkpoints").is_dir() else []
    if ckpts:
        parts.append(f"newest checkpoint {ckpts[-1].name}")
    starts = (run / "hpcyolo-run").read_text().count("\n") if (run / "hpcyolo-run").exists() else 0
    parts.append(f"{starts} start(s) recorded")
    return "; ".join(parts)


def status(run: Path) -> str:
    records = jobs(run)
    latest = records[-1]
    lines = [f"run       {run.resolve()}"]
    lines.append(f"job       {latest.job} (via {latest.via})"
                 + (f"; earlier: {', '.join(r.job for r in records[:-1])}" if len(records) > 1 else ""))
    state = local_state(latest) if latest.via == "local" else slurm_state(latest.job)
    if state is None:
        lines.append("state     unknown: Slurm no longer knows this job and accounting (sacct) is unavailable; "
                     "the run directory below tells how far it got")
    else:
        restarts = f", {state['restarts']} requeue(s)" if state["restarts"] not in ("0", "?") else ""
        where = f" on {state['nodes']}" if state["nodes"] not in ("", "(null)", "None assigned") else ""
        reason = f" ({state['reason']})" if state["reason"] not in ("None", "") else ""
        exit_code = f", exit {state['exit']}" if state["state"] in FINAL else ""
        took = f" for {state['elapsed']} of {state['limit']}" if state["elapsed"] != "?" else ""
        lines.append(f"state     {state['state']}{reason}{took}{where}{restarts}{exit_code}  [{state['source']}]")
    lines.append(f"progress  {progress(run)}")
    log = log_path(latest, 0, state)
    if log:
        lines.append(f"log       {log}")
    return "\n".join(lines)


def log_path(record: JobRecord, rank: int | None, state: dict | None = None) -> Path | None:
    if record.logs:
        return Path(record.logs.replace("{rank}", str(rank or 0)))
    if state is None:
        state = slurm_state(record.job)
    return Path(state["stdout"]) if state and state.get("stdout") else None


def logs(run: Path, rank: int | None, follow: bool, out=sys.stdout) -> None:
    latest = jobs(run)[-1]
    if rank is not None and not (latest.logs and "{rank}" in latest.logs):
        raise HpcyoloError(f"{run}: job {latest.job} writes one log for all ranks (submitted with {latest.via}); "
                           "drop --rank")
    path = log_path(latest, rank)
    if path is None:
        raise HpcyoloError(f"{run}: cannot tell where job {latest.job}'s log is (Slurm no longer knows the job)")
    while not path.exists():
        if not follow:
            raise HpcyoloError(f"{path}: no log yet (job {latest.job} has not started?)")
        time.sleep(1)
    with open(path, errors="replace") as f:
        while True:
            chunk = f.read()
            if chunk:
                out.write(chunk)
                out.flush()
            if not follow:
                return
            state = local_state(latest) if latest.via == "local" else slurm_state(latest.job)
            if state is None or state["state"] in FINAL:
                out.write(f.read())  # what came while we asked
                return
            time.sleep(1)


def cancel(run: Path) -> str:
    latest = jobs(run)[-1]
    r = subprocess.run(["scancel", latest.job], capture_output=True, text=True)
    if r.returncode != 0:
        raise HpcyoloError(f"scancel {latest.job}: {r.stderr.strip() or 'failed'}")
    return f"cancelled job {latest.job} of {run}"
