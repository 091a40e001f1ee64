"""`hpcyolo status|logs|cancel RUN`: follow a run from its run directory.

A run directory records its jobs: RUN/hpcyolo-jobs (one JSON line per
`hpcyolo submit`: job id, how, where the logs go) and RUN/hpcyolo-run (one
line per start of the job, requeues included, written by the batch script or
the submitted task; the batch script's lines also name the job's log). The
job's state comes from Slurm: `scontrol show job` while slurmctld remembers
it, then `sacct` where accounting runs; where neither answers, the run
directory alone tells what happened.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError, SlurmError
from hpcyolo_trainer.common.rundir import (
    CHECKPOINTS,
    RECORD,
    Start,
    read_results,
    scores,
    start_count,
    starts,
    submitted,
)

from hpcyolo import slurm


@dataclass
class JobRecord:
    job: str
    via: str
    logs: str | None  # a path; submitit's has {rank} for per-rank logs


def jobs(run: Path) -> list[JobRecord]:
    """The run's jobs, oldest first. The log path a batch script recorded
    for its job wins over the one guessed at submission: it is what Slurm
    used, and it outlives Slurm's memory of the job."""
    if not run.is_dir():
        raise HpcyoloError(f"{run}: no such run directory")
    out = [JobRecord(str(entry["job"]), entry.get("via", "?"), entry.get("logs")) for entry in submitted(run)]
    known = {r.job: r for r in out}
    for start in starts(run):
        if start.job not in known:  # a job submitted by `hpcyolo render | sbatch`
            known[start.job] = JobRecord(start.job, "sbatch", None)
            out.append(known[start.job])
        if start.log and known[start.job].via == "sbatch":
            known[start.job].logs = start.log  # the newest start's
    if not out:  # a run of `hpcyolo run` only: its processes on this machine, their output the terminal's
        out = [JobRecord(pid or "?", "local", None) for _, pid in rundir.local_starts(run)]
    if not out:
        raise HpcyoloError(f"{run}: no job recorded here (not a run directory of hpcyolo?)")
    return out


# A question to Slurm that takes longer gets no answer: without a readable
# slurm.conf, scontrol and sacct retry for a minute each before they fail.
QUERY_TIMEOUT = 15


def slurm_state(job: str) -> dict[str, str] | None:
    """What Slurm says of the job: scontrol, then sacct; None if neither
    knows. Raises SlurmError when Slurm cannot be reached at all (no
    scontrol here, or no answer from its controller)."""
    record = slurm.job_record(job, timeout=QUERY_TIMEOUT)
    if record is not None:
        return scontrol_state(record)
    try:
        accounted = slurm.accounting(job, timeout=QUERY_TIMEOUT)
    except SlurmError:  # no sacct here: no accounting
        return None
    return sacct_state(accounted or "")


def scontrol_state(record: str) -> dict[str, str]:
    """The state of a job from its `scontrol show job -o` line."""
    fields = dict(w.split("=", 1) for w in record.split() if "=" in w)
    return {"state": fields.get("JobState", "?"), "elapsed": fields.get("RunTime", "?"),
            "limit": fields.get("TimeLimit", "?"), "nodes": fields.get("NodeList", "?"),
            "restarts": fields.get("Restarts", "0"), "exit": fields.get("ExitCode", "?"),
            "reason": fields.get("Reason", "None"), "stdout": fields.get("StdOut", ""), "source": "scontrol"}


def sacct_state(text: str) -> dict[str, str] | None:
    """The state of a job from sacct's lines (slurm.SACCT_FIELDS, `|`
    between them; the last line is the newest allocation); None for none."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
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
    if alive:
        state = "RUNNING"
    elif log is None:  # `hpcyolo run`: its exit code was the command's
        state = "ENDED"
    else:
        state = "COMPLETED" if "Job completed successfully" in text else "FAILED"
    return {"state": state, "elapsed": "?", "limit": "?", "nodes": os.uname().nodename, "restarts": "0",
            "exit": "?" if alive or log is None else "0" if state == "COMPLETED" else "non-zero", "reason": "None",
            "stdout": "",
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
    rows = read_results(run)
    if rows:
        parts.append(f"epoch {rows[-1]['epoch']} done: {scores(rows[-1])}")
    ckpts = sorted((run / CHECKPOINTS).glob("ckpt-*.pt")) if (run / CHECKPOINTS).is_dir() else []
    if ckpts:
        parts.append(f"newest checkpoint {ckpts[-1].name}")
    parts.append(f"{start_count(run)} start(s) recorded")
    return "; ".join(parts)


def status(run: Path) -> str:
    records = jobs(run)
    latest = records[-1]
    lines = [f"run       {run.resolve()}"]
    lines.append(f"job       {latest.job} (via {latest.via})"
                 + (f"; earlier: {', '.join(r.job for r in records[:-1])}" if len(records) > 1 else ""))
    unreachable = None
    try:
        state = local_state(latest) if latest.via == "local" else slurm_state(latest.job)
    except SlurmError as e:
        state, unreachable = None, str(e)
    if state is None:
        unknown = unreachable or "Slurm no longer knows this job and accounting (sacct) is unavailable"
        lines.append(f"state     unknown: {unknown}; the run directory below tells how far it got")
    else:
        restarts = f", {state['restarts']} requeue(s)" if state["restarts"] not in ("0", "?") else ""
        where = f" on {state['nodes']}" if state["nodes"] not in ("", "(null)", "None assigned") else ""
        reason = f" ({state['reason']})" if state["reason"] not in ("None", "") else ""
        exit_code = f", exit {state['exit']}" if state["state"] in slurm.FINAL_STATES else ""
        took = f" for {state['elapsed']} of {state['limit']}" if state["elapsed"] != "?" else ""
        lines.append(f"state     {state['state']}{reason}{took}{where}{restarts}{exit_code}  [{state['source']}]")
    lines.append(f"progress  {progress(run)}")
    log = log_path(latest, 0, state or {})  # {}: Slurm was asked already
    if log:
        lines.append(f"log       {log}")
    elif latest.via == "local":
        lines.append("log       none kept: `hpcyolo run` writes to its terminal")
    elif unreachable:
        lines.append(f"log       unknown: {unreachable}, and RUN/{RECORD} records no log path")
    else:
        lines.append(f"log       unknown: {NO_LOG_PATH}")
    lines += health(run)
    return "\n".join(lines)


def health(run: Path) -> list[str]:
    """The failures and slow ranks recorded, and the ledger's table (where the hours went)."""
    from hpcyolo_trainer.common import ledger

    lines = []
    for row in rundir.read_rows(run / rundir.FAILURES):
        lost = f", {row['lost_steps']} step(s) lost" if row.get("lost_steps") else ""
        retried = "restarted in place" if row["job"] == "local" else f"retried without {row['nodes']}"
        lines.append(f"failure   job {row['job']} start {row['restart']}: {row['reason']} "
                     f"({retried if row['retried'] == 'yes' else 'not retried'}{lost})")
    slow = rundir.read_rows(run / rundir.STRAGGLERS)
    if slow:
        named = ", ".join(sorted({f"rank {r['rank']} on {r['host']}" for r in slow}))
        lines.append(f"slow      {len(slow)} straggler streak(s): {named} (RUN/{rundir.STRAGGLERS})")
    starts = ledger.read_starts(run / rundir.LEDGER)
    if starts:
        lines.append(ledger.table(starts))
    return lines


def ledger_json(run: Path) -> dict:
    """`hpcyolo status --json`: the ledger's figures, in seconds."""
    from hpcyolo_trainer.common import ledger

    starts = ledger.read_starts(run / rundir.LEDGER)
    return {"run": str(run.resolve()), "starts": len(starts), **ledger.account(starts),
            "failures": rundir.read_rows(run / rundir.FAILURES),
            "stragglers": rundir.read_rows(run / rundir.STRAGGLERS)}


NO_LOG_PATH = (f"Slurm no longer knows the job, and RUN/{RECORD} records no log path (a script rendered by an "
               "older hpcyolo); by default it is NAME-JOBID.out in the folder the job was submitted from")


def log_path(record: JobRecord, rank: int | None, state: dict | None = None) -> Path | None:
    if record.logs:
        return Path(record.logs.replace("{rank}", str(rank or 0)) if record.via == "submitit" else record.logs)
    if record.via == "local":  # `hpcyolo run`: a process of this machine, its output the terminal's
        return None
    if state is None:
        state = slurm_state(record.job)
    return Path(state["stdout"]) if state and state.get("stdout") else None


def logs(run: Path, rank: int | None, follow: bool, out=sys.stdout) -> None:
    latest = jobs(run)[-1]
    if rank is not None and not (latest.via == "submitit" and latest.logs and "{rank}" in latest.logs):
        raise HpcyoloError(f"{run}: job {latest.job} writes one log for all ranks (submitted with {latest.via}); "
                           "drop --rank")
    path = log_path(latest, rank)
    if path is None:
        raise HpcyoloError(f"{run}: cannot tell where job {latest.job}'s log is: {NO_LOG_PATH}")
    while not path.exists():
        if not follow:
            if any(s.job == latest.job for s in starts(run)):
                raise HpcyoloError(f"{path}: no such file, though job {latest.job} started (removed, or not on a "
                                   "folder this machine shares with the job's first node?)")
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
            if state is None or state["state"] in slurm.FINAL_STATES:
                out.write(f.read())  # what came while we asked
                return
            time.sleep(1)


def cancel(run: Path) -> str:
    """scancel the run's newest job; a job that has already ended is said to
    have, with its final state where Slurm or accounting still knows it."""
    latest = jobs(run)[-1]
    job = latest.job
    if latest.via == "local":
        state = local_state(latest)
        if state["state"] != "RUNNING":
            return f"job {job} of {run} had already finished ({state['state']}); nothing to cancel"
        raise HpcyoloError(f"job {job} of {run} is process {job} on this machine, not a Slurm job: stop it with "
                           f"kill -TERM {job}")
    state = slurm_state(job)
    if state and state["state"] in slurm.FINAL_STATES:
        return _finished(job, run, state)
    code, said = slurm.try_cancel(job)
    ended = cancel_too_late(said)
    if code == 0 and not ended:
        return f"cancelled job {job} of {run}"
    if not ended:
        raise HpcyoloError(f"scancel {job}: {said or 'failed'}")
    # It ended between the two calls, or long ago: Slurm forgets a finished
    # job after MinJobAge (slurm.conf), and scancel then says only "Invalid
    # job id specified".
    state = slurm_state(job)
    if state and state["state"] in slurm.FINAL_STATES:
        return _finished(job, run, state)
    return (f"job {job} of {run} is not running: Slurm no longer knows it (it forgets finished jobs) and "
            "accounting (sacct) has no record of it, so its final state is unknown; nothing to cancel")


def cancel_too_late(said: str) -> bool:
    """Whether what scancel said means the job had ended: it is completing
    or completed, or Slurm no longer knows it."""
    return "already completing or completed" in said or "Invalid job id" in said


def _finished(job: str, run: Path, state: dict[str, str]) -> str:
    return (f"job {job} of {run} had already finished: {state['state']}, exit {state['exit']} "
            f"[{state['source']}]; nothing to cancel")
