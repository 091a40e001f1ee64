"""`hpcyolo run`: the job of a plan on this machine, without Slurm.

The same steps as the sbatch script, in Python: the run directory with its
no-clobber rule (hpcyolo.rundir), staging into node-local scratch, one process
per rank with the standard variables (hpcyolo.local), and the preemption exit
code. A signal sent to `hpcyolo run` reaches every rank; they checkpoint and
stop, and running the same command again resumes.
"""

from __future__ import annotations

import csv
import getpass
import os
import sys
from pathlib import Path

from .errors import HpcyoloError
from .local import launch
from .plan import JobPlan
from .rundir import RECORD, check_job
from .shell import Raw, Var


def _expand(path: str, values: dict[str, str]) -> str:
    """A plan path with $VARs, as the batch shell would expand it."""
    expanded = os.path.expandvars(path.replace("${SLURM_JOB_USER}", values["SLURM_JOB_USER"]))
    if "$" in expanded:
        raise HpcyoloError(f"{path}: a variable in it is not set here")
    return expanded


def run_local(plan: JobPlan, resume: bool = False) -> int:
    values = {"SLURM_JOB_USER": getpass.getuser()}
    run_dir = Path(_expand(plan.run_dir, values))
    scratch = Path(_expand(plan.scratch_dir, values))
    check_job(plan, run_dir, resume or plan.job.run.resume, "add --resume (or set run.resume: true)")
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / RECORD).open("a") as f:
        f.write(f"local run on {os.uname().nodename}\n")
    data = plan.data
    if plan.job.data.stage:
        from .stage import stage

        data = str(stage(data, scratch / "data"))
    values.update(RUN_DIR=str(run_dir), DATA=data, SCRATCH_DIR=str(scratch))
    argv = [_resolve(word, values) for word in plan.train_argv]
    if argv[0] == "hpcyolo":  # this very installation, whether or not it is on PATH
        argv[:1] = [sys.executable, "-m", "hpcyolo.cli"]
    print(f"hpcyolo run: {plan.world_size} process(es) on this machine, run directory {run_dir}", file=sys.stderr)
    code = launch(argv, plan.world_size, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if code == plan.preempt_exit_code:
        print("hpcyolo run: stopped after a checkpoint; add --resume to the same command to go on",
              file=sys.stderr)
        return code
    if plan.uses_scratch:  # every ending but one to resume from: the scratch goes
        from .staged import remove

        remove(scratch)
    if code == 0:
        _summary(run_dir)
    return code


def _resolve(word: object, values: dict[str, str]) -> str:
    if isinstance(word, Var):
        return word.resolve(values)
    if isinstance(word, Raw):
        raise HpcyoloError("the torchrun launcher needs Slurm; use launcher: srun for hpcyolo run")
    return str(word)


def _summary(run_dir: Path) -> None:
    results = run_dir / "results.csv"
    if not results.exists():  # a custom entrypoint writes what it writes
        return
    last = list(csv.DictReader(results.open()))[-1]
    print(f"hpcyolo run: epoch {last['epoch']}: mAP50 {float(last['metrics/mAP50']):.3f}, "
          f"mAP50-95 {float(last['metrics/mAP50-95']):.3f}; plot {run_dir / 'results.png'}, "
          f"weights {run_dir / 'weights'}", file=sys.stderr)
