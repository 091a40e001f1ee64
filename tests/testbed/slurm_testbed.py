#!/usr/bin/env python3
"""A real, local, multi-node Slurm cluster for hpcyolo's tests.

The project's tests must not mock Slurm where a real one can answer, so this
module installs Debian's Slurm packages and brings up a cluster of N nodes on
this one machine (Debian 12, root, no systemd needed):

* one ``slurmctld`` on 127.0.0.1 (port 16817);
* one ``slurmd`` per node (Debian builds Slurm with MULTIPLE_SLURMD), node
  ``nodeI`` on 127.0.0.(10+I), port 17000+I, each in its own UTS namespace so
  that ``hostname`` inside a task prints ``nodeI``;
* ``/etc/hosts`` lines ``127.0.0.1I nodeI`` (marked with a comment, removed on
  ``down``) so that a MASTER_ADDR taken from the job's nodelist resolves;
* munge (started only if it is not already working).

Every file the cluster uses (slurm.conf, gres.conf, state, spool, logs, pid
files, the job completion log) lives in one state directory, by default
``/tmp/hpcyolo-testbed`` (or ``$HPCYOLO_TESTBED_DIR``). Nothing is written to
/etc/slurm: clients find the cluster through ``SLURM_CONF``, which batch jobs
inherit from the submitting environment (sbatch's default ``--export=ALL``)
and which slurmd also sets in every job's environment, so ``srun`` and
``scontrol show hostnames`` work inside jobs even with ``--export=NONE``.

Nodes advertise more than the machine has (``SlurmdParameters=config_overrides``):
by default 128 CPUs, 1,000,000 MB of memory and 8 GPUs per node. There are no
GPU devices: gres.conf points each GPU at a symlink to /dev/null. That lets
``sbatch --test-only`` validate scripts written for real GPU sites, and lets
such jobs actually run (with ``CUDA_VISIBLE_DEVICES=0,1,...`` set by Slurm).

Command line (run as root)::

    python3 tests/testbed/slurm_testbed.py install    # apt-get the packages
    python3 tests/testbed/slurm_testbed.py up --nodes 2
    eval "$(python3 tests/testbed/slurm_testbed.py env)"
    srun --nodes=2 --ntasks-per-node=2 hostname
    python3 tests/testbed/slurm_testbed.py status
    python3 tests/testbed/slurm_testbed.py down

From pytest::

    from tests.testbed.slurm_testbed import Testbed, available

    ok, why = available()
    if not ok:
        pytest.skip(why)
    tb = Testbed()
    started = tb.up()                 # False when it was already up
    subprocess.run(["sbatch", ...], env={**os.environ, **tb.env})
    ...
    if started:
        tb.down()

Things a test must know:

* A requeued job (``scontrol requeue``) is held until ``cred_expire`` seconds
  have passed (``AuthInfo=cred_expire=10`` here, so it reruns about 12-15 s
  later; Slurm's default is 120 s). ``scontrol update JobId=J StartTime=now``
  lifts the hold, but only once the job is PENDING again (sent while it is
  still COMPLETING, it is undone): ``Testbed.requeue(J)`` does both, and the
  job reruns within about a second. The rerun sees ``SLURM_RESTART_COUNT=1``.
* ``--exclusive`` is honoured (such jobs run one after another); other jobs
  share nodes (``OverSubscribe=FORCE:4``), except that GPUs are never shared.
* Job ids start from a value derived from the clock (``FirstJobId``), so ids
  do not restart at 1 after ``down``/``up``.
* Finished jobs stay visible to ``scontrol show job`` for ``MinJobAge=300`` s;
  ``sacct`` does not work (no accounting database); finished jobs are logged
  in ``<state dir>/jobcomp.txt``.
* One testbed per machine at a time: node names, addresses and ports are fixed.
* ``up``/``down`` take a lock file next to the state dir, so concurrent
  callers (pytest-xdist workers) do not race.

Standard library only (Python 3.11).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

PARTITION = "debug"
# Preemption as Slurm does it (PreemptType=preempt/partition_prio): a job of
# URGENT (a higher PriorityTier) that needs the nodes preempts the jobs of
# PREEMPTIBLE in REQUEUE mode, after GRACE_TIME seconds of grace. Jobs of
# PARTITION are never preempted (PreemptMode=OFF there).
PREEMPTIBLE = "preemptible"
URGENT = "urgent"
GRACE_TIME = 30
CTLD_ADDR = "127.0.0.1"
CTLD_PORT = 16817
DBD_PORT = 16819  # slurmdbd, on CTLD_ADDR
DB_PORT = 16306  # MariaDB for slurmdbd, on CTLD_ADDR, without grant tables (nothing else reaches loopback)
SLURMD_BASE_PORT = 17000  # node I listens on SLURMD_BASE_PORT + I
NODE_ADDR_BASE = 10  # node I has address 127.0.0.(NODE_ADDR_BASE + I)
MAX_NODES = 200  # keeps addresses inside 127.0.0.0/24 and ports unique

HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# hpcyolo-testbed"

# slurmdbd and MariaDB: Slurm's accounting (`sacct`'s jobs and steps), about 200 MB.
APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server")
# What `install` must provide; `available()` additionally needs the rest.
INSTALL_BINARIES = ("slurmctld", "slurmd", "sbatch", "munged", "slurmdbd", "mariadbd", "mariadb-install-db")
RUNTIME_BINARIES = INSTALL_BINARIES + (
    "srun", "sinfo", "squeue", "scontrol", "scancel", "sacct", "sacctmgr",
    "munge", "unmunge", "mungekey", "unshare", "runuser",
)

MUNGE_RUN_DIR = Path("/run/munge")
MUNGE_PID_FILE = MUNGE_RUN_DIR / "munged.pid"
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_DIRS = (Path("/etc/munge"), Path("/var/lib/munge"), Path("/var/log/munge"), MUNGE_RUN_DIR)
MUNGE_LOG = Path("/var/log/munge/munged.log")

# Daemons run with a small, fixed environment rather than whatever the caller
# (a pytest run inside a venv, say) happens to have.
DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Bounded waits (seconds).
MUNGE_TIMEOUT = 15
CTLD_TIMEOUT = 30
DB_TIMEOUT = 60  # MariaDB and slurmdbd up and answering
NODES_TIMEOUT = 60
DRAIN_TIMEOUT = 75  # scancel -> squeue empty; KillWait=30 plus slack
STOP_TIMEOUT = 15  # SIGTERM -> gone, before SIGKILL


class TestbedError(RuntimeError):
    """Bringing the testbed up or down failed; the message says why."""

    __test__ = False  # not a pytest test class despite the name


def default_state_dir() -> Path:
    return Path(os.environ.get("HPCYOLO_TESTBED_DIR", "/tmp/hpcyolo-testbed"))


# --------------------------------------------------------------------------
# small helpers


def _which(name: str) -> str | None:
    """shutil.which that also looks in the sbin directories.

    A non-login root shell (or a pytest run from a venv) may lack /usr/sbin in
    PATH, where slurmctld, slurmd and munged live.
    """
    path = os.environ.get("PATH", "") + os.pathsep + DAEMON_PATH
    return shutil.which(name, path=path)


def _missing(binaries: tuple[str, ...]) -> list[str]:
    return [b for b in binaries if _which(b) is None]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    out = text.splitlines()[-lines:]
    return "\n".join(out) if out else "(empty)"


def _tails(paths: list[Path], lines: int = 30) -> str:
    return "\n".join(f"--- last lines of {p} ---\n{_tail(p, lines)}" for p in paths)


def _wait_until(pred: Callable[[], bool], timeout: float, what: str,
                logs: Callable[[], list[Path]] | list[Path] = (),
                interval: float = 0.2) -> None:
    """Poll pred() until true; raise TestbedError with log tails on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() >= deadline:
            paths = logs() if callable(logs) else list(logs)
            msg = f"timed out after {timeout:g} s waiting for {what}"
            if paths:
                msg += "\n" + _tails(paths)
            raise TestbedError(msg)
        time.sleep(interval)


class _LogWatch:
    """Fail fast when a daemon logs `fatal:` instead of waiting out a timeout.

    Daemons fork into the background before they can fail (bad config, port
    in use), so the exit status of the command we ran says nothing; the log does.
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0

    def check(self, what: str) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                new = fh.read().decode("utf-8", "replace")
        except OSError:
            return
        fatal = [ln for ln in new.splitlines() if "fatal:" in ln]
        if fatal:
            raise TestbedError(f"{what} failed to start: {fatal[0].strip()}\n"
                               + _tails([self.path]))


def _pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie.

    On these machines a killed daemon can linger as a zombie for seconds
    (its parent is PID 1, which reaps lazily), and kill(pid, 0) succeeds on a
    zombie, so look at the State line in /proc/PID/status instead.
    """
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("State:"):
            fields = line.split()
            return len(fields) < 2 or fields[1] not in ("Z", "X")
    return True


def _pid_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        return None
    return pid if pid > 1 else None


def _live_pid(path: Path, comm: str) -> int | None:
    """The PID in pid file `path` if that process is alive and is `comm`.

    Checking the command name guards against a stale pid file whose PID has
    since been reused by an unrelated process (we must never signal that).
    """
    pid = _read_pid(path)
    if pid is None or not _pid_alive(pid):
        return None
    if _pid_comm(pid) != comm:
        return None
    return pid


def _reap(pid: int) -> None:
    # Only matters if the daemon happens to be our own child; harmless otherwise.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _stop_pid(pid: int, what: str, log: Callable[[str], None],
              timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, wait (bounded), then SIGKILL, wait (bounded)."""
    if not _pid_alive(pid):
        return
    log(f"stopping {what} (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    log(f"{what} (pid {pid}) ignored SIGTERM for {timeout:g} s; sending SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _reap(pid)
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    raise TestbedError(f"{what} (pid {pid}) is still alive after SIGKILL")


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 30,
         input: bytes | None = None) -> subprocess.CompletedProcess:
    """Run a command, capturing output; a timeout counts as a failure (rc 124)."""
    try:
        return subprocess.run(cmd, env=env, input=input, capture_output=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, exc.stdout or b"", exc.stderr or b"")
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, b"", str(exc).encode())


def _first_job_id() -> int:
    """A FirstJobId that grows with the clock.

    With the state wiped on every `down`, Slurm would restart job ids at 1, and
    a reused id can make tools (submitit) pick up a stale result from an old
    job folder. Tenths of a second since the epoch, folded below Slurm's
    MaxJobId default (67,043,328): ids only repeat if more than ten jobs per
    second were submitted between two `up`s, or after the 69-day wrap.
    """
    return int(time.time() * 10) % 60_000_000 + 1000


def _log_stderr(msg: str) -> None:
    print(f"[slurm-testbed] {msg}", file=sys.stderr, flush=True)


def _nolog(msg: str) -> None:
    pass


# --------------------------------------------------------------------------
# availability and installation


def available() -> tuple[bool, str]:
    """Can a testbed be brought up here? Returns (ok, reason)."""
    if not sys.platform.startswith("linux"):
        return False, f"the Slurm testbed needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "the Slurm testbed must run as root (it starts slurmd/munged and edits /etc/hosts)"
    missing = _missing(RUNTIME_BINARIES)
    if missing:
        return False, ("Slurm/munge binaries missing: " + ", ".join(missing)
                       + " (run: python3 tests/testbed/slurm_testbed.py install)")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return False, "user 'munge' does not exist (is the munge package installed?)"
    return True, "ok"


def install(log: Callable[[str], None] = _log_stderr) -> bool:
    """apt-get install the Slurm and munge packages. Returns True if it installed."""
    if os.geteuid() != 0:
        raise TestbedError("install must run as root (it calls apt-get)")
    if not _missing(INSTALL_BINARIES):
        log("Slurm and munge are already installed (" + ", ".join(INSTALL_BINARIES) + " found)")
        return False
    if _which("apt-get") is None:
        raise TestbedError("apt-get not found: this installer supports Debian/Ubuntu only")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # `apt-get update` only when the package lists do not know the packages yet
    # (a fresh image ships without lists; re-fetching them costs time).
    need_update = False
    for pkg in APT_PACKAGES:
        policy = _run(["apt-cache", "policy", pkg], env=env, timeout=60)
        out = policy.stdout.decode("utf-8", "replace")
        if policy.returncode != 0 or "Candidate:" not in out or "Candidate: (none)" in out:
            need_update = True
            break
    if need_update:
        log("apt-get update")
        p = subprocess.run(["apt-get", "update"], env=env)
        if p.returncode != 0:
            raise TestbedError(f"apt-get update failed (exit {p.returncode})")
    log("apt-get install -y --no-install-recommends " + " ".join(APT_PACKAGES))
    p = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES],
                       env=env)
    if p.returncode != 0:
        raise TestbedError(f"apt-get install failed (exit {p.returncode})")
    missing = _missing(INSTALL_BINARIES)
    if missing:
        raise TestbedError("installed the packages but still missing: " + ", ".join(missing))
    log("installed")
    return True


# --------------------------------------------------------------------------
# munge


def _munge_works() -> bool:
    enc = _run(["munge", "-n"], timeout=10)
    if enc.returncode != 0 or not enc.stdout.strip():
        return False
    dec = _run(["unmunge"], input=enc.stdout, timeout=10)
    return dec.returncode == 0


def _chown_munge(path: Path) -> None:
    shutil.chown(path, user="munge", group="munge")


def _ensure_munge(start_log: Path, log: Callable[[str], None]) -> int | None:
    """Make munge work. Returns the PID of a munged we started, or None."""
    if _munge_works():
        log("munge already works; using the running munged")
        return None
    MUNGE_RUN_DIR.mkdir(parents=True, exist_ok=True)
    for d in MUNGE_DIRS:
        d.mkdir(parents=True, exist_ok=True)
    if not MUNGE_KEY.exists():
        log(f"creating {MUNGE_KEY}")
        p = _run(["mungekey", "--create", f"--keyfile={MUNGE_KEY}"], timeout=30)
        if p.returncode != 0:
            raise TestbedError("mungekey --create failed:\n"
                               + p.stderr.decode("utf-8", "replace"))
    # munged refuses to start unless its directories and key belong to it and
    # are not group/world writable (the key must not be readable by others).
    for d in MUNGE_DIRS:
        _chown_munge(d)
    os.chmod("/etc/munge", 0o700)
    os.chmod(MUNGE_RUN_DIR, 0o755)
    _chown_munge(MUNGE_KEY)
    os.chmod(MUNGE_KEY, 0o400)
    log("starting munged")
    munged = _which("munged") or "/usr/sbin/munged"
    with open(start_log, "ab") as out:
        # munged forks into the background itself; runuser returns then.
        p = subprocess.run(["runuser", "-u", "munge", "--", munged],
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                           start_new_session=True, timeout=30)
    if p.returncode != 0:
        raise TestbedError(f"munged failed to start (exit {p.returncode})\n"
                           + _tails([start_log, MUNGE_LOG]))
    _wait_until(_munge_works, MUNGE_TIMEOUT, "munge -n | unmunge to succeed",
                [start_log, MUNGE_LOG])
    pid = _live_pid(MUNGE_PID_FILE, "munged")
    if pid is None:
        raise TestbedError(f"munged works but {MUNGE_PID_FILE} names no live munged\n"
                           + _tails([MUNGE_LOG]))
    return pid


# --------------------------------------------------------------------------
# /etc/hosts


def _hosts_lines(nodes: list[tuple[str, str]]) -> list[str]:
    return [f"{addr} {name} {HOSTS_MARK}\n" for name, addr in nodes]


def _rewrite_hosts(add: list[str]) -> None:
    """Drop every line we marked, then append `add`.

    Rewritten in place (not via rename) because /etc/hosts is often a bind
    mount inside containers, which cannot be replaced.
    """
    with open(HOSTS_FILE, "r+", encoding="utf-8") as fh:
        lines = fh.readlines()
        kept = [ln for ln in lines if HOSTS_MARK not in ln]
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        new = kept + add
        if new != lines:
            fh.seek(0)
            fh.writelines(new)
            fh.truncate()


# --------------------------------------------------------------------------
# the testbed


class Testbed:
    """A local Slurm cluster whose files all live in `state_dir`.

    `up()` brings it up (or notices it already is), `down()` tears it down,
    `is_up()` checks the daemons, `env` holds the environment variables a
    Slurm client needs, `partition` the partition to submit to.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, state_dir: Path | str | None = None, nodes: int = 2,
                 cpus: int = 128, gpus: int = 8, memory_mb: int = 1_000_000,
                 log: Callable[[str], None] | None = None, verbose: bool = True):
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be within 1..{MAX_NODES}")
        if cpus < 1 or gpus < 0 or memory_mb < 1:
            raise ValueError("cpus and memory_mb must be positive, gpus non-negative")
        self.nodes = nodes
        self.cpus = cpus
        self.gpus = gpus
        self.memory_mb = memory_mb
        self.partition = PARTITION
        self._log = log if log is not None else (_log_stderr if verbose else _nolog)

    # ---- paths -----------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.state_dir / "gres.conf"

    @property
    def meta_file(self) -> Path:
        return self.state_dir / "testbed.json"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def ctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    @property
    def ctld_pid_file(self) -> Path:
        return self.run_dir / "slurmctld.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd-{node}.log"

    def slurmd_pid_file(self, node: str) -> Path:
        return self.run_dir / f"slurmd-{node}.pid"

    @property
    def jobcomp_file(self) -> Path:
        return self.state_dir / "jobcomp.txt"

    @property
    def dbd_conf(self) -> Path:  # slurmdbd reads slurmdbd.conf beside SLURM_CONF's slurm.conf
        return self.conf.parent / "slurmdbd.conf"

    def _dbd_conf_text(self) -> str:
        return f"""\
# Written by tests/testbed/slurm_testbed.py; removed by its `down`.
AuthType=auth/munge
DbdHost=localhost
DbdAddr={CTLD_ADDR}
DbdPort={DBD_PORT}
SlurmUser=root
PidFile={self.run_dir}/slurmdbd.pid
LogFile={self.log_dir}/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost={CTLD_ADDR}
StoragePort={DB_PORT}
StorageUser=root
StorageLoc=slurm_acct_db
"""

    def sacct_steps(self, job_id: int) -> dict[str, tuple[float, float]]:
        """Slurm's accounting of a job's steps (`sacct -j J -P -o
        JobID,Start,End`): step (batch, 0, 1, ...) -> (Start, End), in seconds
        since the epoch (whole seconds: Slurm keeps no finer). slurmdbd takes
        slurmctld's records a moment after a step ends: asked until each has an End."""
        env = self._client_env()

        def parse(when: str) -> float:
            return time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M:%S"))

        rows: dict[str, tuple[float, float]] = {}

        def complete() -> bool:
            p = _run(["sacct", "-j", str(job_id), "-n", "-P", "-o", "JobID,Start,End"], env=env, timeout=30)
            rows.clear()
            for line in p.stdout.decode("utf-8", "replace").splitlines():
                name, start, end = line.split("|")
                if "." in name and start not in ("Unknown", "None", ""):
                    rows[name.split(".", 1)[1]] = (parse(start), float("nan") if end in ("Unknown", "") else
                                                   parse(end))
            return p.returncode == 0 and bool(rows) and all(e == e for _, e in rows.values())

        _wait_until(complete, 30, f"sacct to record job {job_id}'s steps", [self.log_dir / "slurmdbd.log"])
        return rows

    def steps(self, job_id: int) -> dict[int, tuple[float, float]]:
        """Slurm's own record of a job's steps, from its slurmd logs (sacct
        needs slurmdbd, which the testbed has not): step -> (the first node's
        launch, the last node's end), in seconds since the epoch. Each slurmd
        logs `launch task StepId=J.S request` when it starts a step's tasks and
        `[J.S] done with job` when its slurmstepd ends."""
        import datetime
        import re

        launch = re.compile(rf"^\[([^]]+)\] launch task StepId={job_id}\.(\d+) request")
        done = re.compile(rf"^\[([^]]+)\] \[{job_id}\.(\d+)\] done with job")
        starts: dict[int, float] = {}
        ends: dict[int, float] = {}
        for log in sorted(self.log_dir.glob("slurmd-*.log")):
            if log.name.endswith("-start.log"):
                continue
            for line in log.read_text(errors="replace").splitlines():
                for pattern, into, pick in ((launch, starts, min), (done, ends, max)):
                    m = pattern.match(line)
                    if m:
                        when = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
                        step = int(m.group(2))
                        into[step] = pick(into.get(step, when), when)
        return {step: (starts[step], ends.get(step, float("nan"))) for step in sorted(starts)}

    @property
    def env(self) -> dict[str, str]:
        """Environment variables Slurm clients (sbatch, srun, ...) need."""
        return {"SLURM_CONF": str(self.conf)}

    def node_names(self, count: int | None = None) -> list[str]:
        return [f"node{i}" for i in range(1, (count or self.nodes) + 1)]

    def _node_table(self, count: int) -> list[tuple[str, str, int]]:
        return [(f"node{i}", f"127.0.0.{NODE_ADDR_BASE + i}", SLURMD_BASE_PORT + i)
                for i in range(1, count + 1)]

    def _daemon_env(self) -> dict[str, str]:
        return {"PATH": DAEMON_PATH, "LANG": "C.UTF-8", "HOME": "/root",
                "SLURM_CONF": str(self.conf)}

    def _client_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = env.get("PATH", "") + os.pathsep + DAEMON_PATH
        env.update(self.env)
        return env

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        # Next to the state dir, not inside it: `down` removes the state dir.
        lock_path = self.state_dir.parent / f".{self.state_dir.name}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _meta(self) -> dict:
        try:
            return json.loads(self.meta_file.read_text())
        except (OSError, ValueError):
            return {}

    # ---- config ----------------------------------------------------------

    def _slurm_conf_text(self) -> str:
        sd = self.state_dir
        nodes = self._node_table(self.nodes)
        node_range = f"node[1-{self.nodes}]" if self.nodes > 1 else "node1"
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        node_lines = "\n".join(
            f"NodeName={name} NodeHostname={name} NodeAddr={addr} Port={port} "
            f"CPUs={self.cpus} RealMemory={self.memory_mb}{gres} State=UNKNOWN"
            for name, addr, port in nodes)
        return f"""\
# Written by tests/testbed/slurm_testbed.py; removed by its `down`.
# Clients find this file through SLURM_CONF={self.conf}
ClusterName=hpcyolo-testbed
# "localhost" is accepted by slurmctld whatever the machine's hostname is.
SlurmctldHost=localhost({CTLD_ADDR})
SlurmctldPort={CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may not start again before the launch credential of its
# previous run expires (default 120 s); 10 s keeps requeue tests short.
AuthInfo=cred_expire=10

StateSaveLocation={sd}/ctld
SlurmctldPidFile={self.ctld_pid_file}
SlurmctldLogFile={self.ctld_log}
SlurmctldDebug=info
# %n is the node name: one spool dir, pid file and log per slurmd.
SlurmdSpoolDir={sd}/spool/%n
SlurmdPidFile={sd}/run/slurmd-%n.pid
SlurmdLogFile={sd}/log/slurmd-%n.log
SlurmdDebug=info
# Nodes advertise what slurm.conf says, not what the machine has.
SlurmdParameters=config_overrides

# No cgroups here: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
LaunchType=launch/slurm
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
# Accounting through slurmdbd (MariaDB behind it): `sacct` shows each job's
# steps with Slurm's own Start and End (the ledger is checked against them).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={DBD_PORT}
# GPUs as a TRES (what --gpus-per-node and --mem-per-gpu are counted in
# where accounting is on): a job's GPUs show as AllocTRES=...,gres/gpu=N.
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp_file}

SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Jobs start within about a second of submission.
SchedulerParameters=bf_interval=1,sched_interval=2
GresTypes=gpu

# Ids grow with the clock so they do not restart at 1 after a wipe.
FirstJobId={_first_job_id()}
# Batch jobs may be requeued (scontrol requeue, node failure, preemption).
JobRequeue=1
ReturnToService=2
# SIGTERM to SIGKILL, Slurm's default: what a time limit without a warning
# signal leaves 4 ranks to checkpoint, exit and requeue the job on this
# machine's 2 shared cores (5 s and then 10 s were too short in loaded CI
# runs: the batch shell was killed before its `scontrol requeue`, TIMEOUT).
KillWait=30
InactiveLimit=0
MinJobAge=300
MailProg=/bin/true

# Preemption by partition priority, in REQUEUE mode (Slurm requeues a job
# it preempts): only the jobs of the {PREEMPTIBLE} partition, by jobs of {URGENT}.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE

{node_lines}
PartitionName={PARTITION} Nodes={node_range} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4 PreemptMode=OFF
PartitionName={PREEMPTIBLE} Nodes={node_range} MaxTime=INFINITE State=UP OverSubscribe=FORCE:4 PriorityTier=1 GraceTime={GRACE_TIME}
PartitionName={URGENT} Nodes={node_range} MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE PriorityTier=10 PreemptMode=OFF
"""

    @property
    def fake_dev_dir(self) -> Path:
        return self.state_dir / "dev"

    def _gres_conf_text(self) -> str:
        if not self.gpus:
            return "# no GPUs configured\n"
        node_range = f"node[1-{self.nodes}]" if self.nodes > 1 else "node1"
        last = self.gpus - 1
        files = f"{self.fake_dev_dir}/nvidia[0-{last}]" if last else f"{self.fake_dev_dir}/nvidia0"
        return f"""\
# Written by tests/testbed/slurm_testbed.py. There are no real GPUs.
# Slurm 22.05's gres/gpu plugin drops GPUs declared by Count alone ("Removing
# file-less GPU gpu:(null) from final GRES list"), after which slurmctld
# marks every node INVAL (gres/gpu count reported lower than configured).
# So each GPU gets a File: a symlink to /dev/null (slurmd insists on a
# character or block device). The digits in the names become the indices in
# CUDA_VISIBLE_DEVICES, as on a real site.
AutoDetect=off
NodeName={node_range} Name=gpu File={files}
"""

    def _make_fake_gpu_devices(self) -> None:
        self.fake_dev_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):
            link = self.fake_dev_dir / f"nvidia{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")

    # ---- state -----------------------------------------------------------

    def _recorded_nodes(self) -> list[str]:
        meta = self._meta()
        count = meta.get("nodes")
        if isinstance(count, int) and count > 0:
            return self.node_names(count)
        # No metadata: fall back to the pid files that exist.
        if self.run_dir.is_dir():
            return sorted(p.name[len("slurmd-"):-len(".pid")]
                          for p in self.run_dir.glob("slurmd-*.pid"))
        return []

    def is_up(self) -> bool:
        """True if the state dir exists, slurmctld and every slurmd are alive and munge works."""
        if not self.conf.is_file():
            return False
        if _live_pid(self.ctld_pid_file, "slurmctld") is None:
            return False
        nodes = self._recorded_nodes()
        if not nodes:
            return False
        if not all(_live_pid(self.slurmd_pid_file(n), "slurmd") is not None for n in nodes):
            return False
        # Slurm daemons without munge cannot talk to each other.
        return _munge_works()

    def _ctld_up(self) -> bool:
        p = _run(["scontrol", "ping"], env=self._client_env(), timeout=10)
        return p.returncode == 0 and b"is UP" in p.stdout

    def _idle_nodes(self, states: str = "idle") -> set[str]:
        # -r: responding nodes only ("idle*" = not responding would otherwise match).
        p = _run(["sinfo", "-h", "-N", "-r", "-t", states, "-o", "%N"],
                 env=self._client_env(), timeout=10)
        if p.returncode != 0:
            return set()
        return set(p.stdout.decode().split())

    def _bad_nodes(self) -> dict[str, tuple[str, str]]:
        p = _run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], env=self._client_env(), timeout=10)
        bad = {}
        if p.returncode == 0:
            for line in p.stdout.decode("utf-8", "replace").splitlines():
                name, _, rest = line.partition("|")
                state, _, reason = rest.partition("|")
                if state.startswith(("inval", "drain", "fail")):
                    bad[name] = (state, reason)
        return bad

    # ---- up --------------------------------------------------------------

    def up(self) -> bool:
        """Bring the cluster up. Returns False if it was already up."""
        ok, why = available()
        if not ok:
            raise TestbedError(why)
        with self._lock():
            if self.is_up():
                meta = self._meta()
                want = {"nodes": self.nodes, "cpus": self.cpus, "gpus": self.gpus,
                        "memory_mb": self.memory_mb}
                have = {k: meta.get(k) for k in want}
                if have != want:
                    self._log(f"warning: testbed already up with {have}, not {want}; "
                              "run `down` first to change it")
                self._log(f"already up ({self.state_dir})")
                return False
            if self.state_dir.exists():
                self._log(f"cleaning up a stale testbed in {self.state_dir}")
                self._teardown(remove_state=True)
            try:
                self._bring_up()
            except BaseException:
                # Stop what we started but keep the state dir (logs) to look at;
                # the next `up` or `down` removes it.
                with contextlib.suppress(Exception):
                    self._teardown(remove_state=False)
                raise
        return True

    def _bring_up(self) -> None:
        t0 = time.monotonic()
        sd = self.state_dir
        for d in (sd, sd / "ctld", sd / "spool", self.run_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(sd, 0o755)
        for name in self.node_names():
            (sd / "spool" / name).mkdir(exist_ok=True)
        self._make_fake_gpu_devices()
        self.gres_conf.write_text(self._gres_conf_text())
        self.conf.write_text(self._slurm_conf_text())
        meta = {"nodes": self.nodes, "cpus": self.cpus, "gpus": self.gpus,
                "memory_mb": self.memory_mb, "munged_pid": None,
                "hosts": [f"{addr} {name}" for name, addr, _ in self._node_table(self.nodes)]}
        self.meta_file.write_text(json.dumps(meta, indent=2) + "\n")

        _rewrite_hosts(_hosts_lines([(n, a) for n, a, _ in self._node_table(self.nodes)]))

        munged_pid = _ensure_munge(self.log_dir / "munged-start.log", self._log)
        if munged_pid is not None:
            # Record it, so `down` stops only a munged that we started.
            meta["munged_pid"] = munged_pid
            self.meta_file.write_text(json.dumps(meta, indent=2) + "\n")

        env = self._daemon_env()
        self._start_accounting(env)
        self._log("starting slurmctld")
        ctld_start_log = self.log_dir / "slurmctld-start.log"
        ctld_watch = _LogWatch(self.ctld_log)
        with open(ctld_start_log, "ab") as out:
            # Without -D slurmctld forks into the background and writes its
            # pid file; -i ignores unreadable state (there is none: fresh dir).
            p = subprocess.run([_which("slurmctld") or "slurmctld", "-i"], env=env,
                               cwd=sd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                               start_new_session=True, timeout=60)
        if p.returncode != 0:
            raise TestbedError(f"slurmctld exited {p.returncode}\n"
                               + _tails([ctld_start_log, self.ctld_log]))
        logs = [ctld_start_log, self.ctld_log]

        def ctld_started() -> bool:
            ctld_watch.check("slurmctld")
            return _live_pid(self.ctld_pid_file, "slurmctld") is not None

        def ctld_answers() -> bool:
            ctld_watch.check("slurmctld")
            return self._ctld_up()

        _wait_until(ctld_started, CTLD_TIMEOUT, f"slurmctld to write {self.ctld_pid_file}", logs)
        _wait_until(ctld_answers, CTLD_TIMEOUT, "`scontrol ping` to report slurmctld UP", logs)

        watches = {name: _LogWatch(self.slurmd_log(name)) for name in self.node_names()}
        for name in self.node_names():
            self._start_slurmd(name, env)
        for name in self.node_names():
            self._wait_slurmd(name, watches[name])
        want = set(self.node_names())

        def all_idle() -> bool:
            for n, watch in watches.items():
                watch.check(f"slurmd {n}")
            # A node that registers with less than slurm.conf promises (e.g. a
            # gres.conf problem) is set INVAL/DRAIN and never becomes idle.
            bad = self._bad_nodes()
            if bad:
                raise TestbedError(
                    "nodes failed to register: "
                    + "; ".join(f"{n} is {st} ({why})" for n, (st, why) in sorted(bad.items()))
                    + "\n" + _tails([self.ctld_log] + [self.slurmd_log(n) for n in sorted(bad)]))
            return want <= self._idle_nodes()

        def node_logs() -> list[Path]:
            missing = sorted(want - self._idle_nodes())
            return [self.ctld_log] + [self.slurmd_log(n) for n in missing]

        _wait_until(all_idle, NODES_TIMEOUT,
                    f"`sinfo -h -N -t idle` to list {', '.join(sorted(want))}", node_logs)
        self._log(f"up: {self.nodes} node(s), partition {PARTITION}, "
                  f"in {time.monotonic() - t0:.1f} s; SLURM_CONF={self.conf}")

    def _start_accounting(self, env: dict[str, str]) -> None:
        """MariaDB (its own data directory, on loopback, no grant tables)
        and slurmdbd on it, with the testbed's cluster registered."""
        sd = self.state_dir
        self._log("starting mariadbd and slurmdbd (accounting)")
        out = self.log_dir / "mariadb-install.log"
        with open(out, "ab") as fh:
            p = subprocess.run([_which("mariadb-install-db") or "mariadb-install-db", "--no-defaults", "--user=root",
                                f"--datadir={sd}/mysql", "--auth-root-authentication-method=normal",
                                "--skip-test-db"], env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                               timeout=120)
        if p.returncode != 0:
            raise TestbedError(f"mariadb-install-db exited {p.returncode}\n" + _tails([out]))
        db_log = self.log_dir / "mariadbd.err"
        subprocess.Popen([_which("mariadbd") or "mariadbd", "--no-defaults", "--user=root", f"--datadir={sd}/mysql",
                          f"--socket={self.run_dir}/mariadbd.sock", f"--port={DB_PORT}", f"--bind-address={CTLD_ADDR}",
                          f"--pid-file={self.run_dir}/mariadbd.pid", f"--log-error={db_log}", "--skip-grant-tables",
                          "--skip-log-bin", "--innodb-buffer-pool-size=32M"],
                         env=env, cwd=sd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_until(lambda: _live_pid(self.run_dir / "mariadbd.pid", "mariadbd") is not None and
                    "ready for connections" in (db_log.read_text(errors="replace") if db_log.exists() else ""),
                    DB_TIMEOUT, "mariadbd to be ready for connections", [db_log])
        self.dbd_conf.write_text(self._dbd_conf_text())
        os.chmod(self.dbd_conf, 0o600)  # slurmdbd refuses a config others may read
        out = self.log_dir / "slurmdbd-start.log"
        with open(out, "ab") as fh:
            p = subprocess.run([_which("slurmdbd") or "slurmdbd"], env=env, cwd=sd, stdin=subprocess.DEVNULL,
                               stdout=fh, stderr=fh, start_new_session=True, timeout=60)
        if p.returncode != 0:
            raise TestbedError(f"slurmdbd exited {p.returncode}\n" + _tails([out, self.log_dir / "slurmdbd.log"]))
        client = self._client_env()

        def dbd_answers() -> bool:
            return _run(["sacctmgr", "-n", "-P", "show", "cluster"], env=client, timeout=15).returncode == 0

        _wait_until(dbd_answers, DB_TIMEOUT, "slurmdbd to answer `sacctmgr show cluster`",
                    [out, self.log_dir / "slurmdbd.log"])
        p = _run(["sacctmgr", "-i", "add", "cluster", "hpcyolo-testbed"], env=client, timeout=30)
        if p.returncode != 0 and b"already exists" not in p.stdout + p.stderr:
            raise TestbedError("sacctmgr add cluster failed: " + (p.stdout + p.stderr).decode("utf-8", "replace"))

    def _start_slurmd(self, name: str, env: dict[str, str]) -> None:
        self._log(f"starting slurmd {name}")
        start_log = self.log_dir / f"slurmd-{name}-start.log"
        slurmd = _which("slurmd") or "slurmd"
        # Own UTS namespace, so `hostname` in a task prints the node name.
        # unshare (no --fork) and `exec` keep one process; slurmd then forks
        # into the background (no -D), so the daemon is not our child, and
        # writes its own PID to SlurmdPidFile (%n -> name).
        inner = f"hostname {shlex.quote(name)} && exec {shlex.quote(slurmd)} -N {shlex.quote(name)}"
        with open(start_log, "ab") as out:
            p = subprocess.run(["unshare", "--uts", "--", "sh", "-c", inner], env=env,
                               cwd=self.state_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                               start_new_session=True, timeout=60)
        if p.returncode != 0:
            raise TestbedError(f"slurmd {name} exited {p.returncode}\n"
                               + _tails([start_log, self.slurmd_log(name)]))

    def _wait_slurmd(self, name: str, watch: _LogWatch) -> None:
        def started() -> bool:
            watch.check(f"slurmd {name}")
            return _live_pid(self.slurmd_pid_file(name), "slurmd") is not None

        _wait_until(started, NODES_TIMEOUT, f"slurmd {name} to write {self.slurmd_pid_file(name)}",
                    [self.log_dir / f"slurmd-{name}-start.log", self.slurmd_log(name)])

    def revive(self) -> list[str]:
        """Restart every slurmd that has died, and wait until its node takes
        jobs again; the names of the nodes restarted.

        Debian's slurmd 22.05.8 has been seen to abort ("malloc(): unaligned
        tcache chunk detected", in slurm_hostlist_create_dims) when two task
        launches reach it in the same instant. Tests call this first, so one
        such crash fails one test instead of every test after it.
        """
        with self._lock():
            dead = [n for n in self._recorded_nodes() if _live_pid(self.slurmd_pid_file(n), "slurmd") is None]
            if not dead:
                return []
            env = self._daemon_env()
            for name in dead:
                watch = _LogWatch(self.slurmd_log(name))
                self._start_slurmd(name, env)
                self._wait_slurmd(name, watch)
            # ReturnToService=2: a node that was DOWN takes jobs once it registers.
            _wait_until(lambda: set(dead) <= self._idle_nodes("idle,alloc,mix"), NODES_TIMEOUT,
                        f"{', '.join(dead)} to register again", [self.ctld_log])
        return dead

    # ---- down ------------------------------------------------------------

    def down(self) -> bool:
        """Tear the cluster down. Returns False if there was nothing to do."""
        if os.geteuid() != 0:
            raise TestbedError("down must run as root (it stops root daemons and edits /etc/hosts)")
        with self._lock():
            had_state = self.state_dir.exists()
            self._teardown(remove_state=True)
        return had_state

    def cancel_all(self) -> list[str]:
        """Cancel every job in the queue and wait until it is empty; the ids."""
        with contextlib.suppress(TestbedError):
            return self._drain_jobs()
        return []

    def _drain_jobs(self) -> list[str]:
        env = self._client_env()
        if not self._ctld_up():
            return []
        q = _run(["squeue", "-h", "-o", "%A"], env=env, timeout=15)
        ids = sorted(set(q.stdout.decode().split())) if q.returncode == 0 else []
        if not ids:
            return []
        self._log(f"cancelling {len(ids)} job(s)")
        _run(["scancel", *ids], env=env, timeout=30)

        def empty() -> bool:
            r = _run(["squeue", "-h", "-o", "%A"], env=env, timeout=15)
            return r.returncode == 0 and not r.stdout.strip()

        try:
            _wait_until(empty, DRAIN_TIMEOUT, "squeue to empty after scancel", [self.ctld_log])
        except TestbedError as exc:
            # Keep going: stopping the daemons matters more than a clean drain.
            self._log(f"warning: {exc}")
        return ids

    def _teardown(self, remove_state: bool) -> None:
        meta = self._meta()
        if self.state_dir.exists():
            with contextlib.suppress(Exception):
                self._drain_jobs()
            # slurmd first, so no node is re-registered while ctld goes down.
            pid_files = sorted(self.run_dir.glob("slurmd-*.pid")) if self.run_dir.is_dir() else []
            for pf in pid_files:
                pid = _live_pid(pf, "slurmd")
                if pid is not None:
                    _stop_pid(pid, f"slurmd {pf.stem[len('slurmd-'):]}", self._log)
            pid = _live_pid(self.ctld_pid_file, "slurmctld")
            if pid is not None:
                _stop_pid(pid, "slurmctld", self._log)
            for name in ("slurmdbd", "mariadbd"):
                pid = _live_pid(self.run_dir / f"{name}.pid", name)
                if pid is not None:
                    _stop_pid(pid, name, self._log)
            munged_pid = meta.get("munged_pid")
            if isinstance(munged_pid, int):
                # Only a munged this testbed started; prefer munged's own pid file.
                pid = _live_pid(MUNGE_PID_FILE, "munged")
                if pid is None and _pid_alive(munged_pid) and _pid_comm(munged_pid) == "munged":
                    pid = munged_pid
                if pid is not None:
                    _stop_pid(pid, "munged", self._log)
        _rewrite_hosts([])
        if remove_state and self.state_dir.exists():
            self._log(f"removing {self.state_dir}")
            shutil.rmtree(self.state_dir, ignore_errors=True)
            if self.state_dir.exists():
                raise TestbedError(f"could not remove {self.state_dir}")

    # ---- helpers for tests -----------------------------------------------

    def requeue(self, job_id: int | str, start_now: bool = True, timeout: float = 30) -> None:
        """`scontrol requeue` a running batch job; optionally let it restart at once.

        Slurm holds a requeued job until the launch credential of its previous
        run expires (cred_expire, 10 s here). `scontrol update StartTime=now`
        lifts that hold, but only once the job is back to PENDING: issued while
        it is still COMPLETING, the hold is set again when the old run ends.
        """
        env = self._client_env()
        p = _run(["scontrol", "requeue", str(job_id)], env=env, timeout=30)
        if p.returncode != 0:
            raise TestbedError(f"scontrol requeue {job_id} failed: "
                               + (p.stdout + p.stderr).decode("utf-8", "replace").strip())
        if not start_now:
            return

        def pending() -> bool:
            r = _run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], env=env, timeout=15)
            return r.returncode == 0 and r.stdout.decode().strip() == "PENDING"

        _wait_until(pending, timeout, f"requeued job {job_id} to be PENDING", [self.ctld_log])
        p = _run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env, timeout=30)
        if p.returncode != 0:
            raise TestbedError(f"scontrol update JobId={job_id} StartTime=now failed: "
                               + (p.stdout + p.stderr).decode("utf-8", "replace").strip())

    # ---- status ----------------------------------------------------------

    def sinfo(self) -> str:
        p = _run(["sinfo", "-N", "-o", "%N %P %T %c %m %G"], env=self._client_env(), timeout=15)
        return (p.stdout + p.stderr).decode("utf-8", "replace").rstrip()


# --------------------------------------------------------------------------
# command line


def _make_testbed(args: argparse.Namespace, **kw) -> Testbed:
    return Testbed(state_dir=args.state_dir, **kw)


def _cmd_install(args: argparse.Namespace) -> int:
    install()
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    tb = _make_testbed(args, nodes=args.nodes, cpus=args.cpus, gpus=args.gpus,
                       memory_mb=args.memory_mb)
    tb.up()
    print(f"export SLURM_CONF={shlex.quote(str(tb.conf))}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    tb = _make_testbed(args)
    if not tb.down():
        _log_stderr(f"nothing to tear down ({tb.state_dir} does not exist)")
    else:
        _log_stderr("down")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    tb = _make_testbed(args)
    if tb.is_up():
        meta = tb._meta()
        print(f"up: state dir {tb.state_dir}, SLURM_CONF={tb.conf}, "
              f"{meta.get('nodes')} node(s), partition {PARTITION}")
        print(tb.sinfo())
        return 0
    if tb.state_dir.exists():
        print(f"down (stale state in {tb.state_dir}: some daemons are not running; "
              "run `down` to clean up or `up` to restart)")
    else:
        print("down")
    return 1


def _cmd_env(args: argparse.Namespace) -> int:
    tb = _make_testbed(args)
    for key, value in tb.env.items():
        print(f"export {key}={shlex.quote(value)}")
    if not tb.is_up():
        _log_stderr("note: the testbed is not up")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slurm_testbed.py",
        description="Install, bring up and tear down a real local multi-node Slurm "
                    "cluster for hpcyolo's tests (run as root; Debian/Ubuntu).",
        epilog="Typical use: install; up; eval \"$(slurm_testbed.py env)\"; "
               "sbatch/srun ...; down. All files live in the state dir; nothing is "
               "written to /etc/slurm. Exit status of `status`: 0 up, 1 down.",
    )
    parser.add_argument("--state-dir", type=Path, default=default_state_dir(),
                        help="where config, state, logs and pid files live "
                             "(default: $HPCYOLO_TESTBED_DIR or /tmp/hpcyolo-testbed; "
                             "now %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("install", help="apt-get install slurmctld slurmd slurm-client munge "
                       "(skipped if already installed)")
    p.set_defaults(func=_cmd_install)

    p = sub.add_parser("up", help="bring the cluster up and wait until every node is idle "
                       "(does nothing if already up); prints the export SLURM_CONF line")
    p.add_argument("--nodes", type=int, default=2, help="number of nodes node1..nodeN (default 2)")
    p.add_argument("--cpus", type=int, default=128, help="CPUs per node (default 128)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs (gres gpu) per node (default 8)")
    p.add_argument("--memory-mb", type=int, default=1_000_000,
                   help="RealMemory per node in MB (default 1000000)")
    p.set_defaults(func=_cmd_up)

    p = sub.add_parser("down", help="cancel all jobs, stop the daemons it started (by PID), "
                       "remove its /etc/hosts lines and the state dir")
    p.set_defaults(func=_cmd_down)

    p = sub.add_parser("status", help="say whether the cluster is up and list nodes (sinfo)")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("env", help="print export lines for a shell: eval \"$(... env)\"")
    p.set_defaults(func=_cmd_env)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TestbedError as exc:
        print(f"slurm_testbed: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
