"""What a job does around its training command, written once.

Two paths start a job: the batch script (bash: `sbatch`, and `hpcyolo
submit` through submitit, whose job runs the same script,
hpcyolo.login.submit.JobTask) and `hpcyolo run` on one machine
(hpcyolo.login.run). Each takes these steps, in this order, and each step is
decided here; the paths differ only in how a step reaches every node (srun,
one call):

1. begin: the run directory. A first start that finds another run there,
   or this run without run.resume, is refused before anything is written;
   otherwise the directory is made and the start recorded (`hpcyolo job
   begin` in the script).
2. the trainer's variables: task_env (the script exports the same names).
3. preflight, where the job asks for it: `hpcyolo doctor --in-job` on
   every task.
4. stage: the dataset into node-local scratch, once per node (`hpcyolo
   stage`): staged_data is where the copy goes.
5. train: the plan's training command, on every rank.
6. end: what the training command's exit code means (`hpcyolo job end` in
   the script): a checkpoint to requeue from, a checkpoint with no requeue
   left, a failure (naming the rank that failed first, where srun said), or
   success; and whether the node-local scratch stays: only for the start
   that a requeue brings. A failure of a rank or node (killed, crashed, lost,
   or blamed by the hang watchdog) is retried up to the site's
   preemption.max_failures times, without the failed node(s), from the
   newest checkpoint; a user's error never is.

Torch-free: the script runs `hpcyolo job begin` and `hpcyolo job end` in
its batch shell.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.preemption import (
    DEVICE_FAULT_EXIT_CODE,
    EXIT_CODE,
    MARKER_ENV,
    PEER_LOST_EXIT_CODE,
    SCRATCH_ENV,
)
from hpcyolo_trainer.common.record import record

from hpcyolo.node.slurm_stop import SIGTERM_ENV

STAGED = "data"  # the staged copy's folder in the run's node-local scratch


def staged_data(scratch: str | os.PathLike) -> str:
    """Where step 4 copies the dataset: SCRATCH/data (its data YAML is data.yaml inside)."""
    return os.path.join(scratch, STAGED)


def staged_yaml(scratch: str | os.PathLike) -> str:
    """The staged copy's data YAML, which the training command reads."""
    return os.path.join(staged_data(scratch), "data.yaml")


def job_id(env) -> str:
    """The job as `hpcyolo submit` records it: JOB, or ARRAY_TASK for an array task."""
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '0')}"
    return env.get("SLURM_JOB_ID", "local")


def restarts(env) -> int:
    """How often Slurm requeued this job so far (0 at its first start)."""
    value = env.get("SLURM_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0


def in_place(failure: Failure, allocation: list[str], excluded: list[str], nodes: int, tasks_per_node: int,
             batch: int) -> tuple[list[str], int] | None:
    """(the nodes to leave out, the nodes to train on) for a training step
    started again inside this allocation without the failed node(s): on as
    many nodes as before where the allocation has that many left (a node the
    step did not use), else on those left where the global batch still
    splits over their ranks (every rank's step is the same at any world
    size); None where neither holds (the job is requeued instead)."""
    out = list(dict.fromkeys([*excluded, *failure.nodes]))
    left = [n for n in allocation if n not in out]
    if len(left) >= nodes:
        return out, nodes
    if left and batch % (len(left) * tasks_per_node) == 0:
        return out, len(left)
    return None


# == 1. begin ================================================================

def begin(run_dir: Path, *, via: str, resume: bool, request: dict | None, resume_how: str = rundir.RESUME_HOW,
          log: str | None = None, record: bool = True, began: float | None = None, env=os.environ) -> None:
    """The run directory at a start of the job. A run started there before
    this start is continued only by a requeue of this job, or where `resume`
    asks to continue it and `request` (the training command's settings; None
    for a custom entrypoint, whose run directory is its own) makes the same
    run; anything else is refused (HpcyoloError), with nothing written. Then
    the directory is made and, where `record`, this start recorded (`via`:
    sbatch, submitit or local). Every task may ask: only one records."""
    job, restart = ("local", "0") if via == "local" else (job_id(env), str(restarts(env)))
    if restart == "0":
        holds = rundir.started_before(run_dir, job, restart)
        verdict = rundir.job_verdict(run_dir, holds, request, resume, resume_how)
        if verdict is not None and not verdict[0]:
            raise HpcyoloError(verdict[1])
    run_dir.mkdir(parents=True, exist_ok=True)
    if not record:
        return
    import socket  # here: `hpcyolo render` imports this module for the plan's names only

    host = socket.gethostname()
    if via == "local":
        line = rundir.local_start_line(host, os.getpid())
    else:
        line = rundir.start_line(job, restart, host, via="" if via == "sbatch" else via, log=log)
    rundir.record_start(run_dir, line)
    if began is not None and env.get("SLURM_JOB_ID"):
        start_ledger(run_dir, env["SLURM_JOB_ID"], str(restarts(env)), began, env)


def start_ledger(run_dir: Path, job: str, restart: str, began: float, env) -> None:
    """This start's stamps in the run's ledger (hpcyolo_trainer.common.ledger):
    Slurm's submit and start times, and the script's first stamp; the
    script appends the others."""
    from hpcyolo_trainer.common.errors import SlurmError

    from hpcyolo import slurm

    lines = []
    try:
        info = slurm.show_job(int(job), env=env)
        for key, name in (("SubmitTime", "submit"), ("StartTime", "start")):
            lines.append(f"{name} {slurm.epoch_seconds(info[key]):.3f}")
    except (SlurmError, KeyError, ValueError):
        pass  # the ledger then starts at the script's first stamp
    path = rundir.ledger_file(run_dir, job, restart, ".times")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(f"{line}\n" for line in lines) + f"begin {began:.6f}\n")


def stamp(run_dir: Path, job: str, restart: str, part: str, when: float | None = None) -> None:
    """A part of this start begins (the batch script's `stamp PART`, for the
    paths that are Python), now or at `when`."""
    try:
        path = rundir.ledger_file(run_dir, job, restart, ".times")
        path.parent.mkdir(exist_ok=True)
        with open(path, "a") as f:
            f.write(f"{part} {time.time() if when is None else when:.6f}\n")
    except OSError:
        pass  # the ledger is a record, never a reason to fail the job


# == 2. the trainer's variables ==============================================

def task_env(run_dir: str, job: str, restart: str, scratch: str | None, sigterm: str) -> dict[str, str]:
    """What the training command reads besides its options: where to leave
    the preemption marker, the scratch to remove on a final ending, what
    SIGTERM means at this site. The script passes shell words ("$RUN_DIR")."""
    env = {MARKER_ENV: rundir.preempt_marker(run_dir, job, restart)}
    if scratch is not None:
        env[SCRATCH_ENV] = scratch
    if sigterm == "stop":
        env[SIGTERM_ENV] = "stop"
    return env


# == 6. end ==================================================================

@record(kw_only=False)
class Ending:
    """How a job ends: its exit code, whether it requeues, what it says."""

    code: int  # the job's exit code
    requeue: bool  # the job starts again (Slurm requeues it): the node-local scratch stays for it
    message: str | None  # one line for the job's log, after the path's own "hpcyolo: "
    exclude: tuple[str, ...] = ()  # nodes the requeued job must avoid (a failure retried without them)


@record(kw_only=False)
class Failure:
    """A training step that ended because a rank or a node failed, not
    because of the user's code or settings: worth a retry without `nodes`."""
    nodes: tuple[str, ...]
    ranks: str
    reason: str


# How srun reports a task that a signal ended: a rank or node failing, not the user's code.
_DIED_SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL)
_DIED = tuple(signal.strsignal(s) for s in _DIED_SIGNALS)  # "Killed", "Segmentation fault", ...
_FAULTED = f"Exited with exit code {DEVICE_FAULT_EXIT_CODE}"
_NODE_FAILURE = re.compile(r"Node failure on (\S+)")
_OOM = ("oom-kill", "oom_kill", "Out Of Memory", "out of memory")


def node_failure(code: int, srun_stderr: str, blame: dict | None = None) -> Failure | None:
    """The failure of a rank or node that ended the step, or None: the hang
    watchdog's verdict where it ended the step (exit HANG_EXIT_CODE; a hang
    every rank shares is the code's, not a node's), else srun's report of the
    first task a signal ended, that found its device or network failed
    (DEVICE_FAULT_EXIT_CODE), or of a node failure. A task the kernel's OOM
    killer ended, an exception or a refusal (exit 1, 2) is the user's."""
    from hpcyolo_trainer.common.preemption import HANG_EXIT_CODE

    if code == HANG_EXIT_CODE:
        if blame and blame.get("nodes"):
            return Failure(tuple(blame["nodes"]), ",".join(map(str, blame.get("ranks", []))),
                           f"hang: {blame.get('reason', 'a rank did not arrive')}")
        return None
    if any(word in srun_stderr for word in _OOM):
        return None
    for line in srun_stderr.splitlines():
        m = _NODE_FAILURE.search(line)
        if m:
            return Failure((m[1],), "", f"node failure on {m[1]}")
        m = _SRUN_ERROR.fullmatch(line.strip())
        if m and m[3] != f"Exited with exit code {PEER_LOST_EXIT_CODE}":
            if m[3] in _DIED:
                return Failure((m[1],), m[2], f"rank {m[2]} on {m[1]}: {m[3]}")
            if m[3] == _FAULTED:
                return Failure((m[1],), m[2], f"rank {m[2]} on {m[1]}: its device or network failed")
            return None  # the first task to fail exited by itself: its code's or the user's error
    return None


def task_failure(code: int, rank: int, host: str, blame: dict | None = None) -> Failure | None:
    """node_failure() as `hpcyolo run` sees one of its ranks, which has only
    its own exit (a negative code: the signal that ended it): the
    watchdog's verdict, this rank killed by a signal (not by the OOM
    killer), or its device or network failed."""
    from hpcyolo_trainer.common.preemption import HANG_EXIT_CODE

    if code == HANG_EXIT_CODE:
        return node_failure(code, "", blame)
    if code == DEVICE_FAULT_EXIT_CODE:
        return Failure((host,), str(rank), f"rank {rank} on {host}: its device or network failed")
    if code < 0 and -code in _DIED_SIGNALS and not oom_killed():
        return Failure((host,), str(rank), f"rank {rank} on {host}: {signal.strsignal(-code)}")
    return None


def oom_killed() -> bool:
    """Whether the kernel's OOM killer ended a process of this task's control
    group or one above it (cgroup v2 memory.events; False where unreadable)."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
    except (OSError, StopIteration, IndexError):
        return False
    group = Path("/sys/fs/cgroup", path.lstrip("/"))
    for folder in (group, *group.parents):
        try:
            events = (folder / "memory.events").read_text()
        except OSError:
            continue
        if any(line.split()[:1] == ["oom_kill"] and line.split()[1] != "0" for line in events.splitlines()):
            return True
        if folder == Path("/sys/fs/cgroup"):
            break
    return False


def end(code: int, marker: str | None, *, job: str, restart: int, max_requeues: int, failed_first: str | None = None,
        how_to_continue: str = "resubmit with run.resume: true to go on", failure: Failure | None = None,
        failures_before: int = 0, max_failures: int = 0) -> Ending:
    """What the training command's exit `code` means for the job: requeue
    after a checkpoint while requeues are left (`max_requeues` counts them;
    0 where nothing requeues); requeue without the failed nodes after a
    rank's or node's `failure` while `max_failures` is more than the
    `failures_before` retried; else pass the code on, saying why."""
    if rundir.checkpointed(code, marker):
        reason = _first_line(marker) or f"exit {EXIT_CODE}"
        if restart < max_requeues:
            return Ending(0, True, f"checkpointed ({reason}); requeueing job {job} "
                                   f"({restart + 1} of {max_requeues})")
        limit = f", but stopped after {max_requeues} requeues" if max_requeues else ""
        return Ending(EXIT_CODE, False, f"checkpointed ({reason}){limit}; {how_to_continue}")
    if code == 0:
        return Ending(0, False, None)
    if failure is not None:
        nodes = ", ".join(failure.nodes)
        if failures_before < max_failures:
            return Ending(0, True, f"{failure.reason}; requeueing job {job} without {nodes} to resume from its "
                                   f"newest checkpoint (failure {failures_before + 1} of preemption.max_failures "
                                   f"{max_failures})", exclude=failure.nodes)
        return Ending(code, False, f"{failure.reason}; not retried: preemption.max_failures is {max_failures}"
                                   f"{' and was reached' if max_failures else ''}; {how_to_continue}")
    if failed_first:
        return Ending(code, False, f"{failed_first}; the training step ended with exit {code}")
    return Ending(code, False, f"the training step ended with exit {code}")


def failures_retried(run_dir: Path, job: str) -> int:
    """How many failures of this job were retried so far (RUN/failures.csv)."""
    return sum(1 for row in rundir.read_rows(Path(run_dir) / rundir.FAILURES)
               if row["job"] == job and row["retried"] == "yes")


def requeue_without(job: str, nodes: tuple[str, ...]) -> None:
    """Requeue this running job, then exclude `nodes` from its next start
    (Slurm takes a job's excluded nodes only while it is pending). The
    requeue sends the job's processes SIGTERM, and SIGKILL KillWait seconds
    later (the testbed's 5, and under a slow controller maybe less than the
    queries take): this one ignores the SIGTERM, and asks and says what it
    can before the requeue, leaving one `scontrol update` for after it."""
    from hpcyolo import slurm

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    excluded = slurm.excluded_with(slurm.show_job(int(job)), list(nodes))
    if excluded is None:
        print(f"hpcyolo: {', '.join(nodes)} not excluded: the job's partition would keep fewer nodes than it asks "
              "for, and it would wait for good; the requeued job may start there again", file=sys.stderr, flush=True)
    slurm.requeue(int(job))
    if excluded is not None:
        slurm.exclude_nodes(int(job), excluded)


def record_failure(run_dir: Path, job: str, restart: str, failure: Failure, retried: bool) -> None:
    """A row of RUN/failures.csv: the node(s), rank(s), reason, whether it was
    retried, and the steps lost (trained past the newest checkpoint, from the
    trainer's ledger)."""
    from hpcyolo_trainer.common.ledger import read_trainer

    lost = ""
    trainer = read_trainer(rundir.ledger_file(run_dir, job, restart, ".json"))
    if trainer is not None:
        lost = str(trainer["steps"]["reached"] - trainer["steps"]["checkpoint"])
    rundir.append_row(run_dir / rundir.FAILURES, rundir.FAILURE_COLUMNS,
                      {"job": job, "restart": restart, "nodes": " ".join(failure.nodes), "ranks": failure.ranks,
                       "reason": failure.reason, "retried": "yes" if retried else "no", "lost_steps": lost})


def _first_line(path: str | None) -> str | None:
    try:
        with open(path or "", errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None


# srun names each task that ended badly: "srun: error: NODE: task N: Killed"
# (or "tasks 2-3: Exited with exit code 1").
_SRUN_ERROR = re.compile(r"srun: error: ([^:]+): tasks? ([0-9,-]+): (.*)")


def failed_first(srun_stderr: str, torchrun: bool = False) -> str | None:
    """`rank N on NODE failed first (HOW)` from srun's stderr: the first task
    that did not just lose its peers (exit PEER_LOST_EXIT_CODE) died first.
    With torchrun a task is a node's torchrun, not a rank."""
    peer_lost = f"Exited with exit code {PEER_LOST_EXIT_CODE}"
    for line in srun_stderr.splitlines():
        m = _SRUN_ERROR.fullmatch(line.strip())
        if m and m[3] != peer_lost:
            who = f"the torchrun (task {m[2]})" if torchrun else f"rank {m[2]}"
            return f"{who} on {m[1]} failed first ({m[3]})"
    return None
