"""The thin wrapper around Slurm's commands: the only place hpcyolo runs them.

Each call turns a missing command or a failure into a SlurmError that says
which command failed and what it printed; NoAnswer where the command is not
here or did not answer in time. The questions of `hpcyolo status|cancel`
(hpcyolo.login.lifecycle) and `hpcyolo doctor` return what Slurm printed, which
those modules parse and report.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from typing import TYPE_CHECKING, Mapping

from hpcyolo_trainer.common.errors import SlurmError, shown

if TYPE_CHECKING:
    import subprocess  # imported by run(): `hpcyolo render` runs no command, and subprocess is 3 ms of it

# Job states after which a job will not run again (squeue(1), JOB STATE CODES).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "BOOT_FAIL", "DEADLINE", "PREEMPTED"})


class NoAnswer(SlurmError):
    """`command` is not here (`missing`), or gave no answer in time."""

    def __init__(self, message: str, *, command: str, missing: bool) -> None:
        super().__init__(message)
        self.command = command
        self.missing = missing


def run(argv: list[str], *, input: str | None = None, env: Mapping[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    import subprocess

    try:
        # surrogateescape: a script holding a path that is not UTF-8 goes to sbatch as the path's bytes.
        return subprocess.run(argv, input=input, env=None if env is None else dict(env), capture_output=True,
                              text=True, errors="surrogateescape", timeout=timeout)
    except FileNotFoundError:
        raise NoAnswer(f"{argv[0]}: command not found (is this a Slurm login node?)", command=argv[0],
                       missing=True) from None
    except subprocess.TimeoutExpired:
        raise NoAnswer(f"{shlex.join(argv)}: no answer after {timeout:.0f} s", command=argv[0],
                       missing=False) from None


# What Slurm's commands print when slurmctld does not answer, or when they
# cannot even find the cluster's configuration (slurm_errno.c, fetch_config).
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out on send/recv|Zero Bytes were "
                          r"transmitted or received|Could not establish a configuration source|Connection refused")


def check_reachable(proc: subprocess.CompletedProcess, argv: list[str]) -> None:
    """A SlurmError saying Slurm cannot be reached, when that is why `argv`
    failed; anything else (an unknown job, say) is the caller's to read."""
    said = f"{proc.stderr}\n{proc.stdout}"
    if proc.returncode != 0 and _UNREACHABLE.search(said):
        line = next(line for line in said.splitlines() if _UNREACHABLE.search(line))
        raise SlurmError(f"cannot reach Slurm from here: {argv[0]} says {line.strip()!r}")


def _check(proc: subprocess.CompletedProcess, argv: list[str]) -> str:
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().replace("\n", "; ")
        raise SlurmError(f"{shlex.join(argv)} failed (exit {proc.returncode}): {said}")
    return proc.stdout


def sbatch(script: str, *args: str, env: Mapping[str, str] | None = None) -> int:
    """Submit a script (given as text) and return the job id."""
    argv = ["sbatch", "--parsable", *args]
    out = _check(run(argv, input=script, env=env), argv)
    return int(out.strip().split(";")[0])


def check_script(script: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """`sbatch --test-only`: Slurm's own check of a script, nothing submitted.
    Exit 0 valid; 1 impossible resources or unknown partition; 255 an unknown
    option."""
    return run(["sbatch", "--test-only"], input=script, env=env)


def show_job(job_id: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`scontrol show job -o`, as a dict (JobState, ExitCode, Restarts, ...)."""
    argv = ["scontrol", "show", "job", "-o", str(job_id)]
    fields = {}
    for word in shlex.split(_check(run(argv, env=env), argv)):
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    return fields


def wait(job_id: int, *, timeout: float, env: Mapping[str, str] | None = None, poll: float = 1.0,
         settled=lambda info: True, settle: float = 60.0) -> dict[str, str]:
    """Wait until the job reaches a final state and `settled(info)` holds
    (its restart count, say, for a job that a requeue takes back out of its
    final state). A job that stays in a final state without settling for
    `settle` seconds is returned as it is, for the caller to judge (it was not
    requeued): slurmctld forgets a finished job MinJobAge seconds after its
    end (300 by default), and then its state could no longer be shown."""
    deadline = time.monotonic() + timeout
    unsettled_since = None
    while True:
        info = show_job(job_id, env)
        if info.get("JobState") in FINAL_STATES:
            if settled(info):
                return info
            if unsettled_since is None:
                unsettled_since = time.monotonic()
            elif time.monotonic() - unsettled_since >= settle:
                return info
        else:
            unsettled_since = None
        if time.monotonic() > deadline:
            raise SlurmError(f"job {job_id} still {info.get('JobState')} after {timeout:.0f} s")
        time.sleep(poll)


def cancel(job_id: int, *args: str, env: Mapping[str, str] | None = None) -> None:
    argv = ["scancel", *args, str(job_id)]
    _check(run(argv, env=env), argv)


def requeue(job_id: int, env: Mapping[str, str] | None = None) -> None:
    """Put a running or finished batch job back in the queue (it must have
    been submitted with --requeue); it starts again as a restart."""
    argv = ["scontrol", "requeue", str(job_id)]
    _check(run(argv, env=env), argv)


def excluded_with(info: dict[str, str], nodes: list[str], env: Mapping[str, str] | None = None) -> str | None:
    """The excluded nodes (ExcNodeList) of the job whose `show_job` is
    `info`, with `nodes` added, for exclude_nodes; None where its partitions
    would keep fewer nodes than it asks for (it would wait for good). Ask
    while the job runs: a requeued job shows NumNodes 1 until it is
    scheduled again."""
    before = info.get("ExcNodeList", "(null)")
    known = [] if before in ("(null)", "") else hostnames(before, env)
    wanted = list(dict.fromkeys([*known, *nodes]))
    offered = partition_nodes(info.get("Partition", ""), env)
    needed = int(re.match(r"\d*", info.get("NumNodes", "")).group() or 1)
    if offered is not None and len(set(offered) - set(wanted)) < needed:
        return None
    return ",".join(wanted)


def exclude_nodes(job_id: int, excluded: str, env: Mapping[str, str] | None = None) -> None:
    """Set the job's excluded nodes (a requeue keeps them) to `excluded`
    (excluded_with's list), so that its next start avoids them; Slurm takes
    them only from a pending job."""
    argv = ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={excluded}"]
    _check(run(argv, env=env), argv)


def partition_nodes(partitions: str, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The nodes of these partitions (comma-separated names), or None where Slurm does not say."""
    found: list[str] = []
    for name in filter(None, partitions.split(",")):
        proc = run(["scontrol", "show", "partition", name, "-o"], env=env)
        m = re.search(r"(?:^|\s)Nodes=(\S+)", proc.stdout) if proc.returncode == 0 else None
        if m is None or m[1] in ("(null)", ""):
            return None
        found += hostnames(m[1], env)
    return list(dict.fromkeys(found)) or None


def hostnames(nodelist: str, env: Mapping[str, str] | None = None) -> list[str]:
    argv = ["scontrol", "show", "hostnames", nodelist]
    return _check(run(argv, env=env if env is not None else os.environ), argv).split()


# == questions whose answers the caller parses (lifecycle, doctor) ===========

def job_record(job: str, *, timeout: float) -> str | None:
    """`scontrol show job -o JOB`: the job's one line of KEY=VALUE words, or
    None where slurmctld does not know the job (any more). SlurmError when
    Slurm cannot be reached at all."""
    argv = ["scontrol", "show", "job", "-o", job]
    r = run(argv, timeout=timeout)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout
    check_reachable(r, argv)
    return None


# The fields `accounting` asks sacct for, in this order.
SACCT_FIELDS = "State,Elapsed,Timelimit,NodeList,ExitCode"


def accounting(job: str, *, timeout: float) -> str | None:
    """`sacct -j JOB -X -n -P -o SACCT_FIELDS`: one `|`-separated line per
    allocation, or None where sacct fails (accounting off). SlurmError where
    there is no sacct, or no answer."""
    r = run(["sacct", "-j", job, "-X", "-n", "-P", "-o", SACCT_FIELDS], timeout=timeout)
    return r.stdout if r.returncode == 0 else None


def try_cancel(job: str) -> tuple[int, str]:
    """`scancel JOB`: its exit status and what it said (stderr, else stdout,
    on one line), for the caller to read; SlurmError when Slurm cannot be
    reached at all."""
    argv = ["scancel", job]
    r = run(argv)
    check_reachable(r, argv)
    return r.returncode, (r.stderr.strip() or r.stdout.strip()).replace("\n", "; ")


# How long doctor waits for each of its questions.
ASK_TIMEOUT = 30


def version() -> subprocess.CompletedProcess:
    """`scontrol --version` ("slurm 23.11.4")."""
    return run(["scontrol", "--version"], timeout=ASK_TIMEOUT)


# The columns `partitions` asks sinfo for: name (a default one ends in *),
# time limit, node count, CPUs, memory (MB), GRES.
SINFO_FORMAT = "%P|%l|%D|%c|%m|%G"


def partitions() -> subprocess.CompletedProcess:
    """`sinfo -h -o SINFO_FORMAT`: one line per partition and node state."""
    return run(["sinfo", "-h", "-o", SINFO_FORMAT], timeout=ASK_TIMEOUT)


def associations(user: str) -> subprocess.CompletedProcess:
    """`sacctmgr show assoc` of `user`: `account|qos,qos` lines."""
    return run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=account,qos"], timeout=ASK_TIMEOUT)


def config() -> subprocess.CompletedProcess:
    """`scontrol show config`: `Key = value` lines (PreemptType, PreemptMode, KillWait, ...)."""
    return run(["scontrol", "show", "config"], timeout=ASK_TIMEOUT)


def partition(name: str | None) -> subprocess.CompletedProcess:
    """`scontrol show partition [NAME] -o`: a line of Key=Value words per partition (GraceTime, PreemptMode)."""
    return run(["scontrol", "show", "partition", *([name] if name else []), "-o"], timeout=ASK_TIMEOUT)


def nodes(names: str | None) -> subprocess.CompletedProcess:
    """`scontrol show node [NAMES] -o`: a line of Key=Value words per node (CPUTot, RealMemory, Gres, ...)."""
    return run(["scontrol", "show", "node", *([names] if names else []), "-o"], timeout=ASK_TIMEOUT)


def srun_help() -> subprocess.CompletedProcess:
    """`srun --help` (pyxis adds --container-image to it)."""
    return run(["srun", "--help"], timeout=ASK_TIMEOUT)


def parse_config(out: str) -> dict[str, str]:
    """`scontrol show config`'s `Key = value` lines as a dict."""
    pairs = (line.split("=", 1) for line in out.splitlines() if " = " in line)
    return {k.strip(): v.strip() for k, v in pairs}


def one_task(options: list[str], command: list[str], *, timeout: float) -> subprocess.CompletedProcess:
    """`srun OPTIONS COMMAND`: one step (an allocation of its own), as doctor
    runs it to look at a compute node."""
    return run(["srun", *options, *command], timeout=timeout)


# == Slurm's time formats =====================================================

_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def epoch_seconds(stamp: str) -> float:
    """A time as `scontrol show job` prints it (SubmitTime=2026-11-26T05:06:02,
    this machine's local time) in seconds since the epoch; ValueError for
    Unknown, None and the like."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def parse_time(value: str) -> int:
    """Slurm's time formats (man sbatch, --time) to seconds: M, M:S, H:M:S,
    D-H, D-H:M, D-H:M:S."""
    m = _TIME.fullmatch(value.strip())
    if not m:
        raise ValueError(f"{shown(value)} is not a Slurm time such as 90 (minutes), 04:00:00 or 2-00:00:00")
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b or 0), int(c or 0)
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = int(days) * 86400 + a * 3600 + b * 60 + c
    elif m.group(4) is not None:  # H:M:S
        seconds = a * 3600 + b * 60 + c
    elif m.group(3) is not None:  # M:S
        seconds = a * 60 + b
    else:  # M
        seconds = a * 60
    if seconds <= 0:
        raise ValueError(f"{shown(value)} is not a positive time")
    return seconds


# How sinfo and scontrol print a partition without a time limit.
UNLIMITED = ("infinite", "unlimited")


def limit_seconds(value: str | None) -> float:
    """A time limit in seconds; infinite when there is none (empty, or
    INFINITE / UNLIMITED as sinfo prints it)."""
    if not value or value.strip().lower() in UNLIMITED:
        return float("inf")
    return parse_time(value)


def format_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms
