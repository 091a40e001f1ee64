"""Drills for the watchdog, the straggler report and the failure retry:
what a hung, slow, stopped or killed rank does, on purpose, so that tests
(and a user rehearsing a cluster) can watch the job's answer. Each is an
environment variable (docs/architecture.md lists them with the others):

- HPCYOLO_DRILL_SLOW=RANK:SECONDS: that rank sleeps SECONDS in each step,
  inside its forward pass (a throttled GPU, a noisy neighbour);
- HPCYOLO_DRILL_STALL=RANK:STEP: after optimizer step STEP that rank blocks
  for good inside its next forward pass, alive (its stack shows the drill);
- HPCYOLO_DRILL_FREEZE=RANK:STEP: after optimizer step STEP that rank sends
  itself SIGSTOP, as `kill -STOP PID` would;
- HPCYOLO_DRILL_KILL=HOST:STEP: after optimizer step STEP every rank on HOST
  sends itself SIGKILL (a node lost); on other hosts nothing happens, so a
  job retried without HOST runs through. Before it, every rank lets the
  checkpoint writes of earlier steps reach the disk and waits for the others
  (a node lost between two steps: which checkpoint the retry resumes from
  is known, not a race with the background writer);
- HPCYOLO_DRILL_FAULT=HOST:STEP: after optimizer step STEP every rank on
  HOST raises the error NCCL raises when its node's network fails
  (DistBackendError, "unhandled system error"), as a bad link or GPU would;
- HPCYOLO_DRILL_VAL_SIGNAL=BATCH: before its validation batch BATCH (its
  own count, from 0) every rank sends itself the site's signal, once, in a
  process that did not resume (a resumed run validates through).
"""

from __future__ import annotations

import os
import signal
import time

SLOW_ENV, STALL_ENV = "HPCYOLO_DRILL_SLOW", "HPCYOLO_DRILL_STALL"
FREEZE_ENV, KILL_ENV = "HPCYOLO_DRILL_FREEZE", "HPCYOLO_DRILL_KILL"
FAULT_ENV, VAL_SIGNAL_ENV = "HPCYOLO_DRILL_FAULT", "HPCYOLO_DRILL_VAL_SIGNAL"
ALL = (SLOW_ENV, STALL_ENV, FREEZE_ENV, KILL_ENV, FAULT_ENV, VAL_SIGNAL_ENV)


def _pair(env, name: str) -> tuple[str, float] | None:
    value = env.get(name)
    if not value:
        return None
    who, _, number = value.rpartition(":")
    return who, float(number)


class Drills:
    """The drills set for this rank; `from_env` gives None when none is."""

    def __init__(self, rank: int, host: str, env):
        slow, stall, freeze, kill, fault = (_pair(env, n) for n in (SLOW_ENV, STALL_ENV, FREEZE_ENV, KILL_ENV,
                                                                     FAULT_ENV))
        self.slow = slow[1] if slow and slow[0] == str(rank) else 0.0
        self.stall = int(stall[1]) if stall and stall[0] == str(rank) else None
        self.freeze = int(freeze[1]) if freeze and freeze[0] == str(rank) else None
        self.kill = int(kill[1]) if kill and kill[0] == host else None
        self.kill_step = int(kill[1]) if kill else None  # every rank settles its writes before the kill
        self.fault = int(fault[1]) if fault and fault[0] == host else None
        val_signal = env.get(VAL_SIGNAL_ENV)
        self.val_signal = int(val_signal) if val_signal else None

    @classmethod
    def from_env(cls, rank: int, host: str, env=os.environ) -> Drills | None:
        return cls(rank, host, env) if any(env.get(n) for n in ALL) else None

    def in_step(self, done: int) -> None:
        """Inside the forward pass of the step after optimizer step `done`."""
        if self.slow:
            time.sleep(self.slow)
        if self.stall is not None and done == self.stall:
            drill_stall(done)

    def after_step(self, step: int) -> None:
        if self.freeze is not None and step == self.freeze:
            print(f"drill: rank stopping itself (SIGSTOP) after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kill_step is not None and step == self.kill_step:
            settle_writes()
        if self.kill is not None and step == self.kill:
            print(f"drill: killing this rank (SIGKILL) after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault is not None and step == self.fault:
            import torch.distributed as dist

            print(f"drill: this rank's network fails after step {step}", flush=True)
            raise dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp, unhandled system error (run with "
                                        "NCCL_DEBUG=INFO for details)\nncclSystemError: System call (e.g. socket, "
                                        "malloc) or external library call failed or device error. (hpcyolo drill)")
    def in_validation(self, batch: int, signal_name: str) -> None:
        """Before validation batch `batch` of this rank."""
        if self.val_signal is not None and batch == self.val_signal:
            self.val_signal = None  # once
            print(f"drill: SIG{signal_name} to this rank before its validation batch {batch}", flush=True)
            os.kill(os.getpid(), getattr(signal, f"SIG{signal_name}"))


def settle_writes() -> None:
    """Every checkpoint write in flight on every rank reaches the disk."""
    import torch.distributed as dist

    from .checkpoint import finish_writes

    finish_writes()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def drill_stall(step: int) -> None:
    """Blocks for good: a rank stuck inside a step, alive."""
    print(f"drill: stalling inside the step after step {step}", flush=True)
    while True:
        time.sleep(1)
