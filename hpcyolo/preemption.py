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
srun sends the surviving ranks when one rank died: it checkpoints only when
Slurm is in fact requeueing, preempting or timing out the job (`scontrol show
job` says so: see `slurm_stop_reason`), or never where the site says
`preemption.sigterm: stop`. A cancelled job says so and stops.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again later".
EXIT_CODE = 75
# A rank whose collective failed because another rank is gone (EX_PROTOCOL,
# "remote error"): the batch script names the rank that died first, not this one.
PEER_LOST_EXIT_CODE = 76
# Stopped by SIGTERM without a checkpoint (128 + SIGTERM, as a shell reports it).
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM

# Where the trainer records that it stopped for preemption, once its
# checkpoint is on disk. The batch script requeues on EXIT_CODE or on this
# file: with srun --kill-on-bad-exit, the first rank to exit 75 gets the
# others killed, and srun may then report their signal instead of 75.
MARKER_ENV = "HPCYOLO_PREEMPT_MARKER"
# Node-local scratch of the job (staged data, caches): removed by the node's
# first rank on an ending that no requeue follows.
SCRATCH_ENV = "HPCYOLO_SCRATCH_DIR"
# The site's preemption.sigterm: "requeue" (when Slurm says so) or "stop".
SIGTERM_ENV = "HPCYOLO_SIGTERM"

# A drill for tests and for trying a cluster's requeue path: behave as if the
# signal arrived right after this optimizer step.
DRILL_ENV = "HPCYOLO_DRILL_PREEMPT_STEP"
# A drill for tests that send a real signal (scancel --signal, scontrol
# requeue) mid-epoch: after this optimizer step, each rank waits until a
# signal has reached it, so a fast run cannot end before the signal comes.
HOLD_ENV = "HPCYOLO_DRILL_HOLD_STEP"

NONE, STOP, CHECKPOINT = 0, 1, 2  # ordered: ranks agree on the largest


@dataclass(frozen=True)
class Decision:
    action: int  # NONE, STOP or CHECKPOINT
    reason: str = ""
    requeue: bool = False  # a requeue will follow: keep node-local scratch


class StopFlag:
    """Set by the site's signal, SIGTERM and SIGINT; `decide` says what to do."""

    def __init__(self, signal_name: str):
        self.signal_name = signal_name
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
            return sigterm_decision(env)
        if "INT" in self.received:
            return Decision(CHECKPOINT, "SIGINT", requeue=True)
        return Decision(NONE)


def sigterm_decision(env) -> Decision:
    if env.get(SIGTERM_ENV) == "stop":
        return Decision(STOP, "SIGTERM (the site's preemption.sigterm is stop)")
    if not env.get("SLURM_JOB_ID"):
        return Decision(STOP, "SIGTERM")
    from . import slurm
    from .errors import SlurmError

    try:
        info = slurm.show_job(int(env["SLURM_JOB_ID"]), env=env)
    except (SlurmError, ValueError) as e:
        return Decision(STOP, f"SIGTERM, and Slurm cannot say why ({e})")
    return slurm_stop_reason(info, int(env.get("SLURM_RESTART_COUNT") or 0))


def slurm_stop_reason(info: dict[str, str], restarts: int) -> Decision:
    """Why Slurm is ending this job, from `scontrol show job -o` as seen in a
    task that got SIGTERM. Seen on Slurm 22.05 (tests/slurm_output):

    - a requeue (scontrol requeue, or the end of a preemption's grace in
      REQUEUE mode) has already counted the restart (Restarts >
      SLURM_RESTART_COUNT);
    - a job selected for preemption (preempt/partition_prio with a
      GraceTime) is still RUNNING, Reason None, but has a PreemptTime and
      an EndTime moved to the end of the grace; the job's tasks get SIGTERM
      then, the batch shell only when the grace is over. The batch script
      requeues the job once the checkpoint is written, so the run goes on
      whatever the site's PreemptMode (REQUEUE, or CANCEL);
    - at the time limit: COMPLETING with Reason TimeLimit (RunTime past
      TimeLimit), the batch shell signalled too;
    - scancel shows COMPLETING (or CANCELLED) with the restart count
      unchanged; srun ending a step whose rank died leaves the job RUNNING."""
    state = info.get("JobState", "?")
    if int(info.get("Restarts") or 0) > restarts:
        return Decision(CHECKPOINT, "SIGTERM: Slurm is requeueing the job", requeue=True)
    if (state == "PREEMPTED" or "preempt" in info.get("Reason", "").lower()
            or info.get("PreemptTime", "None") not in ("None", "Unknown", "")):
        return Decision(CHECKPOINT, "SIGTERM: Slurm is preempting the job", requeue=True)
    if state in ("TIMEOUT", "DEADLINE") or info.get("Reason") == "TimeLimit" or _past_limit(info):
        return Decision(CHECKPOINT, "SIGTERM: the job reached its time limit")
    if state in ("CANCELLED", "COMPLETING"):
        return Decision(STOP, "cancelled")
    return Decision(STOP, f"SIGTERM while the job is {state}: srun is ending the step (another rank failed?) "
                          f"or the process was signalled")


def _past_limit(info: dict[str, str]) -> bool:
    from .config import parse_time

    try:
        return parse_time(info.get("RunTime", "")) >= parse_time(info.get("TimeLimit", ""))
    except ValueError:  # UNLIMITED, Partition_Limit, or no such field
        return False


def mark_preempted(reason: str) -> None:
    """Leave the marker the batch script looks for (when it asked for one)."""
    path = os.environ.get(MARKER_ENV)
    if path:
        from .fsutil import write_atomic

        write_atomic(path, f"{reason}\n".encode())
