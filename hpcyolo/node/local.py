"""Run N training processes on this machine with the standard variables.

What srun does on a cluster, for one node without Slurm (`launch`), or for
this host's share of a job whose launcher starts one process per host
(`launch_layout`: SageMaker, a Kubernetes pod): each process gets RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and a fair
share of the cores. When one process fails, the others are stopped
(srun --kill-on-bad-exit), and a signal sent to the launcher is passed on.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Mapping, Sequence

from hpcyolo.node.distenv import JOB_ENV, NodeLayout


def free_port() -> int:
    """A port the kernel says is free now, on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: Sequence[str], nproc: int, *, env: Mapping[str, str] | None = None, port: int | None = None,
           grace: float = 30.0, first: dict | None = None) -> int:
    """Run `argv` nproc times, a job of this machine alone; return 0, or the
    first failure's exit code (and, in `first`, its "rank" and "code")."""
    base = dict(os.environ if env is None else env)
    # This launch's identity, checked at the rendezvous: another launch that
    # got the same port is refused, never joined (hpcyolo_trainer.common.rendezvous).
    job = base.get(JOB_ENV) or f"local launch {os.getpid()}-{secrets.token_hex(4)}"
    layout = NodeLayout(node_rank=0, nnodes=1, nproc_per_node=nproc, master_addr="127.0.0.1",
                        master_port=port or free_port(), host=socket.gethostname(), source="local", job=job)
    return launch_layout(argv, layout, env=base, grace=grace, first=first)


def launch_layout(argv: Sequence[str], layout: NodeLayout, *, env: Mapping[str, str] | None = None,
                  grace: float = 30.0, first: dict | None = None) -> int:
    """Run this host's processes of `layout`: process i gets
    `layout.dist_env(i)`'s variables (RANK = node rank * nproc + i, the
    master host's address), so the hosts of a job form one process group."""
    base = dict(os.environ if env is None else env)
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // layout.nproc_per_node)))
    procs = [subprocess.Popen(list(argv), env={**base, **layout.dist_env(i).standard_vars()})
             for i in range(layout.nproc_per_node)]

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                                        signal.SIGUSR2)}
    try:
        return _wait(procs, grace, {} if first is None else first)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _wait(procs: list[subprocess.Popen], grace: float, first: dict) -> int:
    exits = _exit_fds(procs)
    try:
        while any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                code = p.poll()
                if code not in (None, 0) and not first:
                    first.update(rank=rank, code=code)
                    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
                    print(f"hpcyolo: rank {rank} {how}; stopping the others", file=sys.stderr)
                    _stop(procs, grace)
            _until_one_ends(procs, exits)
    finally:
        for fd in exits.values():
            os.close(fd)
    if first:
        return first["code"]
    return next((p.returncode for p in procs if p.returncode != 0), 0)


def _exit_fds(procs: list[subprocess.Popen]) -> dict[int, int]:
    """A pidfd per process (readable once it has exited), where the kernel
    has them (Linux 5.3 and later); else none, and _until_one_ends polls."""
    fds: dict[int, int] = {}
    for p in procs:
        try:
            fds[p.pid] = os.pidfd_open(p.pid)
        except (AttributeError, OSError):
            for fd in fds.values():
                os.close(fd)
            return {}
    return fds


def _until_one_ends(procs: list[subprocess.Popen], exits: dict[int, int]) -> None:
    """Return when one of the running processes has exited (at once, by its
    pidfd), after a second at most; without pidfds, after 0.1 s."""
    running = [exits[p.pid] for p in procs if p.returncode is None and p.pid in exits]
    if not running:
        time.sleep(0.1)
        return
    ends = select.poll()  # poll, not select: a descriptor may be above select's 1024
    for fd in running:
        ends.register(fd, select.POLLIN)
    ends.poll(1000)  # a signal to forward runs its handler and the wait goes on


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
