"""`hpcyolo run`: the job of a plan on this machine, without Slurm.

The job's steps as the sbatch script takes them (hpcyolo.node.job): the run
directory with its no-clobber rule, the variables, preflight, staging into
node-local scratch, one process per rank with the standard variables
(hpcyolo.node.local), and the ending. A signal sent to `hpcyolo run`
reaches every rank; they checkpoint and stop, and running the same command
with --resume continues.

A rank that fails as a machine fails (killed by a signal other than the
OOM killer's, its device or network failed: exit 78, a rank the hang
watchdog found not answering) is the job's failure, not the user's: the
training step starts again in place, from the run's newest checkpoint, up
to the site's preemption.max_failures times, each a row of RUN/failures.csv
(and a line of `hpcyolo status`), each start its own ledger file. Any other
failure ends the run at once, as in a job.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.preemption import LOCAL_RESTART_ENV, MARKER_ENV

from hpcyolo.login import runcheck
from hpcyolo.login.plan import JobPlan
from hpcyolo.login.shell import Raw, Var
from hpcyolo.node.job import begin, end, record_failure, stamp, staged_data, task_failure
from hpcyolo.node.local import launch


def run_local(plan: JobPlan, resume: bool = False) -> int:
    """The job's steps (hpcyolo.node.job) on this machine: every rank a local process."""
    run_dir = Path(runcheck.expand(plan.run_dir))
    scratch = runcheck.expand(plan.scratch_dir)
    began = time.time()
    # 1. begin (the same rule as a job's first start; --resume is run.resume)
    begin(run_dir, via="local", resume=resume or plan.resume, request=runcheck.planned_settings(plan, run_dir),
          resume_how=runcheck.LOCAL_RESUME_HOW)
    # Each start of the training on this machine (this command's first, each restart in place) is the run's
    # "local" job's next start: its ledger file, hang verdict and failures.csv row are named by it.
    restart = len(list((run_dir / rundir.LEDGER).glob("local-*.times"))) if (run_dir / rundir.LEDGER).is_dir() else 0
    first_start = restart
    ledger = functools.partial(_stamp, run_dir)
    ledger(restart, "begin", began)
    # 2. the variables; the marker is this start's own (a Slurm job's has its id and restart)
    env = {**os.environ, **plan.step_env(str(run_dir), f"local{os.getpid()}", "0", scratch)}
    values = {"RUN_DIR": str(run_dir), "DATA": plan.data, "SCRATCH_DIR": scratch}
    # 3. preflight
    if plan.preflight:
        ledger(restart, "preflight")
        if launch(_argv(plan.preflight_argv, values), plan.world_size, env=env) != 0:
            ledger(restart, "exit")
            return _ended(plan, scratch, 1, "preflight failed")
    # 4. stage
    if plan.stage:
        from hpcyolo.node.stage import stage

        ledger(restart, "stage")
        values["DATA"] = str(stage(plan.data, staged_data(scratch)))
    # 5. train, again in place after a rank's failure of the machine's kind (see above)
    print(f"hpcyolo run: {plan.world_size} process(es) on this machine, run directory {run_dir}", file=sys.stderr)
    while True:
        ledger(restart, "train")
        start_env = {**env, **plan.step_env(str(run_dir), f"local{os.getpid()}", str(restart), scratch),
                     LOCAL_RESTART_ENV: str(restart)}
        first: dict = {}
        code = launch(_argv(plan.train_argv, values), plan.world_size, env=start_env, first=first)
        failure = _failure(run_dir, restart, code, first)
        if failure is None or restart - first_start >= plan.max_failures:
            break
        record_failure(run_dir, "local", str(restart), failure, retried=True)
        ledger(restart, "exit")
        restart += 1
        ledger(restart, "begin")
        print(f"hpcyolo run: {failure.reason}; starting the training again on this machine from the newest "
              f"checkpoint (failure {restart - first_start} of preemption.max_failures {plan.max_failures})",
              file=sys.stderr)
    ledger(restart, "end")
    if failure is not None:
        record_failure(run_dir, "local", str(restart), failure, retried=False)
    # 6. end: nothing requeues here; a checkpoint is continued by running the command again
    ending = end(code, start_env[MARKER_ENV], job="local", restart=0, max_requeues=0,
                 how_to_continue="add --resume to the same command to go on", failure=failure,
                 failures_before=restart - first_start, max_failures=plan.max_failures)
    if ending.code == 0:
        _summary(run_dir)
    code = _ended(plan, scratch, ending.code, ending.message)
    ledger(restart, "exit")
    return code


def _stamp(run_dir: Path, restart: int, part: str, when: float | None = None) -> None:
    """A part of this start of the run's "local" job begins: its ledger's stamp (`hpcyolo status`)."""
    stamp(run_dir, "local", str(restart), part, when)


def _failure(run_dir: Path, restart: int, code: int, first: dict):
    """The training step's failure, where a rank failed as a machine fails
    (hpcyolo.node.job.task_failure: its signal, its device, the hang
    watchdog's verdict), else None (done, checkpointed, or the user's)."""
    if code == 0 or not first:
        return None
    from hpcyolo_trainer.run.watchdog import read_blame

    blame = read_blame(rundir.hang_folder(run_dir, "local", str(restart)))
    return task_failure(first["code"], first["rank"], socket.gethostname(), blame)


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
