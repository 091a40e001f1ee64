"""Why a training task got SIGTERM, as Slurm says: the answer the trainer's
StopFlag asks for (hpcyolo_trainer.common.preemption) when `hpcyolo train` runs
under Slurm.

SIGTERM is what Slurm sends on `scancel`, at the time limit, on preemption
and on requeue, and what srun sends the surviving ranks when one rank died:
it checkpoints only when Slurm is in fact requeueing, preempting or timing
out the job (`scontrol show job` says so: see `slurm_stop_reason`), or never
where the site says `preemption.sigterm: stop`. A cancelled job says so and
stops.
"""

from __future__ import annotations

from hpcyolo_trainer.common.preemption import CHECKPOINT, STOP, Decision

# The site's preemption.sigterm: "requeue" (when Slurm says so) or "stop".
SIGTERM_ENV = "HPCYOLO_SIGTERM"


def sigterm_decision(env) -> Decision:
    """What a rank that got SIGTERM asks for, in the job `env` describes."""
    if env.get(SIGTERM_ENV) == "stop":
        return Decision(STOP, "SIGTERM (the site's preemption.sigterm is stop)")
    if not env.get("SLURM_JOB_ID"):
        return Decision(STOP, "SIGTERM")
    from hpcyolo_trainer.common.errors import SlurmError

    from hpcyolo import slurm

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
    from hpcyolo.slurm import parse_time

    try:
        return parse_time(info.get("RunTime", "")) >= parse_time(info.get("TimeLimit", ""))
    except ValueError:  # UNLIMITED, Partition_Limit, or no such field
        return False
