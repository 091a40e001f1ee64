"""`hpcyolo run`: the job of a plan on this machine, without Slurm.

The same steps as the sbatch script, in Python: the run directory with its
no-clobber rule (hpcyolo_trainer.rundir), staging into node-local scratch, one process
per rank with the standard variables (hpcyolo.node.local), and the preemption exit
code. A signal sent to `hpcyolo run` reaches every rank; they checkpoint and
stop, and running the same command again resumes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpcyolo.login import runcheck
from hpcyolo.login.plan import JobPlan
from hpcyolo.login.shell import Raw, Var
from hpcyolo.node.local import launch
from hpcyolo_trainer import rundir
from hpcyolo_trainer.errors import HpcyoloError


def run_local(plan: JobPlan, resume: bool = False) -> int:
    run_dir = Path(runcheck.expand(plan.run_dir))
    scratch = Path(runcheck.expand(plan.scratch_dir))
    runcheck.check_job(plan, run_dir, resume or plan.resume, runcheck.LOCAL_RESUME_HOW)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.record_start(run_dir, rundir.local_start_line(os.uname().nodename))
    data = plan.data
    if plan.stage:
        from hpcyolo.node.stage import stage

        data = str(stage(data, scratch / "data"))
    values = {"RUN_DIR": str(run_dir), "DATA": data, "SCRATCH_DIR": str(scratch)}
    argv = [_resolve(word, values) for word in plan.train_argv]
    if argv[0] == "hpcyolo":  # this very installation, whether or not it is on PATH
        argv[:1] = [sys.executable, "-m", "hpcyolo.cli"]
    print(f"hpcyolo run: {plan.world_size} process(es) on this machine, run directory {run_dir}", file=sys.stderr)
    code = launch(argv, plan.world_size, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if rundir.checkpointed(code):
        print("hpcyolo run: stopped after a checkpoint; add --resume to the same command to go on",
              file=sys.stderr)
        return code
    if plan.uses_scratch:  # every ending but one to resume from: the scratch goes
        from hpcyolo_trainer.staged import remove

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
    rows = rundir.read_results(run_dir)
    if not rows:  # a custom entrypoint writes what it writes
        return
    print(f"hpcyolo run: epoch {rows[-1]['epoch']}: {rundir.scores(rows[-1])}; plot {run_dir / rundir.RESULTS_PLOT}, "
          f"weights {run_dir / rundir.WEIGHTS}", file=sys.stderr)
