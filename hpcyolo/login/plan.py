"""The plan: everything the job needs, derived once from a site and a job.

`make_plan` holds every check that spans the two files and every derived
value; rendering the sbatch script and building submitit parameters are pure
functions of the plan (plan, then render, then submit).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import ConfigError
from hpcyolo_trainer.common.preemption import EXIT_CODE as PREEMPT_EXIT_CODE
from hpcyolo_trainer.common.record import record
from hpcyolo_trainer.common.rendezvous import PORT_BASE, PORT_SPAN
from hpcyolo_trainer.common.settings import RUN_LEVEL, SETTINGS, Setting, batch_problem

from hpcyolo.login.config import EnvironmentSite, JobSpec, SiteConfig
from hpcyolo.login.shell import Expand, Raw, Var
from hpcyolo.node.job import STAGED, staged_yaml, task_env
from hpcyolo.slurm import format_time, limit_seconds, parse_time

# torchrun's agent turns only these into a clean shutdown of its workers
# (torch.distributed.elastic: SIGTERM, SIGINT, SIGHUP, SIGQUIT); any other
# signal would kill the agent, so under torchrun the warning signal is TERM.
TORCHRUN_SIGNALS = ("TERM", "INT", "HUP")


@record
class JobPlan:
    """Everything the job does; the batch script's template reads nothing else."""

    site: SiteConfig
    job: JobSpec
    site_file: str
    job_file: str
    command: str  # the command line that produced the plan, for the header
    site_name: str
    job_name: str
    launcher: str  # srun | torchrun
    nodes: int  # exactly this many, or with max_nodes at least this many
    max_nodes: int | None  # an uneven layout: Slurm may use up to this many nodes
    gpus_per_node: int  # an uneven layout: 1, a GPU per task
    procs_per_node: int | None  # training processes per node; None: uneven, as Slurm places them
    tasks_per_node: int | None  # Slurm tasks per node in the training step; None: uneven
    world_size: int
    cpus_per_task: int | None
    omp_threads: int
    time: str  # normalized D-HH:MM:SS
    signal: str
    sbatch: tuple[tuple[str, object], ...]  # generic name -> value, see slurm_flags
    run_name: str
    run_dir: str  # may hold $VARs, expanded by the shell at run time
    scratch_dir: str  # node-local folder of this run: staged data, image caches
    uses_scratch: bool  # staging or an image cache: clean scratch_dir up at the end
    data: str  # absolute path of the data YAML
    network_env: tuple[tuple[str, str], ...]
    stage_srun: tuple[str, ...]  # srun options of the staging step (one task per node)
    train_srun: tuple[str, ...]  # srun options of the training step
    step_prefix: tuple[str, ...]  # command words before hpcyolo (apptainer exec ...)
    stage_argv: tuple[str, ...]
    unstage_argv: tuple[str, ...]
    preflight_argv: tuple[str, ...]
    train_settings: tuple[tuple[str, object], ...]  # the trainer's settings of the job, by name (plain or Var)
    train_argv: tuple[str, ...]
    environment: EnvironmentSite  # the site's modules, venv and variables (templates/env.sh.j2)
    extra_sbatch: tuple[str, ...]  # the site's own #SBATCH options, after the table's
    container: str  # the site's container runtime for the steps (none, apptainer, singularity, pyxis)
    master_suffix: str  # after the first host's name in MASTER_ADDR
    resume: bool  # continue the run in run_dir if there is one (run.resume)
    preflight: bool  # check the network, the port and scratch on every task first
    stage: bool  # copy the dataset into node-local scratch first (data.stage)
    sigterm: str  # the site's preemption.sigterm: requeue (when Slurm says so) or stop
    max_requeues: int  # requeues after a checkpoint before the script stops asking
    max_failures: int  # retries after a rank or node failed, without the failed node(s)
    preempt_exit_code: int = PREEMPT_EXIT_CODE
    port_base: int = PORT_BASE  # MASTER_PORT = port_base + SLURM_JOB_ID % port_span (distenv.default_port)
    port_span: int = PORT_SPAN
    via: str = "sbatch"  # what runs the script: sbatch, or submitit (hpcyolo.login.submit.JobTask)
    # The steps around training (hpcyolo.node.job), in the batch shell's words.
    staged_yaml: Raw = Raw(f'"{staged_yaml("$SCRATCH_DIR")}"')  # the staged copy's data YAML

    @property
    def task(self) -> str | None:
        """The job's train.task where it sets one (the trainer's default otherwise)."""
        return dict(self.train_settings).get("task")

    @property
    def task_env(self) -> tuple[tuple[str, Raw], ...]:
        """What the training command reads besides its options (hpcyolo.node.job.task_env), as shell words."""
        env = task_env("$RUN_DIR", "$SLURM_JOB_ID", "${SLURM_RESTART_COUNT:-0}",
                       "$SCRATCH_DIR" if self.uses_scratch else None, self.sigterm)
        return tuple((name, Raw(f'"{value}"')) for name, value in env.items())

    def step_env(self, run_dir: str, job: str, restart: str, scratch: str) -> dict[str, str]:
        """The variables the script exports for its steps, with values: what
        `hpcyolo run` sets (the site's environment.env and
        modules belong to the cluster: the script's own)."""
        env = {name: os.path.expandvars(str(value)) for name, value in self.network_env}
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(self.omp_threads))
        env.update(task_env(run_dir, job, restart, scratch if self.uses_scratch else None, self.sigterm))
        return env

    @property
    def begin_argv(self) -> tuple[str, ...]:
        """`hpcyolo job begin`: refuse a run directory the job may not use, else
        record the start. With run.resume the training options come along:
        only the same run may be continued (a custom entrypoint's run
        directory is its own)."""
        words = [*self.step_prefix, "hpcyolo", "job", "begin", "--run-dir", Var("RUN_DIR"),
                 "--log", Raw('"$LOG_FILE"'), "--began", Raw('"$job_began"')]
        if self.via != "sbatch":
            words += ["--via", self.via]
        if self.resume:
            words.append("--resume")
            if not self.job.entrypoint:
                train = list(self.train_argv)
                words += ["--", *train[train.index("train") + 1:]]
        return tuple(words)

    @property
    def ledger_file(self) -> Raw:
        """This start's stamps in the run's ledger (hpcyolo_trainer.common.ledger), as a shell word."""
        return Raw(f'"{rundir.ledger_file("$RUN_DIR", "$SLURM_JOB_ID", "${SLURM_RESTART_COUNT:-0}", ".times")}"')

    @property
    def end_argv(self) -> tuple[str, ...]:
        """`hpcyolo job end`: what the training step's exit status means."""
        words = [*self.step_prefix, "hpcyolo", "job", "end", "--status", Raw('"$status"'),
                 "--marker", Raw('"$HPCYOLO_PREEMPT_MARKER"'), "--max-requeues", str(self.max_requeues),
                 "--srun-errors", Raw('"$srun_errors"'), "--run-dir", Var("RUN_DIR"),
                 "--max-failures", str(self.max_failures)]
        if self.restarts_in_place:
            words += ["--in-place", str(self.job.resources.nodes), str(self.procs_per_node), str(self.job.train.batch)]
        return tuple(words + (["--torchrun"] if self.launcher == "torchrun" else []))

    @property
    def restarts_in_place(self) -> bool:
        """Whether a failed node may be left out inside the allocation (the
        batch script starts the training step again without it): an even
        layout of srun's ranks training hpcyolo's trainer, on more than one node."""
        return restarts_in_place(self.job, self.launcher, self.uneven)

    @property
    def batch_per_rank(self) -> int:
        return self.job.train.batch // self.world_size

    @property
    def uneven(self) -> bool:
        """resources.gpus or tasks: a total that Slurm spreads over the nodes."""
        return self.procs_per_node is None

    @property
    def node_count(self) -> str:
        """The nodes as sbatch's --nodes takes them: N, or MIN-MAX."""
        return str(node_range(self.nodes, self.max_nodes))

    @property
    def layout(self) -> str:
        """The layout in words (the script's header, validate, doctor)."""
        if not self.uneven:
            spare = self.job.resources.spare_nodes
            return (f"{self.nodes} node(s) x {self.procs_per_node} process(es)"
                    + (f" and {spare} spare node(s), idle until a node fails" if spare else ""))
        per = "free GPUs" if self.gpus_per_node else "room for"
        return f"{self.world_size} process(es) over {self.node_count} node(s), as many on each as Slurm finds {per}"


def restarts_in_place(job: JobSpec, launcher: str, uneven: bool) -> bool:
    """JobPlan.restarts_in_place, for the plan's parts made before it."""
    return (not uneven and launcher == "srun" and not job.entrypoint
            and job.resources.nodes + job.resources.spare_nodes > 1)


def node_range(nodes: int, max_nodes: int | None) -> int | str:
    """--nodes as sbatch takes it: N, or MIN-MAX when Slurm may choose."""
    return f"{nodes}-{max_nodes}" if max_nodes and max_nodes > nodes else nodes


def make_plan(site: SiteConfig, job: JobSpec, *, site_file: str, job_file: str, command: str = "hpcyolo render",
              check_paths: bool = True) -> JobPlan:
    launcher = job.resources.launcher or site.slurm.launcher
    total = _uneven_total(site, job, job_file, launcher)
    spare = job.resources.spare_nodes
    if spare and (total or launcher != "srun" or job.entrypoint):
        why = ("an uneven layout (resources.gpus or tasks)" if total else "the torchrun launcher"
               if launcher != "srun" else "a custom entrypoint")
        raise ConfigError(job_file, "resources.spare_nodes", f"is for srun's ranks of hpcyolo's trainer on "
                                                             f"resources.nodes, not {why}")
    if total:
        gpus, procs, tasks, world = (1 if site.node.gpus else 0), None, None, total
        cpus_per_task = _uneven_cpus_per_task(site, job, job_file, total)
        omp = max(1, cpus_per_task // site.node.threads_per_core) if cpus_per_task else 1
    else:
        gpus, procs = _processes_per_node(site, job, job_file)
        tasks = 1 if launcher == "torchrun" else procs
        world = job.resources.nodes * procs
        cpus_per_task = _cpus_per_task(site, job, job_file, gpus, procs, tasks)
        # One OpenMP thread per physical core of the process's share.
        omp = max(1, cpus_per_task // (procs // tasks) // site.node.threads_per_core) if cpus_per_task else 1
    _check_limits(site, job, job_file, world)

    data = (Path(job_file).parent / job.data.yaml).resolve() if not Path(job.data.yaml).is_absolute() \
        else Path(job.data.yaml)
    if check_paths and not (data.is_file() or data.is_dir()):  # a folder: a classification dataset's class folders
        raise ConfigError(job_file, "data.yaml", f"file not found: {data}")

    weights = _weights_path(job, job_file, check_paths)
    signal = site.preemption.signal
    if launcher == "torchrun" and signal not in TORCHRUN_SIGNALS:
        signal = "TERM"
    train = _train_settings(site, job, signal, weights)
    run_name = job.run.name or job.name
    uses_scratch = job.data.stage or (job.data.cache != "none" and not job.entrypoint)

    return JobPlan(
        site=site, job=job, site_file=site_file, job_file=job_file, command=command,
        site_name=site.name, job_name=job.name, environment=site.environment,
        extra_sbatch=tuple(site.slurm.extra_sbatch), container=site.container.runtime,
        master_suffix=site.network.master_suffix, resume=job.run.resume, preflight=job.preflight,
        stage=job.data.stage, sigterm=site.preemption.sigterm, max_requeues=site.preemption.max_requeues,
        max_failures=site.preemption.max_failures,
        launcher=launcher, nodes=job.resources.nodes, max_nodes=job.resources.max_nodes, gpus_per_node=gpus,
        procs_per_node=procs, tasks_per_node=tasks, world_size=world, cpus_per_task=cpus_per_task, omp_threads=omp,
        time=format_time(parse_time(job.resources.time)), signal=signal,
        sbatch=_sbatch_options(site, job, gpus, tasks, cpus_per_task, signal, total,
                               restarts_in_place(job, launcher, total is not None)),
        run_name=run_name, run_dir=f"{site.storage.runs}/{run_name}", data=str(data),
        scratch_dir=f"{site.storage.scratch}/hpcyolo-${{SLURM_JOB_USER}}/{run_name}", uses_scratch=uses_scratch,
        network_env=_network_env(site, gpus),
        stage_srun=_stage_srun(site, job.resources.nodes + spare, tasks, cpus_per_task),
        train_srun=_train_srun(site, job.resources.nodes, tasks, cpus_per_task, gpus, total, spare),
        step_prefix=_step_prefix(site, gpus),
        stage_argv=("hpcyolo", "stage", "--data", Var("DATA"), "--dest", Var("SCRATCH_DIR", f"/{STAGED}"),
                    "--signal", signal),
        unstage_argv=("hpcyolo", "stage", "--remove", Var("SCRATCH_DIR")),
        preflight_argv=_preflight_argv(site, job),
        train_settings=tuple(train.items()),
        train_argv=_launch_argv(launcher, job.resources.nodes, procs) + _train_argv(job, train),
    )


def check_logs_folder(plan: JobPlan) -> None:
    """storage.logs must be a folder the job can write when it starts: Slurm
    opens the --output file there before the script's first line runs, so
    without it the job fails at once, with no output anywhere and no run
    directory. Checked on this machine (validate, render, submit --via
    sbatch), which on a cluster sees the same shared folder as the nodes."""
    logs = plan.site.storage.logs
    if not logs:
        return
    why = "it must exist when the job is submitted: Slurm opens the job's --output file there before the script " \
          "runs, and without it the job fails at once with no output anywhere"
    if not os.path.isdir(logs):
        what = "is not a folder" if os.path.exists(logs) else "does not exist"
        raise ConfigError(plan.site_file, "storage.logs", f"{logs} {what}; {why} (mkdir -p {shlex.quote(logs)})")
    if not os.access(logs, os.W_OK | os.X_OK):
        raise ConfigError(plan.site_file, "storage.logs", f"{logs} is not writable by you; {why}")


def _processes_per_node(site: SiteConfig, job: JobSpec, job_file: str) -> tuple[int, int]:
    """(GPUs per node, training processes per node)."""
    res = job.resources
    if site.node.gpus == 0:
        if res.gpus_per_node:
            raise ConfigError(job_file, "resources.gpus_per_node",
                              f"asks for {res.gpus_per_node} GPUs, but site '{site.name}' has none "
                              "(use resources.tasks_per_node for CPU processes)")
        return 0, res.tasks_per_node or 1
    gpus = res.gpus_per_node or site.node.gpus
    if gpus > site.node.gpus:
        raise ConfigError(job_file, "resources.gpus_per_node",
                          f"asks for {gpus} GPUs per node, but site '{site.name}' nodes have {site.node.gpus}")
    if res.tasks_per_node is not None and res.tasks_per_node != gpus:
        raise ConfigError(job_file, "resources.tasks_per_node",
                          f"is for CPU sites; site '{site.name}' runs one process per GPU ({gpus})")
    return gpus, gpus


def _uneven_total(site: SiteConfig, job: JobSpec, job_file: str, launcher: str) -> int | None:
    """The processes of an uneven layout (resources.gpus, or tasks on a CPU
    site), checked against the site; None for an even one (N per node).

    How it is asked of Slurm, and why so: `--ntasks=TOTAL` with one GPU per
    task (`--gpus-per-task=1`) and `--nodes=MIN[-MAX]`. man sbatch: -n,
    --ntasks "controller will ... allocate enough resources for N tasks";
    -N, --nodes "minnodes[-maxnodes] ... as many nodes as possible within the
    range specified and without delaying the initiation of the job";
    --gpus-per-task "requires an explicit task count, e.g. -n ... This option
    will implicitly set --gpu-bind=per_task:<gpus_per_task>", so each task
    sees its own GPU (cuda:0). Slurm guarantees the total and a GPU per task,
    and places as many tasks on a node as it has free GPUs (and CPUs): a node
    with 2 free GPUs and two with 4 make one job of 10. Not a heterogeneous
    job (`#SBATCH hetjob`, one component per node size): its components are
    fixed shapes that must all be free at once, it cannot be a job array
    (a sweep), and only the backfill scheduler starts it (Slurm's
    heterogeneous_jobs page, Limitations)."""
    res = job.resources
    gpu_site = site.node.gpus > 0
    key = "resources.gpus" if res.gpus is not None else "resources.tasks"
    total = res.gpus if res.gpus is not None else res.tasks
    if total is None:
        if res.max_nodes is not None:
            raise ConfigError(job_file, "resources.max_nodes", "only goes with resources.gpus or resources.tasks "
                                                               "(a total spread over the nodes); an even layout "
                                                               "has exactly resources.nodes")
        return None
    if res.gpus is not None and res.tasks is not None:
        raise ConfigError(job_file, "resources.tasks", "give resources.gpus (GPU sites) or resources.tasks (CPU "
                                                       "sites), not both")
    if res.gpus is not None and not gpu_site:
        raise ConfigError(job_file, key, f"site '{site.name}' has no GPUs; on a CPU site use resources.tasks")
    if res.tasks is not None and gpu_site:
        raise ConfigError(job_file, key, f"is for CPU sites; site '{site.name}' runs one process per GPU: use "
                                         "resources.gpus")
    per_node = "gpus_per_node" if gpu_site else "tasks_per_node"
    if getattr(res, per_node) is not None:
        raise ConfigError(job_file, key, f"is a total over all nodes: give it or resources.{per_node}, not both")
    if launcher == "torchrun":
        raise ConfigError(job_file, key, "torchrun starts the same number of workers on every node; an uneven "
                                         "layout needs resources.launcher: srun (one Slurm task per process)")
    most = res.max_nodes or res.nodes
    if res.max_nodes is not None and res.max_nodes < res.nodes:
        raise ConfigError(job_file, "resources.max_nodes", f"{res.max_nodes} is below resources.nodes "
                                                           f"({res.nodes})")
    if total < res.nodes:
        raise ConfigError(job_file, key, f"{total} process(es) cannot cover {res.nodes} nodes (at least one each); "
                                         "lower resources.nodes")
    if gpu_site and total > most * site.node.gpus:
        raise ConfigError(job_file, key, f"{total} GPUs do not fit on {most} node(s) of site '{site.name}' "
                                         f"({site.node.gpus} each); raise resources.max_nodes")
    return total


def _uneven_cpus_per_task(site: SiteConfig, job: JobSpec, job_file: str, total: int) -> int | None:
    """CPUs for each process of an uneven layout: resources.cpus_per_task,
    else a GPU's share of a node, else (CPU site) a share of a node that
    holds the most tasks when they fill the fewest nodes."""
    cpus, asked = site.node.cpus, job.resources.cpus_per_task
    if asked is not None:
        if cpus is not None and asked > cpus:
            raise ConfigError(job_file, "resources.cpus_per_task", f"{asked} is more than site '{site.name}' "
                                                                   f"nodes have ({cpus})")
        return asked
    if cpus is None:
        return None
    if site.node.gpus:
        return max(1, cpus // site.node.gpus)
    return max(1, cpus // -(-total // job.resources.nodes))


def _cpus_per_task(site: SiteConfig, job: JobSpec, job_file: str, gpus: int, procs: int,
                   tasks: int) -> int | None:
    """The job's resources.cpus_per_task, checked against the node; else a
    GPU's share of the node's CPUs for each GPU of the task (so a job on
    part of a shared node asks for its part), or the node's CPUs split over
    the tasks on a CPU site."""
    cpus, asked = site.node.cpus, job.resources.cpus_per_task
    if asked is not None:
        if asked < procs // tasks:
            raise ConfigError(job_file, "resources.cpus_per_task", f"{asked} is fewer than the {procs // tasks} "
                                                                   "training processes of each task")
        if cpus is not None and asked * tasks > cpus:
            raise ConfigError(job_file, "resources.cpus_per_task", f"{asked} x {tasks} task(s) per node is more "
                                                                   f"than site '{site.name}' nodes have ({cpus})")
        return asked
    if cpus is None:
        return None
    if cpus < procs:
        raise ConfigError(job_file, "resources", f"{procs} processes per node, but site '{site.name}' nodes have "
                                                f"{cpus} CPUs")
    if gpus:
        return cpus // site.node.gpus * (gpus // tasks)
    return cpus // tasks


def _check_limits(site: SiteConfig, job: JobSpec, job_file: str, world: int) -> None:
    seconds = parse_time(job.resources.time)
    if seconds > limit_seconds(site.slurm.max_time):
        raise ConfigError(job_file, "resources.time", f"{job.resources.time} is longer than site '{site.name}' "
                                                      f"allows ({site.slurm.max_time})")
    if site.preemption.grace and seconds <= site.preemption.grace:
        raise ConfigError(job_file, "resources.time", f"{job.resources.time} leaves no time before the "
                                                      f"preemption signal ({site.preemption.grace} s before the end)")
    problem = batch_problem(job.train.batch, world)  # `hpcyolo train --batch` says the same
    if problem:
        raise ConfigError(job_file, "train.batch", problem)


def _sbatch_options(site: SiteConfig, job: JobSpec, gpus: int, tasks: int | None, cpus_per_task: int | None,
                    signal: str, total: int | None, in_place: bool = False) -> tuple[tuple[str, object], ...]:
    s = site.slurm
    res = job.resources
    if total:  # uneven: a total, one GPU per task (see _uneven_total)
        nodes = node_range(res.nodes, res.max_nodes)
        gpu = ("gpus_per_task", 1) if gpus else None
        tasks_option = ("ntasks", total)
    else:
        nodes = res.nodes + res.spare_nodes
        gpu = {
            "gres": ("gres", f"{s.gres_name}:{gpus}"),
            "gpus-per-node": ("gpus_per_node", gpus),
            "gpus-per-task": ("gpus_per_task", gpus // tasks),
            "none": None,
        }[s.gpu_request]
        tasks_option = ("ntasks_per_node", tasks)
    logs = f"{site.storage.logs}/%x-%j.out" if site.storage.logs else "%x-%j.out"
    options = [
        ("job_name", job.name),
        ("nodes", nodes),
        tasks_option,
        ("cpus_per_task", cpus_per_task),
        gpu,
        ("mem", site.node.memory),
        ("time", format_time(parse_time(job.resources.time))),
        ("partition", s.partition),
        ("account", s.account),
        ("qos", s.qos),
        ("constraint", s.constraint),
        ("reservation", s.reservation),
        ("requeue", True),
        # A node that Slurm finds failed ends the whole job unless --no-kill: with it the
        # allocation lives on without that node, and the script restarts the training in place.
        ("no_kill", True if in_place else None),
        ("open_mode", "append"),
        ("signal", f"{signal}@{site.preemption.grace}" if site.preemption.grace else None),
        ("output", logs),
    ]
    return tuple(o for o in options if o is not None and o[1] is not None)


def _network_env(site: SiteConfig, gpus: int) -> tuple[tuple[str, str], ...]:
    """NCCL/Gloo variables: the interface, InfiniBand, then the site's own."""
    net = site.network
    env = []
    if net.interface:
        if gpus:
            env.append(("NCCL_SOCKET_IFNAME", net.interface))
        env.append(("GLOO_SOCKET_IFNAME", net.interface))
    if gpus and not net.infiniband:
        env.append(("NCCL_IB_DISABLE", "1"))
    if net.ib_hca:
        env.append(("NCCL_IB_HCA", ",".join(net.ib_hca)))
    env.extend((name, Expand(value)) for name, value in net.nccl_env.items())
    return tuple(env)


def _container_options(site: SiteConfig) -> tuple[str, ...]:
    """srun options for every step: pyxis adds its container options to srun."""
    c = site.container
    if c.runtime != "pyxis":
        return ()
    options = [Expand(f"--container-image={c.image}")]
    if c.mounts:
        options.append(Expand(f"--container-mounts={','.join(c.mounts)}"))
    return (*options, *(c.options or ()))


def _stage_srun(site: SiteConfig, nodes: int, tasks: int | None, cpus_per_task: int | None) -> tuple[str, ...]:
    """One task per node. --ntasks too: srun would otherwise take the
    allocation's SLURM_NTASKS (every training task) and refuse one task per
    node. An uneven layout may get more nodes than its minimum: the script
    asks Slurm how many it got."""
    if tasks is None:
        options = [Raw('--nodes="$SLURM_JOB_NUM_NODES"'), Raw('--ntasks="$SLURM_JOB_NUM_NODES"')]
    else:
        options = [f"--nodes={nodes}", f"--ntasks={nodes}"]
    options.append("--ntasks-per-node=1")
    if cpus_per_task:
        options.append(f"--cpus-per-task={cpus_per_task * (tasks or 1)}")
    return (*options, *_container_options(site))


def _train_srun(site: SiteConfig, nodes: int, tasks: int | None, cpus_per_task: int | None, gpus: int,
                total: int | None, spare: int = 0) -> tuple[str, ...]:
    # --kill-on-bad-exit: one failed rank ends the step instead of leaving the
    # others blocked in a collective. --cpus-per-task is repeated on purpose:
    # since Slurm 22.05 srun no longer inherits it from the batch allocation.
    if total:  # uneven: every node of the allocation, its tasks where Slurm placed them
        options = ["--kill-on-bad-exit=1", Raw('--nodes="$SLURM_JOB_NUM_NODES"'), f"--ntasks={total}"]
    else:
        options = ["--kill-on-bad-exit=1", f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
        if spare:  # the allocation's SLURM_NTASKS counts the spares' tasks too
            options.append(f"--ntasks={nodes * tasks}")
    if cpus_per_task:
        options.append(f"--cpus-per-task={cpus_per_task}")
    if total and gpus:
        options.append("--gpus-per-task=1")
    elif site.slurm.gpu_request == "gpus-per-task":
        options.append(f"--gpus-per-task={gpus // tasks}")
    return (*options, *site.slurm.extra_srun, *_container_options(site))


def _step_prefix(site: SiteConfig, gpus: int) -> tuple[str, ...]:
    """`apptainer exec [--nv] --bind ... IMAGE` (or singularity) before hpcyolo."""
    c = site.container
    if c.runtime not in ("apptainer", "singularity"):
        return ()
    options = c.options if c.options is not None else (("--nv",) if gpus else ())
    binds = tuple(w for m in c.mounts for w in ("--bind", Expand(m)))
    return (c.runtime, "exec", *options, *binds, Expand(c.image))


def _preflight_argv(site: SiteConfig, job: JobSpec) -> tuple[str, ...]:
    argv = ["hpcyolo", "doctor", "--in-job"]
    if site.network.interface:
        argv += ["--interface", site.network.interface]
    if job.data.stage:
        argv += ["--scratch", Var("SCRATCH_DIR"), "--data", Var("DATA")]
    return tuple(argv)


def _launch_argv(launcher: str, nodes: int, procs: int) -> tuple[str, ...]:
    if launcher != "torchrun":
        return ()
    # One torchrun per node; c10d rendezvous on the first host. --no-python
    # runs the hpcyolo console script itself in each worker.
    return ("torchrun", f"--nnodes={nodes}", f"--nproc-per-node={procs}", "--rdzv-backend=c10d",
            Raw('--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"'), Raw('--rdzv-id="$SLURM_JOB_ID"'), "--no-python")


def _weights_path(job: JobSpec, job_file: str, check_paths: bool) -> str | None:
    """train.weights as an absolute path (relative ones are to the job file); it must be a file."""
    if not job.train.weights:
        return None
    path = Path(job.train.weights)
    path = path if path.is_absolute() else (Path(job_file).parent / path).resolve()
    if check_paths and not path.is_file():
        what = "is not a file" if path.exists() else "file not found"
        raise ConfigError(job_file, "train.weights", f"{what}: {path}")
    return str(path)


def _train_settings(site: SiteConfig, job: JobSpec, signal: str, weights: str | None) -> dict[str, object]:
    """The trainer's settings of this job, by name: every setting of the
    settings' table that the job spec (or the site) has a key for, as it
    says; the plan's own paths for the run directory, the data (both
    variables of the script), the weights and the node-local image cache."""
    values = {s.name: _key_value(site, job, s.key) for s in SETTINGS if s.key}
    # cfg=None: load_job took the recipe's settings into the job spec already.
    values.update(run_dir=Var("RUN_DIR"), data=Var("DATA"), signal=signal, weights=weights, cfg=None)
    if job.data.cache != "none":  # one copy per node, in node-local scratch
        values["cache_dir"] = Var("SCRATCH_DIR", "/cache")
    return values


def _key_value(site: SiteConfig, job: JobSpec, key: str) -> object:
    """The value of a key such as train.epochs (the job spec's) or
    site:preemption.signal (the site config's)."""
    on_site = key.startswith("site:")
    section, _, name = key.removeprefix("site:").partition(".")
    return getattr(getattr(site if on_site else job, section), name)


def _train_argv(job: JobSpec, values: dict[str, object]) -> tuple[str, ...]:
    """The training command: `hpcyolo train` with the run-level options and
    every other setting whose value is not the trainer's default, in the
    table's order (a job at the defaults says only what it must, and a new
    setting leaves existing jobs' command lines as they were); a custom
    entrypoint gets the run-level options of `hpcyolo exec`."""
    chosen = [s for s in SETTINGS if s.flag and (s.name in RUN_LEVEL or values.get(s.name, s.default) != s.default)]
    words = [w for s in chosen if s.name in RUN_LEVEL or not job.entrypoint for w in _option_words(s, values[s.name])]
    if job.entrypoint:
        return ("hpcyolo", "exec", *words, "--", *job.entrypoint)
    return ("hpcyolo", "train", *words)


def _option_words(s: Setting, value: object) -> tuple[str, ...]:
    """`--epochs 30`, `--rect` or `--no-rect`: the words of one option."""
    on, _, off = s.flag.partition("/")
    if off:
        return (on if value else off,)
    if isinstance(value, tuple):  # --classes 0,2
        return (on, ",".join(map(str, value)))
    return (on, value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value))


