"""`hpcyolo submit`: the job of a plan through submitit (or sbatch), and
sweeps as one job array.

The submitit parameters come from the plan's resource table (plan.sbatch, the
same one the rendered script's #SBATCH lines come from): one mapping below
turns each generic name into submitit's. The job runs `JobTask` in its batch
shell (submitit's use_srun=False), and JobTask runs the rendered batch script
itself (`hpcyolo render`'s): the same steps, each an srun of its own, the
same staging, failure retries, restart in place inside the allocation,
ledger and requeue as `sbatch` gives. submitit brings what it is for: the
submission from Python, its folder of logs and pickles, job arrays for
sweeps. The script requeues the job itself (`scontrol requeue`, after a
checkpoint or without a failed node); JobTask then leaves without a result,
and submitit runs it again when Slurm starts the job again.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.rundir import record_job

from hpcyolo.login.plan import JobPlan
from hpcyolo.login.runcheck import check_job, warn_job
from hpcyolo.login.runcheck import expand as _expand
from hpcyolo.node.job import restarts
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
VERBATIM = {"ntasks": "ntasks", "reservation": "reservation", "requeue": "requeue", "signal": "signal", "time": "time",
            "no_kill": "no_kill"}
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
    params["stderr_to_stdout"] = True
    # The function runs in the batch shell: the script it runs starts each step with srun.
    params["use_srun"] = False
    params["setup"] = setup_lines(plan)
    return params


def setup_lines(plan: JobPlan) -> list[str]:
    """The batch script's software environment, for submitit's `setup`
    (the Python that runs JobTask may need the site's modules too)."""
    from hpcyolo.login.render import render_setup

    return render_setup(plan).splitlines()


# == what the job runs =========================================================

@dataclass
class JobTask:
    """What a submitit job runs in its batch shell: the rendered batch script
    (pickled by submitit; the script is its one field)."""

    script: str

    def __call__(self) -> int:
        with tempfile.NamedTemporaryFile("w", prefix="hpcyolo-job-", suffix=".sh", delete=False) as f:
            f.write(self.script)
        try:
            code = subprocess.call(["bash", f.name])
        finally:
            os.unlink(f.name)
        if code == 0 and requeued(os.environ):
            # The script requeued the job: no result (submitit would report the job done); Slurm ends this
            # start and runs the job, and with it this task, again.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if code != 0:
            raise HpcyoloError(f"the job's script ended with exit {code}; its log above says why")
        return 0


def requeued(env) -> bool:
    """Whether this start of the job was requeued (by its script's `scontrol
    requeue`): Slurm counts the restart at once."""
    from hpcyolo import slurm

    info = slurm.show_job(int(env["SLURM_JOB_ID"]))
    return int(info.get("Restarts", "0") or 0) > restarts(env) or \
        info.get("JobState", "") in ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PENDING")


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
    from hpcyolo.login.render import render_sbatch

    tasks = [JobTask(render_sbatch(dataclasses.replace(p, via="submitit"))) for p in plans]
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
                         "logs": str(folder.parent / f"{job.job_id}_0_log.out"),
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
    if plans[0].job.resources.spare_nodes and via == "local":
        raise HpcyoloError(f"{job_path}: resources.spare_nodes: the local site has no nodes to spare")
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
