"""A job's run directory before the job starts: what a job of a plan would
do with the run its directory holds (continue it, or be refused), said by
validate, render and submit --dry-run and enforced by submit and `hpcyolo
run`; and the plan's paths with $VARs, expanded as the batch shell would.
The run directory itself (its files, records and the same-run rule) is
hpcyolo_trainer.common.rundir's."""

from __future__ import annotations

import os
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.rundir import RESUME_HOW, settings
from hpcyolo_trainer.common.settings import TrainConfig

from hpcyolo.login.shell import Var

LOCAL_RESUME_HOW = "add --resume (or set run.resume: true)"  # and `hpcyolo run`


def planned_settings(plan, run_dir: Path) -> dict | None:
    """What the plan's `hpcyolo train` would record in config.yaml: the
    settings its command line is made of (plan.train_settings). None for a
    custom entrypoint, which writes what it writes."""
    if plan.job.entrypoint:
        return None
    values = {"RUN_DIR": str(run_dir), "DATA": plan.data, "SCRATCH_DIR": str(run_dir / "scratch")}
    return settings(TrainConfig(**{name: value.resolve(values) if isinstance(value, Var) else value
                                   for name, value in plan.train_settings}).to_dict())


def job_verdict(plan, run_dir: Path, resume: bool, resume_how: str) -> tuple[bool, str] | None:
    """What a job of `plan` would do with the run in `run_dir` (hpcyolo_trainer.common.rundir.job_verdict)."""
    holds = rundir.holds_run(run_dir)
    # The planned settings only matter for a run already there (a sweep's 1,000 new run directories skip them).
    planned = planned_settings(plan, run_dir) if holds else None
    return rundir.job_verdict(run_dir, holds, planned, resume, resume_how)


def check_job(plan, run_dir: Path, resume: bool, resume_how: str = RESUME_HOW) -> None:
    """The no-clobber rule, before a job is launched or submitted: a run
    directory that holds a run is continued only on request, and only by the
    same run."""
    verdict = job_verdict(plan, run_dir, resume, resume_how)
    if verdict is not None and not verdict[0]:
        raise HpcyoloError(verdict[1])


def warn_job(plan, run_dir: str) -> None:
    """validate, render, submit --dry-run: one line on stderr when the job's
    run directory already holds a run, saying whether the job would continue
    it or be refused, so that the user learns it before queueing. Silent
    where the directory's path needs variables this shell lacks."""
    import sys

    try:
        path = Path(expand(run_dir))
    except HpcyoloError:
        return
    verdict = job_verdict(plan, path, plan.resume, RESUME_HOW)
    if verdict is not None:
        print(f"hpcyolo: warning: {verdict[1] if verdict[0] else 'the job would be refused: ' + verdict[1]}",
              file=sys.stderr)


# == paths with variables ====================================================

def expand(path: str, where: str = "") -> str:
    """A plan path with $VARs ($SCRATCH, ${SLURM_JOB_USER}), as the batch
    shell would expand it; outside a job SLURM_JOB_USER is this user. `where`
    ends the error: what to do instead."""
    expanded = try_expand(path)
    if expanded is None:
        raise HpcyoloError(f"{path}: a variable in it is not set here{where}")
    return expanded


def try_expand(path: str) -> str | None:
    """expand(), or None where a variable in `path` is not set here."""
    if "${SLURM_JOB_USER}" in path:
        import getpass  # here: most paths have no ${SLURM_JOB_USER}, and getpass costs `hpcyolo render` 1 ms

        path = path.replace("${SLURM_JOB_USER}", getpass.getuser())
    expanded = os.path.expandvars(path)
    return None if "$" in expanded else expanded
