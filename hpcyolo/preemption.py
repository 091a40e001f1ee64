"""The preemption protocol shared by the sbatch script and the trainer.

Slurm warns a job before its time limit (or before preempting it) with a
signal. The handler only sets a flag; the trainer looks at the flag after each
optimizer step, all ranks agree on it (an all-reduce, so no rank is left in a
collective), rank 0 writes a checkpoint, and every rank exits with EXIT_CODE.
The batch script requeues the job on exactly that code and passes any other
failure through.
"""

from __future__ import annotations

import os
import signal

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again later".
EXIT_CODE = 75

# Where the trainer records that it stopped for preemption, once its
# checkpoint is on disk. The batch script requeues on EXIT_CODE or on this
# file: with srun --kill-on-bad-exit, the first rank to exit 75 gets the
# others killed, and srun may then report their signal instead of 75.
MARKER_ENV = "HPCYOLO_PREEMPT_MARKER"

# A drill for tests and for trying a cluster's requeue path: behave as if the
# signal arrived right after this optimizer step.
DRILL_ENV = "HPCYOLO_DRILL_PREEMPT_STEP"


class StopFlag:
    """Set by the site's signal (and SIGTERM, which Slurm sends at the end)."""

    def __init__(self, signal_name: str = "USR2"):
        self.requested = False
        self.reason = ""
        drill = os.environ.get(DRILL_ENV)
        self._drill_step = int(drill) if drill else None
        for name in {signal_name, "TERM", "INT"}:
            signal.signal(getattr(signal, f"SIG{name}"), self._handler)

    def _handler(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        # Only a flag: the work happens at the next step boundary.
        self.requested = True
        self.reason = signal.Signals(signum).name

    def check(self, step: int) -> bool:
        if self._drill_step is not None and step >= self._drill_step:
            self.requested, self.reason = True, f"drill at step {self._drill_step}"
        return self.requested


def mark_preempted(reason: str) -> None:
    """Leave the marker the batch script looks for (when it asked for one)."""
    path = os.environ.get(MARKER_ENV)
    if path:
        from .fsutil import write_atomic

        write_atomic(path, f"{reason}\n".encode())
