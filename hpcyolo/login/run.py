"""`hpcyolo run`: the job of a plan on this machine, without Slurm.

The job's steps as the sbatch script takes them (hpcyolo.node.job): the run
directory with its no-clobber rule, the variables, preflight, staging into
node-local scratch, one process per rank with the standard variables
(hpcyolo.node.local), and the ending. A signal sent to `hpcyolo run`
reaches every rank; they checkpoint and stop, and running the same command
with --resume continues.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.preemption import MARKER_ENV

from hpcyolo.login import runcheck
from hpcyolo.login.plan import JobPlan
from hpcyolo.login.shell import Raw, Var
from hpcyolo.node.job import begin, end, staged_data
from hpcyolo.node.local import launch


def run_local(plan: JobPlan, resume: bool = False) -> int:
    """The job's steps (hpcyolo.node.job) on this machine: every rank a local process."""
    run_dir = Path(runcheck.expand(plan.run_dir))
    scratch = runcheck.expand(plan.scratch_dir)
    # 1. begin (the same rule as a job's first start; --resume is run.resume)
    begin(run_dir, via="local", resume=resume or plan.resume, request=runcheck.planned_settings(plan, run_dir),
          resume_how=runcheck.LOCAL_RESUME_HOW)
    # 2. the variables; the marker is this start's own (a Slurm job's has its id and restart)
    env = {**os.environ, **plan.step_env(str(run_dir), f"local{os.getpid()}", "0", scratch)}
    values = {"RUN_DIR": str(run_dir), "DATA": plan.data, "SCRATCH_DIR": scratch}
    # 3. preflight
    if plan.preflight and launch(_argv(plan.preflight_argv, values), plan.world_size, env=env) != 0:
        return _ended(plan, scratch, 1, "preflight failed")
    # 4. stage
    if plan.stage:
        from hpcyolo.node.stage import stage

        values["DATA"] = str(stage(plan.data, staged_data(scratch)))
    # 5. train
    print(f"hpcyolo run: {plan.world_size} process(es) on this machine, run directory {run_dir}", file=sys.stderr)
    code = launch(_argv(plan.train_argv, values), plan.world_size, env=env)
    # 6. end: nothing requeues here; a checkpoint is continued by running the command again
    ending = end(code, env[MARKER_ENV], job="local", restart=0, max_requeues=0,
                 how_to_continue="add --resume to the same command to go on")
    if ending.code == 0:
        _summary(run_dir)
    return _ended(plan, scratch, ending.code, ending.message)


def _ended(plan: JobPlan, scratch: str, code: int, message: str | None) -> int:
    """Every ending here is final: the node-local scratch goes, as after a job."""
    if plan.uses_scratch:
        from hpcyolo_trainer.common.stagedcopy import remove

        remove(scratch)
    if message:
        print(f"hpcyolo run: {message}", file=sys.stderr)
    return code


def _argv(words: tuple, values: dict[str, str]) -> list[str]:
    """A step's command line with the script's variables resolved; `hpcyolo`
    is this very installation, whether or not it is on PATH."""
    argv = [_resolve(word, values) for word in words]
    if argv[0] == "hpcyolo":
        argv[:1] = [sys.executable, "-m", "hpcyolo.cli"]
    return argv


def _resolve(word: object, values: dict[str, str]) -> str:
    if isinstance(word, Var):
        return word.resolve(values)
    if isinstance(word, Raw):
        raise HpcyoloError("the torchrun launcher needs Slurm; use launcher: srun for hpcyolo run")
    return str(word)


def _summary(run_dir: Path) -> None:
    rows = rundir.read_results(run_dir)
    if not rows:  # a custom entrypoint writes what it writes
        return
    print(f"hpcyolo run: epoch {rows[-1]['epoch']}: {rundir.scores(rows[-1])}; plot {run_dir / rundir.RESULTS_PLOT}, "
          f"weights {run_dir / rundir.WEIGHTS}", file=sys.stderr)
