"""The preemption protocol shared by the sbatch script and the trainer.

Slurm warns a job before its time limit (or before preempting it) with the
site's signal. The handler only sets a flag; the trainer looks at the flag
after each optimizer step, all ranks agree on what to do (an all-reduce, so no
rank is left in a collective), and then either:

- CHECKPOINT: rank 0 writes a checkpoint, every rank exits EXIT_CODE, and the
  batch script requeues the job (on exactly that code, or the marker file);
- STOP: every rank stops without a checkpoint and without a requeue.

Which one is `StopFlag.decide`'s answer. The site's signal (and the test
drill, and Ctrl-C of an interactive run) checkpoint. SIGTERM is what Slurm
sends on `scancel`, at the time limit, on preemption and on requeue, and what
srun sends the surviving ranks when one rank died: what it means is the
answer of StopFlag's `on_sigterm`, which `hpcyolo train` takes from Slurm
(hpcyolo.node.slurm_stop); without it SIGTERM stops.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, Mapping

from .record import record

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again later".
EXIT_CODE = 75
# A rank whose collective failed because another rank is gone (EX_PROTOCOL,
# "remote error"): the batch script names the rank that died first, not this one.
PEER_LOST_EXIT_CODE = 76
# A rank whose own device or network failed under it (an ECC error, a GPU off
# the bus, NCCL's system error): its node's failure, which the job retries
# without that node (hpcyolo.node.job), unlike a user's error (exit 1).
DEVICE_FAULT_EXIT_CODE = 78
# Stopped by SIGTERM without a checkpoint (128 + SIGTERM, as a shell reports it).
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
# The hang watchdog (run/watchdog.py) ended a step that did not end (sysexits stop at 78).
HANG_EXIT_CODE = 79

# Where the trainer records that it stopped for preemption, once its
# checkpoint is on disk. The batch script requeues on EXIT_CODE or on this
# file: with srun --kill-on-bad-exit, the first rank to exit 75 gets the
# others killed, and srun may then report their signal instead of 75.
MARKER_ENV = "HPCYOLO_PREEMPT_MARKER"
# Node-local scratch of the job (staged data, caches): removed by the node's
# first rank on an ending that no requeue follows.
SCRATCH_ENV = "HPCYOLO_SCRATCH_DIR"
# The restart of a job without Slurm (`hpcyolo run` starts its training again
# after a rank's failure): names this start's records as SLURM_RESTART_COUNT does.
LOCAL_RESTART_ENV = "HPCYOLO_RESTART"
# The training step's start inside one allocation (the batch script starts it
# again without a failed node: 1, 2, ...; 0 or unset at first): this start's
# records are named RESTART.N (rundir.ledger_file, hang_folder).
IN_PLACE_ENV = "HPCYOLO_IN_PLACE"
# The nodes that training step leaves out so far (a comma list; the batch script's).
EXCLUDED_ENV = "HPCYOLO_EXCLUDED"


def start_name(restart: str, env) -> str:
    """A start's name in the run's records: Slurm's restart count, and the
    step's start inside the allocation after the first."""
    k = env.get(IN_PLACE_ENV, "0")
    return restart if k in ("", "0") else f"{restart}.{k}"

# A drill for tests and for trying a cluster's requeue path: behave as if the
# signal arrived right after this optimizer step.
DRILL_ENV = "HPCYOLO_DRILL_PREEMPT_STEP"
# A drill for tests that send a real signal (scancel --signal, scontrol
# requeue) mid-epoch: after this optimizer step, each rank waits until a
# signal has reached it, so a fast run cannot end before the signal comes.
HOLD_ENV = "HPCYOLO_DRILL_HOLD_STEP"

NONE, STOP, CHECKPOINT = 0, 1, 2  # ordered: ranks agree on the largest


@record(kw_only=False)
class Decision:
    """What the ranks do at a step boundary, and why."""

    action: int  # NONE, STOP or CHECKPOINT
    reason: str = ""
    requeue: bool = False  # a requeue will follow: keep node-local scratch


def stop_on_sigterm(env) -> Decision:
    """SIGTERM outside a cluster that can say why: stop, without a checkpoint."""
    return Decision(STOP, "SIGTERM")


class StopFlag:
    """Set by the site's signal, SIGTERM and SIGINT; `decide` says what to
    do. What SIGTERM means is `on_sigterm(environ)`'s answer: under Slurm,
    hpcyolo asks Slurm (hpcyolo.node.slurm_stop.sigterm_decision)."""

    def __init__(self, signal_name: str, on_sigterm: Callable[[Mapping[str, str]], Decision] = stop_on_sigterm):
        self.signal_name = signal_name
        self.on_sigterm = on_sigterm
        self.received: list[str] = []
        drill = os.environ.get(DRILL_ENV)
        self._drill_step = int(drill) if drill else None
        hold = os.environ.get(HOLD_ENV)
        self._hold_step = int(hold) if hold else None
        for name in {signal_name, "TERM", "INT"}:
            signal.signal(getattr(signal, f"SIG{name}"), self._handler)

    @property
    def requested(self) -> bool:
        return bool(self.received)

    @property
    def drill(self) -> bool:
        return self._drill_step is not None or self._hold_step is not None

    def _handler(self, signum, frame) -> None:
        if signum == signal.SIGINT and "INT" in self.received:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        # Only a flag: the work happens at the next step boundary.
        self.received.append(signal.Signals(signum).name[3:])

    def decide(self, step: int, env=os.environ) -> Decision:
        """What this rank asks for after optimizer step `step`."""
        if self._hold_step is not None and step == self._hold_step and not self.received:
            print(f"drill: holding after step {step} until a signal arrives", flush=True)
            while not self.received:
                time.sleep(0.05)
        if self._drill_step is not None and step == self._drill_step:  # once: not again after the resume
            return Decision(CHECKPOINT, f"drill at step {self._drill_step}", requeue=True)
        if self.signal_name in self.received:
            return Decision(CHECKPOINT, f"SIG{self.signal_name}", requeue=True)  # the site's preemption signal
        if "TERM" in self.received:
            return self.on_sigterm(env)
        if "INT" in self.received:
            return Decision(CHECKPOINT, "SIGINT", requeue=True)
        return Decision(NONE)


def mark_preempted(reason: str) -> None:
    """Leave the marker the batch script looks for (when it asked for one)."""
    path = os.environ.get(MARKER_ENV)
    if path:
        from .fsutil import write_atomic

        write_atomic(path, f"{reason}\n".encode())
