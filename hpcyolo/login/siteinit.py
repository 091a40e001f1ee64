"""`hpcyolo site init`: a site config written from what the cluster says.

On a login node it asks Slurm (`scontrol --version`, `show config`, `show
partition`, `show node`, `sacctmgr` where it answers) and runs one short
step on a compute node of the partition: templates/node-probe.sh, the probe
`hpcyolo doctor` runs too (CPUs, GPUs, memory, interfaces and the one the
kernel routes to another node through, /dev/shm and local disks, shared
mounts, modules, container tools). Three parts:

- `gather`: the questions and the probe (the only part that runs anything);
- `decide`: Facts -> the site's values, each with where it came from, pure;
- `write`: those values as a commented YAML site config.

What the facts cannot decide (where runs go, one of several accounts) is
written as a marked choice (config.CHOICE_MARK) with the candidates found;
`hpcyolo validate` refuses the file until it is chosen.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hpcyolo_trainer.common.errors import HpcyoloError, shown

from hpcyolo import slurm
from hpcyolo.login.config import CHOICE_MARK
from hpcyolo.slurm import parse_config

PROBE_SECONDS = 120  # the probe step's wait for a node (srun --immediate) and its own run
PROBE_WAIT_ENV = "HPCYOLO_PROBE_WAIT"  # seconds the probe waits for a node, where not PROBE_SECONDS
GPU_REQUEST_SINCE = (19, 5)  # --gpus-per-node (select/cons_tres)
SHM_SHARE = 0.25  # /dev/shm is the staging place where it holds at least this share of the node's memory
FAST_KINDS = ("infiniband",)
FAST_PREFIXES = ("ib", "hsn", "bond", "eno", "ens", "enp", "eth")  # in the order one is preferred, after the route
SHARED_FS = ("lustre", "gpfs", "beegfs", "nfs", "nfs4", "cifs", "wekafs", "ceph", "fuse.ceph", "panfs")
RUN_VARS = ("PSCRATCH", "SCRATCH", "WORK", "PROJECT", "CSCRATCH", "FASTDATA")
SLINGSHOT_OFI_ENV = {"NCCL_NET_GDR_LEVEL": "PHB", "FI_CXI_DISABLE_CQ_HUGETLB": "1", "CXI_FORK_SAFE": "1",
                     "CXI_FORK_SAFE_HP": "1"}


class InitError(HpcyoloError):
    """One line: what the cluster did not answer, and that nothing was written."""


@dataclass
class Facts:
    """What the cluster said, as text (recorded outputs feed the same parser)."""
    version: str  # `scontrol --version`
    config: str  # `scontrol show config`
    partitions: str  # `scontrol show partition -o`
    nodes: str  # `scontrol show node -o` (the partition's nodes)
    probe: str | None = None  # templates/node-probe.sh's output on one of them; None: not run
    associations: str | None = None  # `sacctmgr -n -P show assoc user=U format=account,qos`; None: no answer
    venv: str | None = None  # the Python environment hpcyolo runs in here
    srun_help: str = ""  # `srun --help`: pyxis adds --container-image


@dataclass
class Value:
    key: str  # section.name
    value: object
    whence: str  # `# from: ...`
    note: str = ""  # more words above the key (a choice's candidates)


@dataclass
class NodeType:
    names: list[str]
    cpus: int
    threads_per_core: int
    memory_mb: int
    gpus: int
    gpu_type: str | None
    fields: dict = field(default_factory=dict)  # the first node's `scontrol show node` fields


# -- parsing ------------------------------------------------------------------

def key_values(line: str) -> dict[str, str]:
    """A `scontrol show ... -o` line as Key=Value fields; values may hold
    spaces (OS=Linux 5.14 ...): a value runs to the next ` Key=`."""
    return {m[1]: m[2].strip() for m in re.finditer(r"(?:^|\s)([A-Za-z_][\w/:.]*)=(.*?)(?=\s+[A-Za-z_][\w/:.]*=|$)",
                                                    line.strip())}


def parse_version(out: str) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2])) if m else None


def partition_lines(out: str) -> list[dict[str, str]]:
    return [key_values(line) for line in out.splitlines() if line.startswith("PartitionName=")]


def find_partition(out: str, name: str | None) -> dict[str, str]:
    """The partition `name` (the default one for None); InitError naming the others."""
    rows = partition_lines(out)
    for row in rows:
        if row.get("PartitionName") == name or name is None and row.get("Default") == "YES":
            return row
    names = ", ".join(r.get("PartitionName", "?") for r in rows) or "none"
    if name is None:
        raise InitError(f"the cluster has no default partition: name one with --partition (partitions: {names})")
    raise InitError(f"partition {shown(name)} does not exist (partitions: {names})")


def pick_partition(facts: Facts, partition: str | None, constraint: str | None) -> tuple[dict[str, str], bool]:
    """The partition whose nodes the site describes, and whether it was
    found by the constraint alone (no partition given, and the default one
    has no node with those features: the one with the most that do)."""
    part = find_partition(facts.partitions, partition)
    if node_types(facts.nodes, part["PartitionName"], constraint):
        return part, False
    if partition is None and constraint:
        rows = [(sum(len(t.names) for t in node_types(facts.nodes, row["PartitionName"], constraint)), row)
                for row in partition_lines(facts.partitions)]
        count, row = max(rows, key=lambda r: r[0], default=(0, None))
        if count:
            return row, True
    raise InitError(f"scontrol show node lists no node of partition {part['PartitionName']}"
                    + (f" with features {constraint}" if constraint else ""))


def gres_gpus(gres: str) -> tuple[int, str | None]:
    """GPUs in a node's Gres (gpu:4(S:0-1), gpu:a100:4, gpu:2,shard:4) and their type."""
    total, kind = 0, None
    for item in (gres or "").split(","):
        m = re.match(r"gpu(?::([^:(]+))?:(\d+)", item)
        if m:
            total += int(m[2])
            kind = kind or m[1]
    return total, kind


def node_types(out: str, partition: str | None, constraint: str | None) -> list[NodeType]:
    """The partition's nodes (`scontrol show node -o`), grouped by what a job
    layout depends on: CPUs, threads per core, memory, GPUs and their type."""
    groups: dict[tuple, NodeType] = {}
    for line in out.splitlines():
        if not line.startswith("NodeName="):
            continue
        f = key_values(line)
        if partition and partition not in f.get("Partitions", "").split(","):
            continue
        features = f.get("AvailableFeatures", "")
        if constraint and not all(c in features.split(",") for c in re.split(r"[&,]", constraint) if c):
            continue
        cpus = int(f.get("CPUEfctv") or f.get("CPUTot") or 0)
        gpus, kind = gres_gpus(f.get("Gres", ""))
        key = (cpus, int(f.get("ThreadsPerCore") or 1), int(f.get("RealMemory") or 0), gpus, kind)
        if key not in groups:
            groups[key] = NodeType([], *key, fields=f)
        groups[key].names.append(f["NodeName"])
    return sorted(groups.values(), key=lambda t: -len(t.names))


def parse_probe(out: str) -> dict:
    """templates/node-probe.sh's lines as a dict of lists of word lists."""
    facts: dict[str, list[list[str]]] = {}
    for line in out.splitlines():
        words = line.split()
        if words:
            facts.setdefault(words[0], []).append(words[1:])
    return facts


def _one(probe: dict, key: str) -> str | None:
    rows = probe.get(key) or []
    return " ".join(rows[0]) if rows else None


def common_layout(types: list[NodeType]) -> NodeType:
    """What every node type of the partition has (the smallest of each)."""
    kinds = {t.gpu_type for t in types}
    return NodeType([n for t in types for n in t.names], min(t.cpus for t in types),
                    min(t.threads_per_core for t in types), min(t.memory_mb for t in types),
                    min(t.gpus for t in types), kinds.pop() if len(kinds) == 1 else None, types[0].fields)


# -- deciding -----------------------------------------------------------------

def decide(facts: Facts, *, partition: str | None = None, account: str | None = None,
           constraint: str | None = None, node_type: NodeType | None = None,
           warn: list[str] | None = None) -> list[Value]:
    """The site config's values from the facts, each saying where it came
    from; what the facts contradict is said in `warn` (one line each)."""
    warn = [] if warn is None else warn
    config = parse_config(facts.config)
    part, routed = pick_partition(facts, partition, constraint)
    pname = part["PartitionName"]
    show_part = f"scontrol show partition {pname}"
    types = node_types(facts.nodes, pname, constraint)
    node = node_type or (types[0] if len(types) == 1 else common_layout(types))
    show_node = f"scontrol show node {_few(node.names)}"
    probe = parse_probe(facts.probe) if facts.probe else {}
    on = f"the probe on {_one(probe, 'host')}" if probe else ""
    version = parse_version(facts.version)
    v: list[Value] = []

    v.append(Value("name", config.get("ClusterName") or "cluster", "scontrol show config: ClusterName"))
    layout = (f"{len(node.names)} node(s) of partition {pname}: {node.gpus} GPU(s)"
              f"{' ' + node.gpu_type if node.gpu_type else ''}, {node.cpus} CPUs, {node.memory_mb} MB")
    v.append(Value("description", f"{layout}; written by hpcyolo site init", "hpcyolo site init"))

    # slurm
    if routed:
        v.append(Value("slurm.partition", None, f"none given: the default partition has no node with features "
                       f"{constraint}; the nodes that have them are in {pname} (Slurm routes a job by its "
                       "constraint and QOS where the site's submit plugin does; else set partition: " + pname + ")"))
    else:
        v.append(Value("slurm.partition", pname, show_part + (" (the default partition)" if not partition else "")))
    v.append(_account(facts, account))
    v.append(Value("slurm.qos", None, "not asked: set one where the partition needs it"))
    v.append(Value("slurm.constraint", constraint, "--constraint" if constraint else "none asked"))
    limit = part.get("MaxTime", "UNLIMITED")
    v.append(Value("slurm.max_time", "INFINITE" if limit in ("UNLIMITED", "INFINITE") else limit,
                   f"{show_part}: MaxTime={limit}"))

    # node
    gpus, gpu_whence = node.gpus, f"{show_node}: Gres={node.fields.get('Gres', '(null)')}"
    if probe and gpus and not probe.get("gpu"):
        warn.append(f"{show_node} says {gpus} GPU(s) a node (Gres), but the probe on {_one(probe, 'host')} found no "
                    "GPU (no nvidia-smi or rocm-smi device): writing a CPU site (node.gpus: 0); if the nodes have "
                    "GPUs, the probe's node lacks its driver: set node.gpus and slurm.gpu_request yourself")
        gpus, gpu_whence = 0, f"{on}: no GPU device, although {gpu_whence} (see the warning it printed)"
    elif probe.get("gpu"):
        gpu_whence += f"; {on}: {len(probe['gpu'])} x {' '.join(probe['gpu'][0]).rstrip(',')}"
    gpu_request, why = _gpu_request(gpus, version, config)
    v.append(Value("slurm.gpu_request", gpu_request, why))
    v.append(Value("slurm.gres_name", "gpu", f"{show_node}: Gres={node.fields.get('Gres', '(null)')}"
                   + (f" (type {node.gpu_type}: gpu:{node.gpu_type} would pin it)" if node.gpu_type else "")))
    if "--container-image" in facts.srun_help:
        v.append(Value("slurm.launcher", "srun", "one task per GPU; srun --help: pyxis is here (--container-image)"))
    v.append(Value("node.gpus", gpus, gpu_whence))
    cpus, cpu_whence = node.cpus, f"{show_node}: CPUTot/CPUEfctv={node.cpus}"
    online = int(_one(probe, "cpus") or 0)
    if online and online < cpus:  # a node's configuration may claim more than it has (a test cluster)
        cpus, cpu_whence = online, f"{on}: {online} CPUs online, fewer than {cpu_whence}"
    v.append(Value("node.cpus", cpus, cpu_whence))
    v.append(Value("node.threads_per_core", node.threads_per_core, f"{show_node}: ThreadsPerCore"))
    memory_mb, mem_whence = node.memory_mb, f"{show_node}: RealMemory={node.memory_mb} (MB), what a job may ask"
    physical = int(_one(probe, "mem_kb") or 0) // 1024
    if physical and memory_mb and physical < memory_mb:
        memory_mb, mem_whence = physical, f"{on}: MemTotal {physical} MB, less than {mem_whence}"
    memory = f"{memory_mb // 1024}G" if memory_mb and memory_mb % 1024 == 0 else (str(memory_mb) if memory_mb else None)
    v.append(Value("node.memory", memory, mem_whence))

    # network
    v.extend(_network(probe, on))

    # storage
    v.append(_runs(probe, on))
    v.append(_scratch(probe, on, memory_mb))
    v.append(Value("storage.logs", None, "the submit directory"))

    # environment and container
    modules = _one(probe, "module")
    v.append(Value("environment.modules", [], f"{on}: the module command is "
                   f"{'here: add the ones your torch needs' if modules == 'yes' else 'not here'}" if probe else
                   "not probed"))
    v.append(Value("environment.venv", facts.venv, "the Python environment this hpcyolo runs in (the nodes must see "
                   "it)" if facts.venv else "none found here: name the one the nodes run hpcyolo from"))
    tools = [row[0] for row in probe.get("tool", []) if row and row[0] in ("apptainer", "singularity", "enroot")]
    if "--container-image" in facts.srun_help:
        tools.append("pyxis")
    v.append(Value("container.runtime", "none", f"{on}: container tools here: {', '.join(tools) or 'none'} (set "
                   "one to run in an image)" if probe else "not probed"))

    # preemption
    v.extend(_preemption(config, part))
    return v


def _few(names: list[str]) -> str:
    return ",".join(names[:3]) + (f",... ({len(names)} nodes)" if len(names) > 3 else "")


def _account(facts: Facts, account: str | None) -> Value:
    if account:
        return Value("slurm.account", account, "--account")
    if facts.associations is None:
        return Value("slurm.account", None, "sacctmgr does not answer here: set the account your jobs are charged "
                                           "to, where the site asks for one")
    accounts = sorted({line.split("|")[0] for line in facts.associations.splitlines() if line.split("|")[0]})
    if len(accounts) == 1:
        return Value("slurm.account", accounts[0], "sacctmgr show assoc: your one account")
    if not accounts:
        return Value("slurm.account", None, "sacctmgr show assoc: no account of yours")
    return Value("slurm.account", f"{CHOICE_MARK} one of: {' | '.join(accounts)}", "sacctmgr show assoc: several",
                 note="Several accounts are yours: keep the one these jobs are charged to.")


def _gpu_request(gpus: int, version: tuple[int, int] | None, config: dict) -> tuple[str, str]:
    if not gpus:
        return "none", "no GPU in the partition's Gres"
    select = config.get("SelectType", "")
    if version and version >= GPU_REQUEST_SINCE and "cons_tres" in select:
        return "gpus-per-node", (f"Slurm {version[0]}.{version[1]} with {select}: --gpus-per-node (never "
                                 "gpus-per-task: it hides a node's other GPUs from NCCL)")
    return "gres", (f"Slurm {'.'.join(map(str, version)) if version else '?'}, {select or 'SelectType ?'}: "
                    "--gres=gpu:N (--gpus-per-node needs 19.05 and select/cons_tres)")


def _interfaces(probe: dict) -> list[tuple[str, str, str, str]]:
    return [tuple(row[:4]) for row in probe.get("if", []) if len(row) >= 4]


def _network(probe: dict, on: str) -> list[Value]:
    if not probe:
        return [Value("network.interface", None, "not probed: NCCL and Gloo choose one"),
                Value("network.infiniband", False, "not probed")]
    up = [(n, kind, addr) for n, kind, state, addr in _interfaces(probe) if state in ("up", "unknown") and addr != "-"]
    route = _one(probe, "route")
    ib = [row[0] for row in probe.get("ib", [])]
    cxi = [row[0] for row in probe.get("cxi", [])]
    infiniband = bool(ib) or any(kind in FAST_KINDS for _, kind, _ in up)
    values = []
    chosen = None
    if route and any(n == route for n, _, _ in up):
        chosen, whence = route, f"{on}: the kernel routes to another node of the partition through {route}"
    else:
        for prefix in FAST_PREFIXES:
            found = [n for n, kind, _ in up if n.startswith(prefix) and kind != "loopback"]
            if found:
                chosen, whence = found[0], f"{on}: the first up interface of {prefix}* (no route to another node seen)"
                break
    if chosen and chosen.startswith("hsn"):
        siblings = sorted(n for n, _, _ in up if n.startswith("hsn"))
        if len(siblings) > 1 and probe.get("ofi_nccl"):
            chosen = ",".join([chosen] + [n for n in siblings if n != chosen])
            whence += f"; all {len(siblings)} Slingshot NICs for NCCL's OFI plugin"
    if chosen is None:
        values.append(Value("network.interface", None, f"{on}: no interface to name: NCCL and Gloo choose one"))
    else:
        values.append(Value("network.interface", chosen, whence))
    names = ", ".join(f"{n} ({kind})" for n, kind, _ in up)
    values.append(Value("network.infiniband", infiniband, f"{on}: " + (f"InfiniBand devices {', '.join(ib)}" if ib else
                        "no InfiniBand device (NCCL_IB_DISABLE=1)") + f"; interfaces up: {names}"))
    if cxi and probe.get("ofi_nccl"):
        values.append(Value("network.nccl_env", dict(SLINGSHOT_OFI_ENV), f"{on}: Slingshot ({', '.join(cxi)}) with "
                            f"NCCL's OFI plugin ({_one(probe, 'ofi_nccl')}): the variables HPE and the centres set "
                            "for it"))
    elif cxi:
        values.append(Value("network.nccl_env", {}, f"{on}: Slingshot ({', '.join(cxi)}) without NCCL's OFI plugin "
                            "on the library path: NCCL uses TCP sockets (slower); a torch built with aws-ofi-nccl "
                            "(the centre's module or container) uses the NICs"))
    return values


def _runs(probe: dict, on: str) -> Value:
    candidates = []
    for var in RUN_VARS:
        for row in probe.get("env", []):
            if row and row[0] == var:
                candidates.append(f"${var}/hpcyolo")
    for row in probe.get("mount", []):
        if len(row) >= 2 and row[1] in SHARED_FS:
            candidates.append(f"{row[0]}/$USER/hpcyolo ({row[1]})")
    seen = bool(candidates)
    if not candidates:
        candidates = ["$HOME/hpcyolo"]
    return Value("storage.runs", f"{CHOICE_MARK} one of: {' | '.join(c.split(' (')[0] for c in candidates)}",
                 (f"{on}: its scratch variables and shared mounts" if seen else
                  f"{on}: no scratch variable or shared mount seen, so $HOME") if probe else "not probed",
                 note="Where runs and checkpoints go: shared by every node, large, fast; not purged while a run "
                      "lives. Candidates: " + "; ".join(candidates))


def _scratch(probe: dict, on: str, memory_mb: int) -> Value:
    disks = {row[0]: (int(row[1]), int(row[2]), row[3] if len(row) > 3 else "?") for row in probe.get("df", [])
             if len(row) >= 3 and row[1].isdigit() and row[2].isdigit()}
    shm = disks.get("/dev/shm")
    if shm and (not memory_mb or shm[0] >= SHM_SHARE * memory_mb * 1024):
        return Value("storage.scratch", "/dev/shm", f"{on}: /dev/shm ({shm[2]}) {shm[1] // 1048576} GB free of "
                     f"{shm[0] // 1048576} GB")
    local = sorted(((free, path, kind) for path, (_, free, kind) in disks.items()
                    if path != "/dev/shm" and kind not in SHARED_FS), reverse=True)
    if local:
        free, path, kind = local[0]
        return Value("storage.scratch", path, f"{on}: the node-local space with the most room, {free // 1048576} GB "
                     f"free ({kind})")
    return Value("storage.scratch", "/dev/shm", "not probed: /dev/shm, as on most Linux nodes" if not probe else
                 f"{on}: no node-local space seen but /dev/shm")


def _preemption(config: dict, part: dict) -> list[Value]:
    mode = part.get("PreemptMode") or config.get("PreemptMode", "OFF")
    grace_time = part.get("GraceTime", "0")
    kill_wait = config.get("KillWait", "30 sec").split()[0]
    how = (f"PreemptMode={mode}, GraceTime={grace_time} s, KillWait={kill_wait} s: a preempted job gets SIGTERM and "
           f"{grace_time if grace_time not in ('0', '') else kill_wait} s before SIGKILL")
    return [Value("preemption.signal", "USR2", "the warning signal Slurm sends before the time limit (--signal)"),
            Value("preemption.grace", 180, "seconds before the time limit to checkpoint; " + how),
            Value("preemption.max_requeues", 3, "hpcyolo's default")]


# -- writing ------------------------------------------------------------------

SECTIONS = ("slurm", "node", "network", "storage", "environment", "container", "preemption")


def write(values: list[Value], command: str) -> str:
    """The site config's text: each key with its `# from:` line."""
    import yaml

    lines = [f"# Written by `{command}`. Each value says where it came from; a value",
             f"# starting with {CHOICE_MARK} is yours to choose: `hpcyolo validate` refuses the file",
             "# until it is chosen. Annotated key by key in site_configs/example.yaml.", ""]
    by_section: dict[str, list[Value]] = {}
    for value in values:
        section, _, _ = value.key.partition(".")
        by_section.setdefault(section if "." in value.key else "", []).append(value)
    for value in by_section.get("", []):
        lines.append(f"{value.key}: {_scalar(yaml, value.value)}")
    for section in SECTIONS:
        if section not in by_section:
            continue
        lines += ["", f"{section}:"]
        for value in by_section[section]:
            name = value.key.partition(".")[2]
            if value.note:
                lines += [f"  # {part}" for part in _wrap(value.note)]
            lines += [f"  # from: {part}" if i == 0 else f"  #   {part}" for i, part in enumerate(_wrap(value.whence))]
            text = _scalar(yaml, value.value)
            if "\n" in text:
                lines.append(f"  {name}:")
                lines += [f"    {line}" for line in text.splitlines()]
            else:
                lines.append(f"  {name}: {text}")
    return "\n".join(lines) + "\n"


def _scalar(yaml, value) -> str:
    if value is None:
        return ""
    if isinstance(value, dict) and value:
        return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip()
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()


def _wrap(text: str, width: int = 100) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


# -- asking the cluster ---------------------------------------------------------

def gather(partition: str | None, account: str | None, constraint: str | None, probe: bool) -> Facts:
    """Ask Slurm on this login node, then probe a compute node of the partition."""
    try:
        version = slurm.version()
    except slurm.NoAnswer as e:
        if e.missing:
            raise InitError("no Slurm here (scontrol: command not found): run `hpcyolo site init` on a login node "
                            "of the cluster; nothing written") from None
        raise InitError(f"Slurm does not answer ({e}); nothing written") from None
    if version.returncode != 0:
        raise InitError(f"scontrol --version failed: {_last(version)}; nothing written")
    config = _answer(slurm.config(), "scontrol show config")
    partitions = _answer(slurm.partition(None), "scontrol show partition")
    part = find_partition(partitions, partition)
    # All nodes where a constraint may pick them outside the default partition (pick_partition).
    which = [] if constraint and not partition else [part.get("Nodes", "")]
    nodes = _answer(slurm.nodes(" ".join(which) or None), "scontrol show node")
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    try:
        assoc = slurm.associations(user)
        associations = assoc.stdout if assoc.returncode == 0 and assoc.stdout.strip() else None
    except slurm.NoAnswer:
        associations = None
    try:
        srun_help = slurm.srun_help().stdout
    except slurm.NoAnswer:
        srun_help = ""
    facts = Facts(version.stdout, config, partitions, nodes, associations=associations, venv=_venv(),
                  srun_help=srun_help)
    if probe:
        picked, routed = pick_partition(facts, partition, constraint)
        types = node_types(nodes, picked["PartitionName"], constraint)
        facts.probe = run_probe(None if routed else picked["PartitionName"], account, constraint, types)
    return facts


def probe_script() -> str:
    """templates/node-probe.sh, the node probe of site init and doctor."""
    from hpcyolo.login.render import templates_dir

    return (templates_dir() / "node-probe.sh").read_text()


def run_probe(partition: str | None, account: str | None, constraint: str | None, types: list[NodeType]) -> str:
    """templates/node-probe.sh on one node of the partition (None: where
    Slurm routes the constraint), a one-task step of its own, one GPU where
    the nodes have them; its output."""
    script = probe_script()
    names = [n for t in types for n in t.names]
    gpus = types[0].gpus if types else 0
    wait = int(os.environ.get(PROBE_WAIT_ENV) or PROBE_SECONDS)
    argv = ["--nodes=1", "--ntasks=1", f"--immediate={wait}", "--time=00:02:00",
            "--job-name=hpcyolo-site-init", "--quiet"]
    argv += [f"--{flag}={value}" for flag, value in (("partition", partition), ("account", account),
                                                      ("constraint", constraint)) if value]
    if gpus:
        argv.append("--gres=gpu:1")
    other = names[1] if len(names) > 1 else ""
    try:
        r = slurm.one_task(argv, ["sh", "-c", script, "node-probe", other], timeout=wait + PROBE_SECONDS + 30)
    except slurm.NoAnswer as e:
        raise InitError("srun is not here: run on a login node, or add --no-probe; nothing written" if e.missing else
                        f"the probe step on partition {partition or constraint} got no answer in "
                        f"{wait + PROBE_SECONDS + 30} s "
                        "(the partition is busy?): rerun later, or with --no-probe; nothing written") from None
    if r.returncode != 0 or not r.stdout.startswith("host "):
        raise InitError(f"the probe step on partition {partition or constraint} failed: {_last(r)}; rerun with "
                        "--no-probe to write what the login node can tell; nothing written")
    return r.stdout


def _answer(r, what: str) -> str:
    if r.returncode != 0:
        raise InitError(f"{what} failed: {_last(r)}; nothing written")
    return r.stdout


def _last(r) -> str:
    return ((r.stderr or "").strip().splitlines() or (r.stdout or "").strip().splitlines()
            or [f"exit {r.returncode}"])[-1][:200]


def _venv() -> str | None:
    return sys.prefix if sys.prefix != getattr(sys, "base_prefix", sys.prefix) else None


def configs(facts: Facts, *, partition: str | None = None, account: str | None = None, constraint: str | None = None,
            per_type: bool = False, command: str = "hpcyolo site init",
            warn: list[str] | None = None) -> list[tuple[str, str]]:
    part = pick_partition(facts, partition, constraint)[0]["PartitionName"]
    types = node_types(facts.nodes, part, constraint)
    if per_type and len(types) > 1:
        out = []
        for i, t in enumerate(types, 1):
            note = f"{command} (node type {i} of {len(types)}: {_few(t.names)})"
            values = decide(facts, partition=partition, account=account, constraint=constraint, node_type=t,
                            warn=warn)
            out.append((f"-type{i}", write(values, note)))
        return out
    return [("", write(decide(facts, partition=partition, account=account, constraint=constraint, warn=warn),
                       command))]


def describe_types(facts: Facts, partition: str | None, constraint: str | None) -> str | None:
    """One line naming a partition's node types where it has several."""
    part = pick_partition(facts, partition, constraint)[0]["PartitionName"]
    types = node_types(facts.nodes, part, constraint)
    if len(types) < 2:
        return None
    kinds = "; ".join(f"{len(t.names)} x ({t.gpus} GPU {t.gpu_type or ''} {t.cpus} CPUs {t.memory_mb} MB: "
                      f"{_few(t.names)})".replace("  ", " ") for t in types)
    return f"partition {part} has {len(types)} node types: {kinds}"


def write_files(texts: list[tuple[str, str]], output: str | None, force: bool) -> list[str]:
    """Write each text to OUTPUT (with its suffix before the extension), atomically;
    refuse an existing file without `force`, before anything is written."""
    from hpcyolo_trainer.common.fsutil import write_atomic

    if output is None:
        return []
    base = Path(output)
    paths = [base.with_name(base.stem + suffix + base.suffix) for suffix, _ in texts]
    for path in paths:
        if path.exists() and not force:
            raise InitError(f"{path} exists: give another -o, or --force to replace it; nothing written")
    for path, (_, text) in zip(paths, texts):
        write_atomic(path, text.encode())
    return [str(p) for p in paths]
