"""`hpcyolo doctor SITE [JOB]`: compare a site config with the live cluster
from a login node, before a job wastes an allocation.

Each check says PASS, FAIL (with the fix) or SKIP (with why it could not be
checked). The network interface is looked up on a compute node of the
partition (a one-task srun), or on this node when no task can run, saying so.
What else only a compute node can tell (its scratch, the master's port) is
checked here on this node where that means something, and on every node by
the preflight step.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from hpcyolo_trainer.common.errors import HpcyoloError, shown
from hpcyolo_trainer.common.preemption import EXIT_CODE

from hpcyolo import slurm
from hpcyolo.login.config import JobSpec, SiteConfig
from hpcyolo.node.preflight import Check
from hpcyolo.slurm import limit_seconds, parse_config

GPU_STYLE_SINCE = {"gpus-per-node": (19, 5), "gpus-per-task": (19, 5), "gres": (0, 0), "none": (0, 0)}


def _run(argv: list[str]) -> tuple[int, str]:
    """A shell command of this node (not Slurm's: those go through
    hpcyolo.slurm): (exit status, its output, or on failure what it said)."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer in 30 s"
    return _said(r)


def _said(r: subprocess.CompletedProcess) -> tuple[int, str]:
    return r.returncode, (r.stdout if r.returncode == 0 else (r.stderr.strip() or r.stdout.strip()))


def _ask(question, *args) -> tuple[int, str]:
    """A question to Slurm (a function of hpcyolo.slurm): (exit status, its
    output, or on failure what it said); 127 when the command is not here,
    124 when it gives no answer."""
    try:
        return _said(question(*args))
    except slurm.NoAnswer as e:
        return (127, f"{e.command}: not found") if e.missing else \
            (124, f"{e.command}: no answer in {slurm.ASK_TIMEOUT} s")


def _gres_gpus(gres: str) -> int:
    """GPUs in a sinfo GRES field: gpu:8, gpu:a100:4(S:0-1), gpu:2,shard:4 -> count."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item)
        if m:
            total += int(m[1])
    return total


def check_slurm(site: SiteConfig) -> tuple[Check, tuple[int, int] | None]:
    return slurm_check(site, *_ask(slurm.version))


def slurm_check(site: SiteConfig, code: int, out: str) -> tuple[Check, tuple[int, int] | None]:
    """The check of `scontrol --version`'s answer (exit status, output)."""
    m = re.search(r"(\d+)\.(\d+)", out) if code == 0 else None
    if not m:
        last = (out.strip().splitlines() or ["no output"])[-1][:160]
        return Check("slurm", "FAIL", f"no Slurm client answers here ({last})",
                     "run doctor on a login node of the cluster, with Slurm's commands on PATH (and "
                     "SLURM_CONF set where the site needs it)"), None
    version = (int(m[1]), int(m[2]))
    need = GPU_STYLE_SINCE[site.slurm.gpu_request]
    if version < need:
        return Check("slurm", "FAIL", f"Slurm {out.strip()} does not know --{site.slurm.gpu_request} "
                     f"(needs {need[0]}.{need[1]})", "set slurm.gpu_request: gres"), version
    return Check("slurm", "PASS", f"{out.strip()}; GPU request style {site.slurm.gpu_request} supported"), version


def partition_rows() -> tuple[list[dict], str]:
    code, out = _ask(slurm.partitions)
    if code != 0:
        return [], out
    return parse_partitions(out), ""


def parse_partitions(out: str) -> list[dict]:
    """sinfo's lines (slurm.SINFO_FORMAT) as rows: name, default, limit,
    nodes, cpus, mem, gpus."""
    rows = []
    for line in out.splitlines():
        name, limit, nodes, cpus, mem, gres = (line.split("|") + [""] * 6)[:6]
        rows.append({"name": name.rstrip("*"), "default": name.endswith("*"), "limit": limit, "nodes": int(nodes),
                     "cpus": int(re.sub(r"\D.*", "", cpus) or 0), "mem": int(re.sub(r"\D.*", "", mem) or 0),
                     "gpus": _gres_gpus(gres)})
    return rows


def check_partition(site: SiteConfig, job: JobSpec | None) -> list[Check]:
    rows, error = partition_rows()
    if not rows:
        return [Check("partition", "FAIL", f"sinfo lists no partition ({error[:120]})",
                      "check that this node talks to the cluster's slurmctld (sinfo)")]
    names = sorted({r["name"] for r in rows})
    wanted = site.slurm.partition
    mine = [r for r in rows if r["name"] == wanted] if wanted else [r for r in rows if r["default"]]
    if not mine:
        what = f"partition {shown(wanted)} does not exist" if wanted else "the cluster has no default partition"
        return [Check("partition", "FAIL", f"{what}; partitions: {', '.join(names)}",
                      f"set slurm.partition to one of: {', '.join(names)}")]
    name = mine[0]["name"]
    checks = [Check("partition", "PASS", f"{name}: {sum(r['nodes'] for r in mine)} node(s), "
                    f"time limit {mine[0]['limit']}")]
    limit = limit_seconds(mine[0]["limit"])
    for key, value in (("slurm.max_time", site.slurm.max_time), ("job resources.time",
                                                                  job.resources.time if job else None)):
        if value and limit_seconds(value) > limit:
            checks.append(Check("time limit", "FAIL", f"{key} {value} is above partition {name}'s limit "
                                f"{mine[0]['limit']}", f"lower {key} to at most {mine[0]['limit']}"))
    if job and job.resources.nodes > sum(r["nodes"] for r in mine):
        checks.append(Check("nodes", "FAIL", f"the job asks {job.resources.nodes} nodes, partition {name} has "
                            f"{sum(r['nodes'] for r in mine)}", "ask fewer nodes (resources.nodes)"))
    best = max(mine, key=lambda r: (r["gpus"], r["cpus"]))
    if site.node.gpus > best["gpus"]:
        checks.append(Check("gpus", "FAIL", f"node.gpus is {site.node.gpus}, the nodes of {name} have at most "
                            f"{best['gpus']} GPU(s) in GRES", f"set node.gpus to {best['gpus']} or less"
                            + (" and slurm.gpu_request: none" if not best["gpus"] else "")))
    else:
        checks.append(Check("gpus", "PASS", f"node.gpus {site.node.gpus} of {best['gpus']} in GRES"))
    if site.node.cpus and site.node.cpus > best["cpus"]:
        checks.append(Check("cpus", "FAIL", f"node.cpus is {site.node.cpus}, the nodes of {name} have "
                            f"{best['cpus']}", f"set node.cpus to {best['cpus']} or less"))
    return checks


def check_account(site: SiteConfig) -> Check:
    if not (site.slurm.account or site.slurm.qos):
        return Check("account/qos", "SKIP", "the site names no account or QOS")
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    return account_check(site, *_ask(slurm.associations, user))


def account_check(site: SiteConfig, code: int, out: str) -> Check:
    """The check of sacctmgr's associations of the user (exit status, output)."""
    if code != 0 or not out.strip():
        return Check("account/qos", "SKIP", f"sacctmgr does not answer ({out.strip()[:100] or 'no associations'})")
    pairs = [line.split("|") for line in out.splitlines() if "|" in line]
    accounts = {a for a, _ in pairs}
    qos = {q for _, qs in pairs for q in qs.split(",") if q}
    if site.slurm.account and site.slurm.account not in accounts:
        return Check("account/qos", "FAIL", f"account {shown(site.slurm.account)} is not one of yours "
                     f"({', '.join(sorted(accounts))})", f"set slurm.account to one of: {', '.join(sorted(accounts))}")
    if site.slurm.qos and site.slurm.qos not in qos:
        return Check("account/qos", "FAIL",
                     f"QOS {shown(site.slurm.qos)} is not allowed to you ({', '.join(sorted(qos))})",
                     f"set slurm.qos to one of: {', '.join(sorted(qos))}")
    return Check("account/qos", "PASS", "account and QOS are yours")


def _expand(path: str) -> str | None:
    from hpcyolo.login.runcheck import try_expand

    return try_expand(path)


def check_runs_writable(site: SiteConfig) -> Check:
    root = _expand(site.storage.runs)
    if root is None:
        return Check("storage.runs", "SKIP", f"{site.storage.runs}: a variable in it is not set here")
    why = _cannot_write(root, create=True)
    if why:
        return Check("storage.runs", "FAIL", f"cannot write in {root}: {why}",
                     "set storage.runs to a shared folder you can write (e.g. under $SCRATCH or $WORK)")
    return Check("storage.runs", "PASS", f"{root} is writable")


def _cannot_write(folder: str, create: bool = False) -> str | None:
    """Why a file cannot be created in `folder` (made first where `create`), or None."""
    try:
        if create:
            Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hpcyolo-doctor-"):
            pass
    except OSError as e:
        return e.strerror
    return None


# How long the interface probe's srun waits for a node (srun --immediate):
# doctor should answer in a minute, not queue behind a busy partition.
PROBE_WAIT_S = 30


def compute_node_interfaces(site: SiteConfig) -> tuple[str, list[str]] | str:
    """(host, interface names) of a compute node of the site's partition, from
    a one-task srun; or why no task ran."""
    s = site.slurm
    argv = ["--nodes=1", "--ntasks=1", f"--immediate={PROBE_WAIT_S}", "--time=00:01:00",
            "--job-name=hpcyolo-doctor", "--quiet"]
    argv += [f"--{flag}={value}" for flag, value in (("partition", s.partition), ("account", s.account),
                                                      ("qos", s.qos), ("constraint", s.constraint),
                                                      ("reservation", s.reservation)) if value]
    # One GPU where the site has them: GPU partitions often refuse a job
    # without, and the node probed is then one a training job gets.
    argv += {"gres": [f"--gres={s.gres_name}:1"], "gpus-per-node": ["--gpus-per-node=1"],
             "gpus-per-task": ["--gpus-per-task=1"], "none": []}[s.gpu_request]
    from hpcyolo.login.siteinit import probe_script

    try:
        r = slurm.one_task(argv, ["sh", "-c", probe_script(), "node-probe"], timeout=PROBE_WAIT_S + 60)
    except slurm.NoAnswer as e:
        return "srun is not here" if e.missing else f"srun got no answer in {PROBE_WAIT_S + 60} s"
    return node_interfaces(r)


def node_interfaces(r: subprocess.CompletedProcess) -> tuple[str, list[str]] | str:
    """(host, interface names) from the node probe's output
    (templates/node-probe.sh: `host NAME`, `if NAME KIND STATE ADDR`); or why there is none."""
    from hpcyolo.login.siteinit import parse_probe

    facts = parse_probe(r.stdout) if r.returncode == 0 else {}
    if not facts.get("host") or not facts.get("if"):
        said = (r.stderr.strip().splitlines() or [f"exit {r.returncode}, no output"])[-1]
        return f"srun could not run a task on a compute node ({said[:160]})"
    return facts["host"][0][0], [row[0] for row in facts["if"]]


def check_interface(site: SiteConfig, use_srun: bool = True) -> Check:
    """The interface on a compute node of the partition (a one-task srun),
    else on this node, saying so."""
    if not site.network.interface:
        return Check("network.interface", "SKIP", "the site names no interface (NCCL/Gloo choose one)")
    wanted = site.network.interface.split(",")  # NCCL and Gloo take a comma list
    probe = compute_node_interfaces(site) if use_srun else "no Slurm answers here"
    if isinstance(probe, tuple):
        host, names = probe
        where, note = f"compute node {host}", ""
    else:
        host, names = socket.gethostname(), [n for _, n in socket.if_nameindex()]
        where, note = host, f" (checked on this node only: {probe})"
    missing = [n for n in wanted if n not in names]
    if missing:
        return Check("network.interface", "FAIL", f"{', '.join(missing)} does not exist on {where} "
                     f"(interfaces: {', '.join(names)}){note}",
                     "list a compute node's interfaces (srun -N1 ip -brief addr) and set network.interface to "
                     "the fast one (InfiniBand ib0, Slingshot hsn0, ...)")
    return Check("network.interface", "PASS", f"{site.network.interface} exists on {where}{note}")


def check_logs(site: SiteConfig) -> Check:
    """Slurm opens the output file in storage.logs before the script runs:
    without the folder a job dies at once, with no output anywhere."""
    logs = site.storage.logs
    if not logs:
        return Check("storage.logs", "SKIP", "empty: Slurm writes the job's output in the folder you submit from")
    if not os.path.isdir(logs):
        return Check("storage.logs", "FAIL", f"{logs} does not exist: Slurm opens the job's output file there "
                     "before the script runs, so every job would fail at once with no output",
                     f"create it (mkdir -p {shlex.quote(logs)}) or set storage.logs to an existing shared folder")
    why = _cannot_write(logs)
    if why:
        return Check("storage.logs", "FAIL", f"cannot write in {logs}: {why}",
                     "set storage.logs to a shared folder you can write, or fix its permissions")
    return Check("storage.logs", "PASS", f"{logs} exists and is writable")


def check_venv(site: SiteConfig) -> Check:
    venv = _expand(site.environment.venv)
    if venv is None:
        return Check("environment.venv", "SKIP", f"{site.environment.venv}: a variable in it is not set here")
    install = f"python3 -m venv {venv} && {venv}/bin/pip install /path/to/hpcyolo"
    if not os.path.isfile(os.path.join(venv, "bin", "activate")):
        what = "is not a virtual environment (no bin/activate)" if os.path.isdir(venv) else "does not exist"
        return Check("environment.venv", "FAIL", f"{venv} {what}; the script sources {venv}/bin/activate",
                     f"create it ({install}), or set environment.venv to the venv that holds hpcyolo")
    if site.container.runtime != "none":  # the steps run the image's hpcyolo
        return Check("environment.venv", "PASS", f"{venv} exists (the steps run hpcyolo in the container)")
    exe = os.path.join(venv, "bin", "hpcyolo")
    if not os.access(exe, os.X_OK):
        return Check("environment.venv", "FAIL", f"{venv} holds no hpcyolo ({exe}), which every step runs",
                     f"install it there: {venv}/bin/pip install /path/to/hpcyolo (a checkout or a wheel)")
    return Check("environment.venv", "PASS", f"{venv} holds hpcyolo")


# Image references, not files: apptainer/singularity URIs, and pyxis's
# enroot references (anything that is not a path: [USER@][REGISTRY#]IMAGE[:TAG]).
_IMAGE_URI = re.compile(r"[a-z]+://")


def check_container_image(site: SiteConfig) -> Check:
    c = site.container
    image = _expand(c.image or "")
    if image is None:
        return Check("container.image", "SKIP", f"{c.image}: a variable in it is not set here")
    if _IMAGE_URI.match(image) or not image.startswith(("/", ".")):
        return Check("container.image", "SKIP", f"{image} is a registry reference: {c.runtime} pulls it when the "
                     "job starts")
    if not os.path.exists(image):  # a file, or an apptainer sandbox folder
        pull = (f"apptainer pull {image} docker://IMAGE" if c.runtime != "pyxis"
                else f"enroot import -o {image} docker://IMAGE")
        return Check("container.image", "FAIL", f"{image} does not exist ({c.runtime} would fail on every step)",
                     f"build or copy the image there ({pull}), or set container.image to the image file")
    if not os.access(image, os.R_OK):
        return Check("container.image", "FAIL", f"{image} is not readable by you",
                     "fix its permissions, or set container.image to an image you can read")
    return Check("container.image", "PASS", f"{image} exists")


# What the batch shell runs `module ...` with: a function the login shell
# defines (Lmod, Environment Modules), passed to the job by sbatch's default
# --export=ALL.
MODULE_PROBE = ("bash", "-lc", "type -t module")


def check_modules(site: SiteConfig) -> Check:
    env = site.environment
    keys = [k for k, v in (("module_purge", env.module_purge), ("module_use", env.module_use),
                           ("modules", env.modules)) if v]
    code, out = _run(list(MODULE_PROBE))
    if code != 0 or not out.strip():
        return Check("module command", "FAIL", f"no `module` command here, but environment."
                     f"{', environment.'.join(keys)} use it: the script's module lines would fail",
                     "submit from a shell where `module` works (source the site's /etc/profile.d/lmod.sh "
                     "or modules.sh), or empty environment.modules and module_use and set module_purge: false")
    return Check("module command", "PASS", f"`module` is a shell {out.split()[-1]} here")


def check_scratch(site: SiteConfig, job: JobSpec | None, data: str | None) -> Check:
    where = _expand(site.storage.scratch)
    if where is None or not os.path.isdir(where):
        return Check("storage.scratch", "SKIP", f"{site.storage.scratch} is not here (node-local: the preflight "
                     "checks it on every node)")
    free = shutil.disk_usage(where).free
    if not (job and job.data.stage and data):
        return Check("storage.scratch", "PASS", f"{where}: {free / 2**30:.1f} GiB free on this node")
    from hpcyolo_trainer.common.datayaml import data_root

    from hpcyolo.node.stage import walk

    root = data_root(data)
    need = walk(root).nbytes
    if need > free:
        return Check("storage.scratch", "FAIL", f"staging {root} needs {need / 2**30:.2f} GiB, {where} has "
                     f"{free / 2**30:.2f} GiB free on this node",
                     "choose a larger node-local storage.scratch (NVMe rather than /dev/shm), or data.stage: false")
    return Check("storage.scratch", "PASS", f"{where}: {free / 2**30:.1f} GiB free, the dataset needs "
                 f"{need / 2**30:.2f} GiB")


def check_dataset(data: str, task: str | None = None) -> Check:
    """The data YAML, its splits and labels, as the trainer checks them for
    train.task `task` (a classifier's folder of class folders, pose's
    kpt_shape)."""
    from hpcyolo_trainer.common.datayaml import check_data

    try:
        warnings = check_data(data, task)
    except HpcyoloError as e:
        return Check("data", "FAIL", str(e), "fix the data YAML, or its labels/ folder")
    if warnings:
        return Check("data", "WARN", "; ".join(warnings))
    return Check("data", "PASS", f"{data}: splits and labels as the trainer needs them")


def check_layout(plan, version: tuple[int, int] | None) -> Check:
    """The processes the job asks for, in words and in sbatch's options; an
    uneven layout asks --gpus-per-task, which older Slurm lacks."""
    asks = " ".join(f"--{name.replace('_', '-')}={value}" for name, value in plan.sbatch
                    if name in ("nodes", "ntasks", "ntasks_per_node", "gpus_per_task", "gpus_per_node", "gres"))
    text = f"{plan.layout} = world size {plan.world_size}, {plan.batch_per_rank} images per rank ({asks})"
    if plan.uneven and plan.gpus_per_node and version and version < GPU_STYLE_SINCE["gpus-per-task"]:
        need = GPU_STYLE_SINCE["gpus-per-task"]
        return Check("layout", "FAIL", f"{text}: Slurm {version[0]}.{version[1]} does not know --gpus-per-task "
                     f"(needs {need[0]}.{need[1]})", "use resources.gpus_per_node (the same count on every node)")
    if plan.uneven:
        text += "; each node gets as many processes as it has free " + ("GPUs" if plan.gpus_per_node else "CPUs") \
                + ", and rank, local rank and local world size come from Slurm (SLURM_PROCID, SLURM_LOCALID, " \
                  "SLURM_STEP_TASKS_PER_NODE)"
    return Check("layout", "PASS", text)


def check_gpu_binding(plan) -> Check | None:
    """A WARN where the job asks a GPU per task (--gpus-per-task) and a node
    may hold several of its tasks: Slurm then binds each task to its own
    GPU (man sbatch: --gpus-per-task "will implicitly set
    --gpu-bind=per_task"), and where the site confines devices by cgroup
    each task sees that GPU alone: NCCL cannot see its peers on the node
    and falls back to slower paths (NVIDIA/nccl#1066). None otherwise."""
    per_task = dict(plan.sbatch).get("gpus_per_task")
    if not per_task or (not plan.uneven and (plan.procs_per_node or 1) < 2):
        return None
    fix = ("an even layout (resources.nodes, every GPU of each node) asks its GPUs per node" if plan.uneven else
           "the site's slurm.gpu_request: gres or gpus-per-node (each rank still takes its own GPU, by LOCAL_RANK)")
    return Check("gpu binding", "WARN", f"the job asks --gpus-per-task={per_task}: each task is bound to its own "
                 f"GPU, and where Slurm confines devices (ConstrainDevices) NCCL cannot see the other GPUs of the "
                 f"node and falls back to slower paths (NVIDIA/nccl#1066)", fix)


# == the preemption path: Slurm's grace against a checkpoint's write ===========

# Bytes per parameter that a checkpoint holds: the weights and the EMA (float32
# each) and the optimizer's state: SGD's and MuSGD's momentum (one float32),
# AdamW's two moments; `auto` picks AdamW or MuSGD, so the larger.
OPTIMIZER_BYTES = {"sgd": 4, "musgd": 4, "adamw": 8, "auto": 8}
# The test file doctor writes (and fsyncs) in storage.runs to time its storage.
SPEED_PROBE_BYTES = 32 << 20
# A grace below this many checkpoint writes warns: the ranks first finish
# their optimizer step and agree, and the batch script must still requeue.
GRACE_MARGIN = 3


def parse_partition(out: str, name: str | None) -> dict[str, str]:
    """The line of partition `name` (the default one for None) of `scontrol
    show partition -o`, as Key=Value fields; {} when there is none."""
    for line in out.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if fields.get("PartitionName") == name or name is None and fields.get("Default") == "YES":
            return fields
    return {}


def published_parameters(model: str) -> int:
    """The detector's parameter count as ultralytics publishes it (80 classes)."""
    from hpcyolo_trainer.common import registry

    name = registry.ALIASES.get(model, model)
    return registry.PUBLISHED_PARAMETERS[name[:-1]][name[-1]]


def checkpoint_estimate(model: str, optimizer: str) -> tuple[int, str]:
    """(bytes, how they were counted) of a checkpoint of `model` trained with `optimizer`."""
    from hpcyolo_trainer.common import registry

    name = registry.ALIASES.get(model, model)
    params = published_parameters(name)
    per = 8 + OPTIMIZER_BYTES[optimizer]
    return params * per, (f"{name}, {params / 1e6:.1f} M parameters x {per} B: weights, EMA and optimizer "
                          f"{optimizer}'s state, estimated from the published size, not measured")


def write_speed(folder: str, nbytes: int = SPEED_PROBE_BYTES) -> float | str:
    """Bytes per second of a test file written and fsynced in `folder`
    (made first), removed after; or why it could not be written."""
    data = os.urandom(nbytes)  # not zeros: compressing filesystems would flatter them
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hpcyolo-doctor-speed-") as f:
            start = time.monotonic()
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            seconds = time.monotonic() - start
    except OSError as e:
        return e.strerror or str(e)
    return nbytes / max(seconds, 1e-6)


def check_preemption(site: SiteConfig, job: JobSpec | None) -> Check:
    """The preemption path on the live cluster: how Slurm stops a job of the
    partition and how long it leaves, against a checkpoint's write."""
    code, out = _ask(slurm.config)
    if code != 0:
        return Check("preemption", "SKIP", f"scontrol show config does not answer ({out.strip()[:100]})")
    config = parse_config(out)
    code, out = _ask(slurm.partition, site.slurm.partition)
    part = parse_partition(out, site.slurm.partition) if code == 0 else {}
    root = _expand(site.storage.runs)
    speed = write_speed(root) if root is not None else f"{site.storage.runs}: a variable in it is not set here"
    from hpcyolo_trainer.common import registry

    model, optimizer = (job.train.model, job.train.optimizer) if job else (None, None)
    if model not in registry.CHOICES:  # no job, or a model the weights decide (train.weights)
        model = registry.DEFAULT
    optimizer = optimizer if optimizer in OPTIMIZER_BYTES else "auto"
    return preemption_check(site, config, part, checkpoint_estimate(model, optimizer), speed, root,
                            job_given=job is not None and job.train.model == model)


def preemption_check(site: SiteConfig, config: dict[str, str], part: dict[str, str], estimate: tuple[int, str],
                     speed: float | str, where: str | None, job_given: bool = True) -> Check:
    """The check from what Slurm said (`config`: scontrol show config;
    `part`: the partition's line), the checkpoint's estimated size and the
    write speed measured in `where` (or why it is not known)."""
    ptype, mode = config.get("PreemptType"), (part.get("PreemptMode") or config.get("PreemptMode") or "").upper()
    if not ptype:
        return Check("preemption", "SKIP", "scontrol show config names no PreemptType")
    name = part.get("PartitionName") or site.slurm.partition or "the default partition"
    if ptype == "preempt/none" or mode.startswith("OFF") or not mode:
        return Check("preemption", "PASS", f"jobs of {name} are not preempted (PreemptType {ptype}, PreemptMode "
                     f"{mode or 'unset'}); the time limit's signal comes {site.preemption.grace} s before the end")
    if "SUSPEND" in mode or mode == "GANG":
        return Check("preemption", "PASS", f"{name}: a preempted job is suspended ({ptype}, PreemptMode {mode}), "
                     "not stopped: nothing to checkpoint")
    grace = int(part.get("GraceTime") or 0)
    kill_wait = int((config.get("KillWait") or "30").split()[0])
    window, whence = (grace, "GraceTime") if grace else (kill_wait, "KillWait, no GraceTime")
    user_signal = "preempt_send_user_signal" in config.get("PreemptParameters", "")
    how = (f"SIG{site.preemption.signal} and SIGTERM (preempt_send_user_signal)" if user_signal else
           "SIGTERM only (no preempt_send_user_signal in PreemptParameters)")
    text = f"{name}: PreemptMode {mode} ({ptype}); at preemption {how}, SIGKILL {window} s later ({whence})"
    if not user_signal and site.preemption.sigterm == "stop":
        return Check("preemption", "FAIL", f"{text}; with preemption.sigterm: stop a preempted job stops without "
                     "a checkpoint and is not requeued by hpcyolo",
                     "set preemption.sigterm: requeue (hpcyolo then asks Slurm why SIGTERM came), or ask the "
                     "admins for PreemptParameters=preempt_send_user_signal")
    nbytes, counted = estimate
    if not job_given:
        counted += ", for the default model: give the JOB with its train.model for its own"
    if isinstance(speed, str):
        return Check("preemption", "WARN", f"{text}; a checkpoint ~{nbytes / 1e6:.0f} MB ({counted}), but its "
                     f"write time is unknown: cannot write a test file in {where}: {speed}",
                     "fix storage.runs (see its check), then run doctor again")
    seconds = nbytes / speed
    text += (f"; a checkpoint ~{nbytes / 1e6:.0f} MB ({counted}) writes in ~{seconds:.1f} s at {speed / 1e6:.0f} "
             f"MB/s ({SPEED_PROBE_BYTES >> 20} MB written and fsynced in {where})")
    fix = (f"ask the admins for a longer GraceTime on {name}, write runs to faster storage (storage.runs), or "
           "checkpoint often (checkpoint.every_steps) so a preemption without one loses little")
    if seconds > window:
        return Check("preemption", "FAIL", f"{text}: longer than the {window} s Slurm leaves", fix)
    if seconds * GRACE_MARGIN > window:
        return Check("preemption", "WARN", f"{text}: under {GRACE_MARGIN}x of the {window} s Slurm leaves (the "
                     "ranks first finish their step)", fix)
    return Check("preemption", "PASS", text)

def doctor(site: SiteConfig, job: JobSpec | None, data: str | None = None, plan=None) -> list[Check]:
    """Every check; `data`: the job's data YAML, resolved (plan.data);
    `plan`: the job's plan, whose layout is explained."""
    slurm, version = check_slurm(site)
    checks = [slurm]
    if plan is not None:
        checks.append(check_layout(plan, version))
        binding = check_gpu_binding(plan)
        if binding is not None:
            checks.append(binding)
    partition_ok = False
    if slurm.status == "PASS":
        partition = check_partition(site, job)
        partition_ok = partition[0].status == "PASS"
        checks += [*partition, check_account(site)]
        if partition_ok:
            checks.append(check_preemption(site, job))
    checks += [check_runs_writable(site), check_logs(site), check_interface(site, use_srun=partition_ok),
               check_scratch(site, job, data)]
    if data:
        checks.append(check_dataset(data, plan.task if plan is not None else None))
    if site.environment.venv:
        checks.append(check_venv(site))
    if site.container.runtime != "none":
        checks.append(check_container_image(site))
    if site.environment.module_purge or site.environment.module_use or site.environment.modules:
        checks.append(check_modules(site))
    return checks


def report(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.status:4}  {c.name:18} {c.detail}")
        if c.fix:
            lines.append(f"{'':24}fix: {c.fix}")
    failed = sum(c.status == "FAIL" for c in checks)
    lines.append(f"{len(checks)} checks: {failed} failed" if failed else f"{len(checks)} checks: all passed")
    return "\n".join(lines)


# == the signal self-test (its job script: templates/signal-test.sh.j2) =======

def signal_wait(signal_name: str, result: str, timeout: float = 240.0) -> int:
    """In the test job's task: say ready, wait for the signal, record it."""
    import signal as signals

    got: list[int] = []
    signals.signal(getattr(signals, f"SIG{signal_name}"), lambda signum, frame: got.append(signum))
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    with open(result, "a") as f:
        f.write(f"ready on {host}\n")
    deadline = time.monotonic() + timeout
    while not got and time.monotonic() < deadline:
        time.sleep(0.1)
    with open(result, "a") as f:
        f.write(f"got SIG{signal_name} on {host}\n" if got else f"no signal on {host}\n")
    return EXIT_CODE if got else 1


def signal_test(site: SiteConfig, site_file: str, timeout: float = 300.0) -> list[Check]:
    from hpcyolo.login.config import JobSpec
    from hpcyolo.login.loader import build
    from hpcyolo.login.plan import make_plan
    from hpcyolo.login.render import render_signal_test

    raw = {"name": "hpcyolo-signal-test", "resources": {"nodes": 1, "time": "00:10:00"},
           "data": {"yaml": "/dev/null"}, "train": {"batch": 1}}
    if site.node.gpus:
        raw["resources"]["gpus_per_node"] = 1
    else:
        raw["resources"]["tasks_per_node"] = 1
    plan = make_plan(site, build(JobSpec, raw, "<signal test>"), site_file=site_file, job_file="<signal test>",
                     check_paths=False)
    root = _expand(site.storage.runs)
    if root is None:
        return [Check("signal test", "FAIL", f"{site.storage.runs}: a variable in it is not set here",
                      "run it where storage.runs resolves")]
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".hpcyolo-signal-test-", dir=root))
    except OSError as e:
        return [Check("signal test", "FAIL", f"cannot write in {root}: {e.strerror}",
                      "set storage.runs to a shared folder you can write")]
    result = folder / "result"
    script = render_signal_test(plan, result, f"{folder}/%j.out")
    (folder / "signal-test.sh").write_text(script)
    job_id = slurm.sbatch(script)
    checks = []
    deadline = time.monotonic() + timeout
    while not (result.exists() and "ready" in result.read_text()):
        info = slurm.show_job(job_id)
        if info.get("JobState") in slurm.FINAL_STATES or time.monotonic() > deadline:
            return [Check("signal test", "FAIL", f"job {job_id} ended or never started the task "
                          f"({info.get('JobState')}); see {folder}", "run the script by hand: sbatch "
                          f"{folder / 'signal-test.sh'}")]
        time.sleep(0.5)
    slurm.cancel(job_id, f"--signal={plan.signal}")  # to the job steps, as --signal=SIG@T does
    info = slurm.wait(job_id, timeout=timeout, settled=lambda i: i.get("Restarts") != "0" or
                      "requeue refused" in (result.read_text() if result.exists() else ""))
    text = result.read_text()
    if f"got SIG{plan.signal}" in text:
        checks.append(Check("signal", "PASS", f"SIG{plan.signal} reached the task through srun"
                            + (" and the container" if plan.step_prefix else "")))
    else:
        checks.append(Check("signal", "FAIL", f"SIG{plan.signal} never reached the task (job {job_id}: {shown(text)})",
                            "the signal must go to the job steps: --signal without B:, and a container that "
                            "passes signals on (apptainer exec does; check --pid options)"))
    if "requeued: restart" in text and info.get("JobState") == "COMPLETED":
        checks.append(Check("requeue", "PASS", f"scontrol requeue worked: job {job_id} ran again and completed"))
    else:
        checks.append(Check("requeue", "FAIL", f"job {job_id} was not requeued ({info.get('JobState')}, "
                            f"restarts {info.get('Restarts')})", "ask the admins whether users may requeue "
                            "(JobRequeue=1 in slurm.conf, --requeue allowed in the partition)"))
    if all(c.status == "PASS" for c in checks):
        shutil.rmtree(folder, ignore_errors=True)
    else:
        checks.append(Check("signal test", "SKIP", f"kept {folder}: the script, its log and the task's record"))
    return checks
