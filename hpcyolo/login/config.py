"""Site config and job spec: the schema, documented key by key, and loading.

A site config holds facts about one cluster that rarely change; a job spec
holds one training run. Both load into frozen, keyword-only dataclasses and are
never changed after loading: derived values live in the plan (hpcyolo.login.plan).
site_configs/example.yaml is the annotated version of the same schema.
"""

# Without `from __future__ import annotations`: the loader reads the fields'
# types (typing.get_type_hints), which would otherwise compile each one's text
# at every start of `hpcyolo render`.
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from hpcyolo_trainer.common.errors import ConfigError, HpcyoloError, shown
from hpcyolo_trainer.common.record import make_record, record
from hpcyolo_trainer.common.settings import BY_KEY, SIGNALS, check_non_negative, check_positive, check_signal
from hpcyolo_trainer.common.yamlfile import read_yaml

from hpcyolo.login.loader import build, spec
from hpcyolo.slurm import limit_seconds, parse_time

# -- value checks (each raises ValueError with the message the user sees) ----

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Values that go into `#SBATCH` lines are read by sbatch, not the shell:
# names Slurm itself restricts keep to the characters it takes there; free
# text such as a path is quoted for sbatch (slurm_flags.directive_word).
_SLURM_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:+@%=-]*")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.,:&|*!\[\]()-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(?:=[A-Za-z0-9_.,:+@%=/*&|\[\]()-]+)?")
_MEMORY = re.compile(r"[0-9]+[KMGT]?")
PATH_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def check_name(value: str) -> None:
    if not _NAME.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a valid name: use letters, digits, '.', '_' and '-' "
                         "(at most 64, starting with a letter or digit)")


def check_slurm_word(value: str) -> None:
    if not _SLURM_WORD.fullmatch(value):
        raise ValueError(f"{shown(value)} has characters Slurm does not take here "
                         "(letters, digits and _ . , : + @ % = - only)")


def check_constraint(value: str) -> None:
    if not _CONSTRAINT.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a Slurm constraint expression (features joined by & | , [ ] *)")


def check_memory(value: str) -> None:
    if not _MEMORY.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a Slurm memory size such as 480G, 64000 (MB) or 0 (all memory)")


# Variables the batch script and hpcyolo's steps set or read themselves, with
# who owns them; a name ending in `*` stands for every name it starts. A site
# that exported one (environment.env, network.nccl_env) would change what the
# script does behind its back: SLURM_RESTART_COUNT=1 switches off the guard
# that never overwrites a run. tests/test_script_words.py checks that every
# variable the rendered script assigns or its template reads is here. Not
# here on purpose: PATH and TMPDIR, which a site may well extend or move.
RESERVED_ENV: dict[str, str] = {
    "SLURM*": "Slurm sets it for the job, and the script reads it",
    # hpcyolo's own variables that the script or its steps set; the drills
    # (HPCYOLO_DRILL_*) stay settable: rehearsing a preemption on the real
    # cluster is what they are for.
    "HPCYOLO_SCRATCH_DIR": "the script sets it for its steps (the run's node-local scratch)",
    "HPCYOLO_SIGTERM": "the script sets it from preemption.sigterm",
    "HPCYOLO_PREEMPT_MARKER": "the script sets it for the trainer (the preemption marker it looks for)",
    "HPCYOLO_IN_PLACE": "the script sets it: the training step's start inside the allocation",
    "HPCYOLO_EXCLUDED": "the script sets it: the nodes its training step leaves out after a failure",
    "HPCYOLO_RESTART": "hpcyolo run sets it: the training's start on this machine",
    "HPCYOLO_MASTER_PORT": "it would pin every job to one port; set it at submission to choose one",
    "HPCYOLO_JOB": "hpcyolo sets it in each task: the job's identity, checked at the rendezvous",
    "HPCYOLO_RUN_DIR": "hpcyolo exec sets it for the command it runs",
    "HPCYOLO_DATA": "hpcyolo exec sets it for the command it runs",
    "HPCYOLO_SIGNAL": "hpcyolo exec sets it for the command it runs",
    "HPCYOLO_DIST_TIMEOUT": "hpcyolo exec sets it for the command it runs",
    "MASTER_ADDR": "the script sets it (the first host of the allocation)",
    "MASTER_PORT": "the script sets it from the job id (HPCYOLO_MASTER_PORT at submission chooses one)",
    "RANK": "the launcher's rank layout: hpcyolo sets it in each task",
    "LOCAL_RANK": "the launcher's rank layout: hpcyolo sets it in each task",
    "WORLD_SIZE": "the launcher's rank layout: hpcyolo sets it in each task",
    "LOCAL_WORLD_SIZE": "the launcher's rank layout: hpcyolo sets it in each task",
    "NODE_RANK": "the launcher's rank layout: hpcyolo sets it in each task",
    "GROUP_RANK": "torchrun sets it; hpcyolo would take the job for a torchrun job",
    "GROUP_WORLD_SIZE": "torchrun sets it; hpcyolo would take the job for a torchrun job",
    "TORCHELASTIC_*": "torchrun sets it; hpcyolo would take the job for a torchrun job",
    "OMPI_COMM_WORLD_*": "OpenMPI sets it; hpcyolo would take the job for an mpirun job",
    "CUDA_VISIBLE_DEVICES": "Slurm sets it in each task from the GPUs it allocated",
    "OMP_NUM_THREADS": "the script sets it from the CPUs per task (node.cpus, resources.cpus_per_task)",
    "PYTHONUNBUFFERED": "the script sets it, so that logs arrive as they are written",
    "NCCL_SOCKET_IFNAME": "the script sets it from network.interface",
    "GLOO_SOCKET_IFNAME": "the script sets it from network.interface",
    "NCCL_IB_DISABLE": "the script sets it from network.infiniband",
    "NCCL_IB_HCA": "the script sets it from network.ib_hca",
    "RUN_DIR": "a variable of the script (the run directory)",
    "DATA": "a variable of the script (the data YAML)",
    "SCRATCH_DIR": "a variable of the script (the run's node-local scratch)",
    "LOG_FILE": "a variable of the script (the job's log)",
    "IFS": "the script's word splitting depends on it",
    "PIPESTATUS": "bash sets it",
    "EPOCHREALTIME": "bash sets it (the ledger's stamps)",
    "LEDGER": "a variable of the script (this start's stamps in the run's ledger)",
    "job_began": "a variable of the script",
    "nodelist": "a variable of the script",
    "srun_errors": "a variable of the script",
    "status": "a variable of the script",
    "terminated": "a variable of the script",
    "ending": "a variable of the script",
    "in_place": "a variable of the script",
    "ledger_base": "a variable of the script",
    "nodes_left": "a variable of the script",
    "tasks_left": "a variable of the script",
    "restart_word": "a variable of the script",
    "left_out": "a variable of the script",
    "kept": "a variable of the script",
    "without": "a variable of the script",
    "node": "a variable of the script",
}


def reserved_env(name: str) -> str | None:
    """Why the script keeps `name` to itself (RESERVED_ENV), or None."""
    for pattern, why in RESERVED_ENV.items():
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return why
    return None


def check_env(value: dict) -> None:
    for name in value:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{shown(name)} is not a valid environment variable name")
        why = reserved_env(name)
        if why:
            raise ValueError(f"{name} cannot be set here: {why}")


def check_sbatch_options(value: tuple) -> None:
    for option in value:
        if not _SBATCH_OPTION.fullmatch(option):
            raise ValueError(f"{shown(option)} is not a single sbatch option such as --hint=nomultithread "
                             "(no spaces, quotes or '#': sbatch reads a '#' there as the start of a comment)")


def check_path(value: str) -> None:
    """Absolute, or starting with an environment variable ($SCRATCH/runs)."""
    if not (value.startswith("/") or PATH_VAR.match(value)):
        raise ValueError(f"{shown(value)} must be an absolute path or start with a variable such as $SCRATCH "
                         "(use $HOME, not ~)")


def check_plain_path(value: str) -> None:
    """Absolute, no variables: Slurm itself reads it (#SBATCH --output, where
    it is quoted, so spaces and `#` are fine)."""
    if not value.startswith("/") or "$" in value:
        raise ValueError(f"{shown(value)} must be an absolute path without variables (Slurm reads it, not the shell)")
    check_no_filename_pattern(value)


def check_runs_path(value: str) -> None:
    """storage.runs: a path for the shell, but Slurm reads paths under it too
    (the --output of submitit's jobs and of `hpcyolo doctor --signal-test`)."""
    check_path(value)
    check_no_filename_pattern(value)


def check_no_filename_pattern(value: str) -> None:
    """Slurm reads --output as a filename pattern (man sbatch, filename
    pattern): `%` starts a replacement (%j: the job id) and a `\\` anywhere
    turns every replacement off, so the job's log would not be where hpcyolo
    looks for it."""
    if re.search(r"[%\\]", value):
        raise ValueError(f"{shown(value)} must not contain '%' or '\\': Slurm reads the job's log path under it as a "
                         "filename pattern, where % starts a replacement (%j: the job id) and \\ turns them all off")


def check_host_suffix(value: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9.-]*", value):
        raise ValueError(f"{shown(value)} is not a host name suffix (letters, digits, '.', '-')")


def setting(key: str) -> Any:
    """The schema field of the trainer's setting with this key (its default,
    doc and check: hpcyolo_trainer.common.settings)."""
    row = BY_KEY[key]
    return spec(row.default, doc=row.doc, check=row.check)


def setting_type(key: str) -> Any:
    """The type of the trainer's setting with this key, as annotated there."""
    return BY_KEY[key].type


def trainer_section(name: str) -> type:
    """A job-spec section made of the trainer's settings whose keys are in it
    (train.epochs, ...), in the table's order."""
    rows = [(key.partition(".")[2], row) for key, row in BY_KEY.items() if key.partition(".")[0] == name]
    fields_ = [(field, row.type, setting(row.key)) for field, row in rows]
    # A docstring of its own: dataclass would otherwise compute one from its signature (inspect, at import).
    doc = f"The job spec's `{name}:` section: the trainer's settings {name}.*."
    return make_record(name.title(), fields_, namespace={"__module__": __name__, "__doc__": doc})


def check_time(value: str) -> None:
    parse_time(value)


def check_max_time(value: str) -> None:
    try:
        limit_seconds(value)
    except ValueError as e:
        raise ValueError(f"{e}, or INFINITE for a partition without a limit") from None


# -- site config ---------------------------------------------------------


@record
class SlurmSite:
    """The site's `slurm:` section: where and how jobs are queued."""

    partition: str | None = spec(None, doc="Partition (--partition); empty for the cluster's default.",
                                 check=check_slurm_word)
    account: str | None = spec(None, doc="Account charged (--account).", check=check_slurm_word)
    qos: str | None = spec(None, doc="Quality of service (--qos).", check=check_slurm_word)
    constraint: str | None = spec(None, doc="Node features (--constraint), e.g. gpu or gpu&hbm80g.",
                                  check=check_constraint)
    reservation: str | None = spec(None, doc="Reservation (--reservation).", check=check_slurm_word)
    max_time: str | None = spec(None, doc="Longest walltime the partition allows, as sinfo shows it (INFINITE: no "
                                          "limit); jobs asking more are refused.", check=check_max_time)
    gpu_request: Literal["gres", "gpus-per-node", "gpus-per-task", "none"] = spec(
        "gres", doc="How the site asks for GPUs: gres (--gres=gpu:N), gpus-per-node, gpus-per-task, none (CPU site).")
    gres_name: str = spec("gpu", doc="The GRES name, with a type if the site wants one (gpu:a100).",
                          check=check_slurm_word)
    launcher: Literal["srun", "torchrun"] = spec(
        "srun", doc="srun: one task per GPU; torchrun: one task per node running torchrun (c10d rendezvous).")
    extra_sbatch: tuple[str, ...] = spec((), doc="More sbatch options, one per item (--hint=nomultithread).",
                                         check=check_sbatch_options)
    extra_srun: tuple[str, ...] = spec((), doc="More srun options for the training step (--cpu-bind=cores).",
                                       check=check_sbatch_options)
    array_parallelism: int | None = spec(None, doc="Most elements of a sweep's job array running at once "
                                                   "(--array=0-N%K); empty: all of them.", check=check_positive)


@record
class NodeSite:
    """The site's `node:` section: what one node of the partition holds."""

    gpus: int = spec(0, doc="GPUs per node; 0 for a CPU site.", check=check_non_negative)
    cpus: int | None = spec(None, doc="CPU cores per node a job may use; sets --cpus-per-task and OMP_NUM_THREADS.",
                            check=check_positive)
    memory: str | None = spec(None, doc="Memory per node to ask for (--mem): 480G, 64000 (MB), or 0 for all.",
                              check=check_memory)
    threads_per_core: int = spec(1, doc="Hardware threads per core that node.cpus counts (2 where Slurm counts "
                                        "hyperthreads); OMP_NUM_THREADS gets one thread per core.",
                                 check=check_positive)


@record
class NetworkSite:
    """The site's `network:` section: how the ranks reach each other."""

    interface: str | None = spec(None, doc="Interface for NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (ib0, hsn0).",
                                 check=check_slurm_word)
    master_suffix: str = spec("", doc="Appended to the first host's name for MASTER_ADDR, where the site names "
                                      "a node's fast interface that way (JSC: jwb0001 -> jwb0001i).",
                              check=check_host_suffix)
    infiniband: bool = spec(False, doc="InfiniBand present; false sets NCCL_IB_DISABLE=1.")
    ib_hca: tuple[str, ...] = spec((), doc="HCAs for NCCL_IB_HCA (mlx5_0, mlx5_1, ...).")
    nccl_env: dict[str, str] = spec({}, doc="More NCCL/network variables, exported ($VAR expands).", check=check_env)


@record
class StorageSite:
    """The site's `storage:` section: shared runs, node-local scratch, logs."""

    runs: str = spec(doc="Shared root for run directories and checkpoints ($VAR allowed: $SCRATCH/hpcyolo).",
                     check=check_runs_path)
    scratch: str = spec("/dev/shm", doc="Node-local scratch for staged data (tmpfs /dev/shm, or NVMe).",
                        check=check_path)
    logs: str | None = spec(None, doc="Directory for Slurm output files (no $VAR); empty: the submit directory.",
                            check=check_plain_path)


@record
class EnvironmentSite:
    """The site's `environment:` section: the software a job's steps run in."""

    module_purge: bool = spec(False, doc="Run `module purge` before loading modules.")
    module_use: tuple[str, ...] = spec((), doc="Module directories to add first (`module use DIR`).")
    modules: tuple[str, ...] = spec((), doc="Environment modules to load, in order.")
    venv: str | None = spec(None, doc="Python virtual environment to activate (its root directory).",
                            check=check_path)
    env: dict[str, str] = spec({}, doc="Environment variables to export ($VAR expands at run time).",
                               check=check_env)


@record
class ContainerSite:
    """The site's `container:` section: the image the steps run in, if any."""

    runtime: Literal["none", "apptainer", "singularity", "pyxis"] = spec(
        "none", doc="Run the steps in a container: none, apptainer or singularity (exec), "
                    "pyxis (srun --container-image).")
    image: str | None = spec(None, doc="Image: a .sif/.sqsh path or a registry reference, hpcyolo installed in it "
                                       "($VAR expands).")
    mounts: tuple[str, ...] = spec((), doc="Bind mounts, SRC[:DST], so runs, data and scratch are visible "
                                           "($VAR expands).")
    options: tuple[str, ...] | None = spec(None, doc="Extra runtime options; default for apptainer on GPUs: [--nv].")


@record
class PreemptionSite:
    """The site's `preemption:` section: the signal before a job's end and its grace."""

    signal: setting_type("site:preemption.signal") = setting("site:preemption.signal")
    grace: int = spec(120, doc="Seconds before the time limit to send it (--signal=SIG@grace); 0: none.",
                      check=check_non_negative)
    max_requeues: int = spec(3, doc="How often a job may requeue itself after preemption or time-out (its "
                                    "requeues after failures count too).", check=check_non_negative)
    max_failures: int = spec(2, doc="How often a job whose rank or node failed (killed by a signal, a node "
                                    "failure, a hang the watchdog blames on some ranks) requeues itself without the "
                                    "failed node(s) and resumes from its newest checkpoint; a user's error (bad "
                                    "config, missing data, out of memory, an exception) never does.",
                             check=check_non_negative)
    sigterm: Literal["requeue", "stop"] = spec(
        "requeue", doc="On SIGTERM: requeue: checkpoint and requeue when Slurm says it is requeueing, preempting or "
                       "timing out the job (a cancel just stops); stop: always stop without a checkpoint.")


@record
class SiteConfig:
    """A site config: facts about one cluster."""

    name: str = spec(doc="Short name of the site, shown in the script header.", check=check_name)
    description: str = spec("", doc="What the site is, and which public facts the file reflects.")
    slurm: SlurmSite = spec(SlurmSite, doc="How jobs are asked of Slurm.")
    node: NodeSite = spec(NodeSite, doc="What one node has.")
    network: NetworkSite = spec(NetworkSite, doc="Interconnect settings for NCCL and Gloo.")
    storage: StorageSite = spec(doc="Where runs, checkpoints, staged data and logs go.")
    environment: EnvironmentSite = spec(EnvironmentSite, doc="Software set-up run before every step.")
    container: ContainerSite = spec(ContainerSite, doc="Container runtime for the steps.")
    preemption: PreemptionSite = spec(PreemptionSite, doc="Time-limit and preemption handling.")


# -- job spec ------------------------------------------------------------


@record
class Resources:
    """The job spec's `resources:` section: nodes, GPUs or tasks, time."""

    nodes: int = spec(1, doc="Number of nodes (with resources.gpus or tasks: at least this many).",
                      check=check_positive)
    gpus_per_node: int | None = spec(None, doc="GPUs per node (one training process each); empty: all the site has.",
                                     check=check_positive)
    tasks_per_node: int | None = spec(None, doc="CPU sites only: training processes per node (default 1).",
                                      check=check_positive)
    gpus: int | None = spec(None, doc="Instead of gpus_per_node, for nodes with different free GPU counts: this "
                                      "many GPUs in all, one process each, as many on each node as Slurm finds "
                                      "(--ntasks with --gpus-per-task=1).", check=check_positive)
    tasks: int | None = spec(None, doc="CPU sites: instead of tasks_per_node, this many processes in all, as many "
                                       "on each node as Slurm finds room for (--ntasks).", check=check_positive)
    max_nodes: int | None = spec(None, doc="With resources.gpus or tasks: Slurm may spread them over up to this "
                                           "many nodes (--nodes=nodes-max_nodes); empty: exactly resources.nodes.",
                                 check=check_positive)
    cpus_per_task: int | None = spec(None, doc="CPUs per task (--cpus-per-task), to use part of a node; empty: "
                                               "the node's share (node.cpus over the tasks, or per GPU).",
                                     check=check_positive)
    spare_nodes: int = spec(0, doc="Nodes asked for beyond resources.nodes, staged and idle until one of the job's "
                                   "nodes fails: the training then starts again on a spare inside the allocation, "
                                   "no requeue (srun launcher, resources.nodes and tasks or GPUs per node).",
                            check=check_non_negative)
    time: str = spec("01:00:00", doc="Walltime (--time): 90, 04:00:00, 1-12:00:00.", check=check_time)
    launcher: Literal["srun", "torchrun"] | None = spec(None, doc="Override the site's launcher.")


@record
class Data:
    """The job spec's `data:` section: the dataset and its staging."""

    yaml: setting_type("data.yaml") = setting("data.yaml")
    stage: bool = spec(False, doc="Copy the dataset into node-local scratch once per node before training.")
    cache: setting_type("data.cache") = setting("data.cache")


# The trainer's settings of the job spec: Train and Checkpoint are made of
# the settings' table's rows with their keys; the other sections take such a
# setting (data.cache, run.dist_timeout, the site's preemption.signal) with
# `setting`. Adding a setting to the table adds it here.
Train = trainer_section("train")
Checkpoint = trainer_section("checkpoint")


@record
class Run:
    """The job spec's `run:` section: the run directory's name and resumption."""

    name: str | None = spec(None, doc="Run directory name under the site's storage.runs; empty: the job name.",
                            check=check_name)
    resume: bool = spec(False, doc="Continue an existing run of this name, if it is the same run (model, data, "
                                   "settings: hpcyolo_trainer.common.rundir); false refuses to touch one (a requeued job "
                                   "always resumes its own run).")
    dist_timeout: setting_type("run.dist_timeout") = setting("run.dist_timeout")
    hang_factor: setting_type("run.hang_factor") = setting("run.hang_factor")
    hang_min: setting_type("run.hang_min") = setting("run.hang_min")
    hang_cold: setting_type("run.hang_cold") = setting("run.hang_cold")
    straggler_every: setting_type("run.straggler_every") = setting("run.straggler_every")
    straggler_margin: setting_type("run.straggler_margin") = setting("run.straggler_margin")


@record
class JobSpec:
    """A job spec: one training run."""

    name: str = spec(doc="Job name (--job-name).", check=check_name)
    resources: Resources = spec(Resources, doc="Nodes, processes per node and walltime.")
    data: Data = spec(doc="The dataset.")
    train: Train = spec(Train, doc="Training hyper-parameters.")
    checkpoint: Checkpoint = spec(Checkpoint, doc="Checkpoint policy.")
    run: Run = spec(Run, doc="The run directory.")
    preflight: bool = spec(False, doc="Before training, check on every task: the interface, the master host and "
                                      "port, scratch room; and print the all-reduce bus bandwidth.")
    entrypoint: tuple[str, ...] | None = spec(
        None, split=True,
        doc="A custom command instead of the built-in trainer (any torch.distributed script); "
            "it gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.")


# What `hpcyolo site init` writes where it could not decide (the run storage,
# one of several accounts): the user picks one of the candidates it lists.
CHOICE_MARK = "CHOOSE"


def load_site(path: str | Path) -> SiteConfig:
    file = str(path)
    raw = read_yaml(path)
    _refuse_choices(raw, file)
    site = build(SiteConfig, raw, file)
    _check_site(site, file)
    return site


def load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """The job spec in `path`, with dotted keys set from `overrides` (a sweep point) first."""
    return _job(str(path), read_yaml(path), overrides or {})


def load_jobs(path: str | Path, points: list[dict[str, Any]]) -> list[JobSpec]:
    """The job spec in `path` at each sweep point (load_job's overrides),
    the file read and parsed once."""
    import copy

    raw = read_yaml(path)
    return [_job(str(path), copy.deepcopy(raw), point) for point in points]


def _job(file: str, raw: Any, overrides: dict[str, Any]) -> JobSpec:
    for key, value in overrides.items():
        node = raw if isinstance(raw, dict) else {}
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node.setdefault(part, {}), dict):
                raise ConfigError(file, key, f"cannot set it: {part} is not a section")
            node = node[part]
        node[last] = value
    _take_recipe(raw, file)
    job = build(JobSpec, raw, file)
    if job.entrypoint is not None and not job.entrypoint:
        raise ConfigError(file, "entrypoint", "must name a command")
    return job


def _take_recipe(raw: Any, file: str) -> None:
    """train.cfg: the recipe's settings (hpcyolo_trainer.common.recipe) into the
    job's train section where it does not set them itself; what was taken,
    kept and ignored on stderr. The plan then carries the settings, not the file."""
    train = raw.get("train") if isinstance(raw, dict) else None
    if not isinstance(train, dict) or not isinstance(train.get("cfg"), str):
        return
    from hpcyolo_trainer.common.recipe import merge

    path = Path(file).parent / train["cfg"]
    if not path.is_file():
        raise ConfigError(file, "train.cfg", f"no such file: {path}")
    where = {name: key.split(".") for key, name in ((s.key, s.name) for s in BY_KEY.values())
             if not key.startswith("site:") and name != "cfg"}  # train.epochs, data.cache, ...
    sections = {section: raw.get(section) if isinstance(raw.get(section), dict) else {} for section, _ in
                where.values()}
    given = {name: sections[section][field] for name, (section, field) in where.items()
             if field in sections[section]}
    taken, lines = merge(path, given)
    for name, value in taken.items():
        section, field = where[name]
        raw.setdefault(section, {})[field] = value
    for line in lines:
        print(f"hpcyolo: {line}", file=sys.stderr)


def _refuse_choices(raw: Any, file: str, key: str = "") -> None:
    """A value `hpcyolo site init` left as a choice (CHOICE_MARK ...) is refused by its key."""
    if isinstance(raw, dict):
        for name, value in raw.items():
            _refuse_choices(value, file, f"{key}.{name}" if key else str(name))
    elif isinstance(raw, str) and raw.startswith(CHOICE_MARK):
        raise ConfigError(file, key, f"is a choice hpcyolo site init left to you ({shown(raw[:120])}): replace it "
                                     "with one of the candidates listed above it in the file")


def _check_site(site: SiteConfig, file: str) -> None:
    """Checks across keys of one site config."""
    gpu_site = site.node.gpus > 0
    if gpu_site and site.slurm.gpu_request == "none":
        raise ConfigError(file, "slurm.gpu_request", f"is none, but node.gpus is {site.node.gpus}")
    if not gpu_site and site.slurm.gpu_request != "none":
        raise ConfigError(file, "node.gpus", f"is 0, so slurm.gpu_request must be none (got {site.slurm.gpu_request})")
    if site.container.runtime != "none" and not site.container.image:
        raise ConfigError(file, "container.image", f"is required with container.runtime: {site.container.runtime}")
    if site.network.ib_hca and not site.network.infiniband:
        raise ConfigError(file, "network.ib_hca", "is set, but network.infiniband is false")
    if site.preemption.grace >= limit_seconds(site.slurm.max_time):
        raise ConfigError(file, "preemption.grace", "must be shorter than slurm.max_time")


def wrong_order(site_path: str, job_path: str | None) -> ConfigError | None:
    """When SITE or JOB failed to load, the error to show instead if the site
    file's top-level keys are a job spec's, or the job file's a site
    config's: the two given the wrong way round. None when neither is."""
    site_kind, job_kind = _kind(site_path), _kind(job_path) if job_path else None
    if site_kind == "job" and job_kind == "site":
        return ConfigError(site_path, "", f"a job spec where SITE should be, and {job_path} a site config: did you "
                                          "swap SITE and JOB? (SITE comes first)")
    if site_kind == "job":
        return ConfigError(site_path, "", "a job spec where SITE should be (SITE comes first, then JOB)")
    if job_kind == "site":
        return ConfigError(job_path, "", "a site config where JOB should be (SITE comes first, then JOB)")
    return None


def _kind(path: str) -> str | None:
    """"site" or "job" when the file's top-level keys are only one schema's."""
    try:
        raw = read_yaml(path)
    except HpcyoloError:
        return None
    if not isinstance(raw, dict):
        return None
    site_only = {f.name for f in fields(SiteConfig)} - {f.name for f in fields(JobSpec)}
    job_only = {f.name for f in fields(JobSpec)} - {f.name for f in fields(SiteConfig)}
    keys = set(raw)
    if keys & job_only and not keys & site_only:
        return "job"
    if keys & site_only and not keys & job_only:
        return "site"
    return None
