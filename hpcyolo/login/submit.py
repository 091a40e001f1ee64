"""`hpcyolo submit`: the job of a plan through submitit (or sbatch), and
sweeps as one job array.

The submitit parameters come from the plan's resource table (plan.sbatch, the
same one the rendered script's #SBATCH lines come from): one mapping below
turns each generic name into submitit's. Each task runs `TrainTask`, which
takes the job's steps as the batch script does (hpcyolo.node.job: the run
directory, the variables, preflight, staging into node-local scratch, where
every task asks and the node's first one copies, the training command, the
ending), running the very `hpcyolo train` (or `hpcyolo exec`) command line
as a child process, so the environment mapping, the trainer and its
preemption protocol are the same code. The site's signal reaches the child
directly (Slurm signals the task's process group); the child checkpoints at
the next step and exits 75, and then rank 0 hands over to submitit's own
checkpoint path: `checkpoint()` returns this same task, submitit pickles it
and requeues the job, and the task, started again, resumes from the newest
valid checkpoint in the same run directory.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.preemption import EXIT_CODE, MARKER_ENV, PEER_LOST_EXIT_CODE, TERMINATED_EXIT_CODE
from hpcyolo_trainer.common.rundir import record_job

from hpcyolo.login.plan import JobPlan
from hpcyolo.login.runcheck import check_job, planned_settings, warn_job
from hpcyolo.login.runcheck import expand as _expand
from hpcyolo.login.shell import Raw, Var
from hpcyolo.node import job as steps
from hpcyolo.node.job import begin, end, job_id, restarts, staged_data
from hpcyolo.slurm import parse_time

# plan.sbatch's generic names -> submitit SlurmExecutor parameters.
SUBMITIT_PARAMETERS = {
    "job_name": "job_name", "nodes": "nodes", "ntasks_per_node": "ntasks_per_node",
    "cpus_per_task": "cpus_per_task", "gres": "gres", "gpus_per_node": "gpus_per_node",
    "gpus_per_task": "gpus_per_task", "mem": "mem", "partition": "partition", "account": "account",
    "qos": "qos", "constraint": "constraint",
}
# Passed as sbatch options verbatim (submitit has no parameter for them, or
# would spell them differently: its `time` is whole minutes, its signal is
# always USR2).
VERBATIM = {"ntasks": "ntasks", "reservation": "reservation", "requeue": "requeue", "signal": "signal", "time": "time"}
# Chosen by submitit itself: logs in its folder, opened in append mode.
SUBMITIT_OWN = {"output", "open_mode"}


def submitit_parameters(plan: JobPlan) -> dict:
    """SlurmExecutor.update_parameters() arguments asking for what the
    rendered script asks for."""
    params: dict = {}
    extra: dict = {}
    for name, value in plan.sbatch:
        if name in SUBMITIT_PARAMETERS:
            params[SUBMITIT_PARAMETERS[name]] = value
        elif name in VERBATIM:
            extra[VERBATIM[name]] = value
        elif name not in SUBMITIT_OWN:
            raise AssertionError(f"no submitit mapping for plan resource {name!r}")
    for line in plan.extra_sbatch:
        key, sep, value = line.lstrip("-").partition("=")
        extra[key] = value if sep else True
    # submitit's own clock (when a signal counts as a time-out) wants minutes.
    params["time"] = math.ceil(parse_time(plan.job.resources.time) / 60)
    params["signal_delay_s"] = plan.site.preemption.grace
    params["additional_parameters"] = extra
    params["srun_args"] = list(_srun_extra(plan))
    params["stderr_to_stdout"] = True
    # submitit hands the signal to TrainTask's checkpoint path; it must be the site's.
    params["setup"] = [*setup_lines(plan), f"export SUBMITIT_PREEMPT_SIGNAL={plan.signal}"]
    return params


def _srun_extra(plan: JobPlan) -> tuple[str, ...]:
    """The training step's srun options that submitit's own srun lacks."""
    skip = ("--nodes=", "--ntasks-per-node=", "--cpus-per-task=")
    return tuple(o for o in plan.train_srun if not str(o).startswith(skip))


def setup_lines(plan: JobPlan) -> list[str]:
    """The batch script's software environment, for submitit's `setup`."""
    from hpcyolo.login.render import render_setup

    return render_setup(plan).splitlines()


# == the task each Slurm task runs ===========================================

@dataclass
class TrainTask:
    """What one task of the job runs (pickled by submitit; keep it small)."""

    plan: JobPlan
    run_dir: str
    scratch_dir: str
    signal_name: str

    def __call__(self) -> int:
        """The job's steps (hpcyolo.node.job), as every task of a submitit job takes them."""
        from hpcyolo_trainer.common.ledger import process_start

        env = os.environ
        rank, first_on_node = int(env.get("SLURM_PROCID", "0")), env.get("SLURM_LOCALID", "0") == "0"
        job, restart = job_id(env), restarts(env)
        plan, run = self.plan, Path(self.run_dir)
        # 1. begin: every task checks the run directory, rank 0 records the start (and stamps the ledger).
        begin(run, via="submitit", resume=plan.resume, request=planned_settings(plan, run), record=rank == 0,
              began=process_start() if rank == 0 else None)

        def stamp(part: str) -> None:
            if rank == 0:
                steps.stamp(run, job, str(restart), part)

        # 2. the variables the batch script exports
        env.update(plan.step_env(self.run_dir, job, str(restart), self.scratch_dir))
        values = {"RUN_DIR": self.run_dir, "DATA": plan.data, "SCRATCH_DIR": self.scratch_dir}
        # 3. preflight, on every task
        stamp("preflight")
        if plan.preflight and subprocess.call(self._argv(plan.preflight_argv, values)) != 0:
            raise HpcyoloError(f"preflight failed on rank {rank} ({os.uname().nodename})")
        # 4. stage: every task asks; the node's first copies, the others wait on its lock.
        stamp("stage")
        if plan.stage:
            from hpcyolo.node.stage import stage

            values["DATA"] = str(stage(plan.data, staged_data(self.scratch_dir)))
        # 5. train. submitit's handler for the signal would requeue at once,
        # before the trainer's checkpoint: hold it until the child has stopped.
        sig = getattr(signal, f"SIG{self.signal_name}")
        submitit_handler = signal.getsignal(sig)
        caught: list[int] = []
        for s in {sig, signal.SIGTERM}:
            signal.signal(s, lambda signum, frame: caught.append(signum))
        stamp("train")
        code = subprocess.call(self._argv(plan.train_argv, values))
        stamp("end")
        # 6. end: submitit requeues (rank 0 hands over to its checkpoint path);
        # a rank's or node's failure is retried without its node; on every
        # other ending the node's first task removes its scratch.
        # (A rank ended by the preemption's SIGTERM after the checkpoint is no failure: no wait for an answer.)
        if code != 0 and not rundir.checkpointed(code, env[MARKER_ENV]) and \
                self._retried(code, rank, job, str(restart)):
            return EXIT_CODE
        ending = end(code, env[MARKER_ENV], job=job, restart=restart, max_requeues=plan.max_requeues)
        if not ending.requeue:
            stamp("exit")
        if ending.requeue:
            if rank == 0 and callable(submitit_handler):
                print(f"hpcyolo: {ending.message} through submitit", file=sys.stderr, flush=True)
                submitit_handler(sig, None)  # checkpoint() below, requeue, exit
            return EXIT_CODE
        if first_on_node and plan.uses_scratch:
            from hpcyolo_trainer.common.stagedcopy import remove

            remove(self.scratch_dir)
        if ending.code != 0:
            raise HpcyoloError(f"{ending.message} (rank {rank}, {os.uname().nodename})")
        return 0

    def _retried(self, code: int, rank: int, job: str, restart: str) -> bool:
        """After the training command failed: whether the job was requeued
        without a failed node. Each task sees only its own rank's exit
        (hpcyolo.node.job.task_failure); the first that finds a failure of
        its own decides for the job as `hpcyolo job end` does for the batch
        script, and the others (whose ranks lost their peer) wait for its answer."""
        from hpcyolo_trainer.common.preemption import HANG_EXIT_CODE
        from hpcyolo_trainer.run.watchdog import read_blame

        run, host = Path(self.run_dir), os.uname().nodename
        failure = steps.task_failure(code, rank, host, read_blame(rundir.hang_folder(run, job, restart)))
        if failure is None or not steps.claim_failure(run, job, restart):
            if failure is None and code not in (PEER_LOST_EXIT_CODE, HANG_EXIT_CODE, -signal.SIGTERM,
                                                TERMINATED_EXIT_CODE):
                return False  # this rank's own ending: the user's error, a cancel
            answer = steps.settle_failure(run, job, restart)
            if answer == "requeued":
                print(f"hpcyolo: rank {rank} on {host}: the job was requeued after another rank's failure",
                      file=sys.stderr, flush=True)
            return answer == "requeued"
        ending = end(code, None, job=job, restart=int(restart), max_requeues=self.plan.max_requeues,
                     failure=failure, failures_before=steps.failures_retried(run, job),
                     max_failures=self.plan.max_failures)
        if rank != 0:
            # Rank 0's trainer may still be finishing the step this one failed after (its .step file
            # counts the steps lost); the batch script's job end runs after every rank has ended.
            steps.wait_stamp(run, job, restart, "end")
        steps.record_failure(run, job, restart, failure, retried=ending.requeue)
        if not ending.exclude:
            steps.settle_failure(run, job, restart, "final")
            raise HpcyoloError(f"{ending.message} (rank {rank}, {host})")
        print(f"hpcyolo: {ending.message}", file=sys.stderr, flush=True)
        steps.settle_failure(run, job, restart, "requeued")
        steps.requeue_without(job, ending.exclude)
        steps.stamp(run, job, restart, "exit")
        return True

    def _argv(self, words: tuple, values: dict[str, str]) -> list[str]:
        """A step's command line: the plan's words with the script's variables
        resolved, after the container's words; `hpcyolo` is this very installation."""
        argv = [_word(w, values) for w in words]
        if argv[0] == "hpcyolo" and not self.plan.step_prefix:
            argv[0] = str(Path(sys.executable).parent / "hpcyolo")
        return [_word(w, values) for w in self.plan.step_prefix] + argv

    def checkpoint(self, *args, **kwargs):
        """submitit's checkpoint path: run this same task again; the trainer
        finds its checkpoints in the run directory."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _word(word: object, values: dict[str, str]) -> str:
    if isinstance(word, Var):
        return word.resolve(values)
    if isinstance(word, Raw):
        raise HpcyoloError("the torchrun launcher is not supported through submitit; use --via sbatch")
    return os.path.expandvars(str(word))


# == sweeps ==================================================================

@dataclass(frozen=True)
class Sweep:
    key: str  # dotted job-spec key
    values: tuple


def parse_sweeps(options: tuple[str, ...]) -> list[Sweep]:
    """Each value is read as YAML with the job spec's rules (`010` stays "010")."""
    from hpcyolo_trainer.common.yamlfile import loads

    sweeps = []
    for option in options:
        key, sep, values = option.partition("=")
        if not sep or not key or not values or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            raise HpcyoloError(f"--sweep {option}: expected KEY=V1,V2,... (a dotted job key, e.g. train.lr0=0.01,0.02)")
        parsed = tuple(loads(v, f"--sweep {key}") for v in values.split(","))
        if len(set(map(repr, parsed))) != len(parsed):
            raise HpcyoloError(f"--sweep {option}: a value is repeated")
        sweeps.append(Sweep(key, parsed))
    if len({s.key for s in sweeps}) != len(sweeps):
        raise HpcyoloError("--sweep: the same key is swept twice")
    return sweeps


def sweep_points(sweeps: list[Sweep]) -> list[dict[str, object]]:
    """Every combination, in a stable order: {dotted key: value}."""
    return [dict(zip((s.key for s in sweeps), combo)) for combo in itertools.product(*(s.values for s in sweeps))]


def point_name(base: str, point: dict[str, object]) -> str:
    """A run name for one sweep element, BASE-lr0_0.01-model_s: only the
    characters a run name allows, at most 64 (a long one ends in a digest)."""
    import hashlib

    parts = [f"{key.rsplit('.', 1)[-1]}_{value}" for key, value in point.items()]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", "-".join([base, *parts]))
    if len(name) > 64:
        name = f"{name[:55]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


# == submitting ==============================================================

def expand(path: str) -> str:
    """A run or scratch path as the job will see it (hpcyolo.login.runcheck.expand)."""
    return _expand(path, "; submit from where it is set")


def executor_for(plans: list[JobPlan], folder: Path, parallel: int | None):
    import submitit

    plan = plans[0]
    executor = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=plan.max_requeues)
    params = submitit_parameters(plan)
    if len(plans) > 1:
        params["array_parallelism"] = parallel or plan.site.slurm.array_parallelism or len(plans)
    executor.update_parameters(**params)
    return executor


def submit_submitit(plans: list[JobPlan], names: list[str], parallel: int | None,
                    dry_run: bool) -> list[tuple[str, Path]]:
    """Submit one job (or one array of len(plans) elements); returns (job id, run directory) each."""
    first = plans[0]
    run_dirs = [Path(expand(p.run_dir)) for p in plans]
    for plan, run_dir in zip(plans, run_dirs):
        if dry_run:
            warn_job(plan, str(run_dir))
        else:
            check_job(plan, run_dir, plan.resume)
    folder = (run_dirs[0] if len(plans) == 1 else run_dirs[0].parent / f".sweep-{first.job.name}") / "submitit"
    folder = Path(str(folder) + ("/%j" if len(plans) == 1 else "/%A_%a"))
    tasks = [TrainTask(p, str(r), expand(p.scratch_dir), p.signal) for p, r in zip(plans, run_dirs)]
    executor = executor_for(plans, folder.parent, parallel)
    if dry_run:
        from submitit.slurm.slurm import _make_sbatch_string

        params = dict(executor.parameters)
        if len(plans) > 1:
            params["map_count"] = len(plans)
        print(_make_sbatch_string(command="<python -m submitit.core._submit FOLDER>", folder=folder.parent,
                                  **params), end="")
        return []
    import submitit

    try:
        if len(plans) == 1:
            jobs = [executor.submit(tasks[0])]
        else:
            with executor.batch():
                jobs = [executor.submit(t) for t in tasks]
    except (submitit.core.utils.FailedJobError, FileNotFoundError) as e:
        why = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        raise HpcyoloError(f"sbatch refused the job (through submitit): {why[-1]}") from None
    for job, run_dir, name in zip(jobs, run_dirs, names):
        record_job(run_dir, {"job": job.job_id, "via": "submitit", "name": name,
                         "logs": str(folder.parent / f"{job.job_id}_{{rank}}_log.out"),
                         "submission": str(folder.parent / f"{job.job_id}_submission.sh")})
    return [(job.job_id, run_dir) for job, run_dir in zip(jobs, run_dirs)]


def submit_sbatch(plan: JobPlan, dry_run: bool) -> list[tuple[str, Path]]:
    from hpcyolo import slurm
    from hpcyolo.login.plan import check_logs_folder
    from hpcyolo.login.render import render_sbatch

    check_logs_folder(plan)
    script = render_sbatch(plan)
    if dry_run:
        warn_job(plan, plan.run_dir)
        print(script, end="")
        return []
    run_dir = Path(expand(plan.run_dir))
    check_job(plan, run_dir, plan.resume)
    job_id = slurm.sbatch(script)
    logs = dict(plan.sbatch).get("output", "%x-%j.out").replace("%x", plan.job_name).replace("%j", str(job_id))
    record_job(run_dir, {"job": str(job_id), "via": "sbatch", "name": plan.run_name,
                     "logs": str(Path(os.getcwd(), logs))})
    return [(str(job_id), run_dir)]


def submit(site_path: str, job_path: str, *, via: str | None, dry_run: bool, sweeps: tuple[str, ...],
           parallel: int | None, command: str) -> list[tuple[str, Path]]:
    """`hpcyolo submit`: returns (job id, run directory) for each job (none for a dry run)."""
    from hpcyolo.login.config import load_job, load_jobs, load_site
    from hpcyolo.login.plan import make_plan

    site = load_site(site_path)
    via = via or ("local" if site.name == "local" else "submitit")
    points = sweep_points(parse_sweeps(sweeps)) if sweeps else [{}]
    base = load_job(job_path)
    named = [{**point, "run.name": point_name(base.run.name or base.name, point)} if point else {} for point in points]
    plans, names = [], []
    for job in load_jobs(job_path, named) if sweeps else [base]:
        plans.append(make_plan(site, job, site_file=site_path, job_file=job_path, command=command))
        names.append(plans[-1].run_name)
    if len(plans) > 1 and via != "submitit":
        raise HpcyoloError(f"--sweep runs as one submitit job array; drop --via {via}")
    if plans[0].uneven and via != "sbatch":
        # submitit counts tasks as nodes x tasks per node; the local launcher starts N per node.
        raise HpcyoloError(f"{job_path}: resources.{'gpus' if plans[0].gpus_per_node else 'tasks'}: an uneven layout "
                           f"is submitted with --via sbatch (or hpcyolo render SITE JOB | sbatch), not --via {via}")
    check_datasets(plans)
    if via == "sbatch":
        return submit_sbatch(plans[0], dry_run)
    if via == "local":
        return submit_local(plans[0], dry_run)
    return submit_submitit(plans, names, parallel, dry_run)


def check_datasets(plans: list[JobPlan]) -> None:
    """Each dataset once, as `validate` checks it: data that cannot be
    trained on is refused here, not after the job waited in the queue."""
    from hpcyolo_trainer.common.datayaml import check_data

    for data, task in dict.fromkeys((plan.data, plan.task) for plan in plans):
        for warning in check_data(data, task):
            print(f"warning: {warning}", file=sys.stderr, flush=True)


def submit_local(plan: JobPlan, dry_run: bool) -> list[tuple[str, Path]]:
    """The local site: `hpcyolo run` in the background through submitit's
    local executor (logs and the job's state in RUN/submitit)."""
    import submitit

    from hpcyolo.login.run import run_local

    run_dir = Path(expand(plan.run_dir))
    if dry_run:
        warn_job(plan, str(run_dir))
        print(f"would run on this machine, in the background: {plan.world_size} process(es), run directory "
              f"{run_dir}")
        return []
    check_job(plan, run_dir, plan.resume)
    folder = run_dir / "submitit"
    executor = submitit.LocalExecutor(folder=str(folder))
    executor.update_parameters(timeout_min=math.ceil(parse_time(plan.job.resources.time) / 60))
    with _detached_stdio():
        job = executor.submit(run_local, plan)
    record_job(run_dir, {"job": str(job.job_id), "via": "local", "name": plan.run_name,
                     "logs": str(folder / f"{job.job_id}_0_log.out")})
    return [(str(job.job_id), run_dir)]


class _detached_stdio:
    """stdin/stdout/stderr on /dev/null while the local job's controller
    starts: it inherits them, and a caller reading our output through a pipe
    (`id=$(hpcyolo submit ...)`) would otherwise wait for the whole job."""

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = [os.dup(fd) for fd in (0, 1, 2)]
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)

    def __exit__(self, *exc):
        for fd, saved in zip((0, 1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
