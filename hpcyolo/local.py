"""Run N training processes on this machine with the standard variables.

What srun does on a cluster, for one node without Slurm: each process gets
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and a
fair share of the cores. When one process fails, the others are stopped
(srun --kill-on-bad-exit), and a signal sent to the launcher is passed on.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import Mapping, Sequence

from .distenv import JOB_ENV


def free_port() -> int:
    """A port the kernel says is free now, on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: Sequence[str], nproc: int, *, env: Mapping[str, str] | None = None, port: int | None = None,
           grace: float = 30.0) -> int:
    """Run `argv` nproc times; return 0, or the first failure's exit code."""
    base = dict(os.environ if env is None else env)
    threads = str(max(1, (os.cpu_count() or 1) // nproc))
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port or free_port()), WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc))
    # This launch's identity, checked at the rendezvous: another launch that
    # got the same port is refused, never joined (hpcyolo.rendezvous).
    base.setdefault(JOB_ENV, f"local launch {os.getpid()}-{secrets.token_hex(4)}")
    base.setdefault("OMP_NUM_THREADS", threads)
    procs = [subprocess.Popen(list(argv), env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(nproc)]

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                                        signal.SIGUSR2)}
    try:
        return _wait(procs, grace)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _wait(procs: list[subprocess.Popen], grace: float) -> int:
    failed = None
    while any(p.poll() is None for p in procs):
        for rank, p in enumerate(procs):
            code = p.poll()
            if code not in (None, 0) and failed is None:
                failed = code
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
                print(f"hpcyolo: rank {rank} {how}; stopping the others", file=sys.stderr)
                _stop(procs, grace)
        time.sleep(0.1)
    if failed is not None:
        return failed
    return next((p.returncode for p in procs if p.returncode != 0), 0)


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
