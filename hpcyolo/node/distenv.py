"""Map a launcher's environment to torch's standard variables (no torch here).

Whatever started the process, the trainer and any custom entrypoint read only
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
`from_environ` derives them, checks them against the hardware, and
`DistEnv.standard_vars` is what `hpcyolo train` / `hpcyolo exec` export.

Precedence, first match wins (each launcher's variables may be present
together with another's; the reason is why the order is what it is):

====  ==========  ==========================================  ==================================================
 #    launcher    detected by                                 why here
====  ==========  ==========================================  ==================================================
 1    torchrun    TORCHELASTIC_RUN_ID, or RANK, LOCAL_RANK    These describe this very worker. Under `srun`
                  and WORLD_SIZE all set                      with one task per node running torchrun, the
                                                              Slurm variables describe the torchrun agent
                                                              (one per node), not the worker. hpcyolo's
                                                              local launcher sets the same variables.
 2    OpenMPI     OMPI_COMM_WORLD_RANK                        mpirun inside a Slurm allocation: SLURM_* describe
                                                              the allocation (or the step of mpirun's daemons),
                                                              OMPI_COMM_WORLD_* this process.
 3    Slurm       SLURM_PROCID (a job step: srun, one task    The sbatch script's own layout: one task per GPU.
                  per GPU)
 4    PyTorchJob  PET_NODE_RANK, or RANK and WORLD_SIZE       Kubeflow's variables describe the pod (a node):
                  without LOCAL_RANK                          RANK/WORLD_SIZE count pods, PET_* (torchrun's,
                                                              also from Kubeflow Trainer's TrainJob) say the
                                                              same and win. Before the Indexed Job: a TrainJob's
                                                              pods are JobSet pods too, and PET_* are the more
                                                              exact. A worker started in the pod has LOCAL_RANK
                                                              as well: rule 1.
 5    Indexed     JOB_COMPLETION_INDEX (JobSet adds           A pod index and nothing else: the job's size is
      Job/JobSet  JOBSET_NAME, REPLICATED_JOB_NAME)           HPCYOLO_NNODES, the master MASTER_ADDR, else
                                                              JobSet's <jobset>-<replicated job>-0-0.<jobset>.
 6    SageMaker   the resource config file exists             Host-level facts only (one process per host), from
                  (/opt/ml/input/config/resourceconfig.json,  a file that may be baked into an image: anything
                  or the path in HPCYOLO_SM_RESOURCE_CONFIG)  that describes the process itself wins.
 7    none        -                                           One process, rank 0 of 1, on 127.0.0.1.
====  ==========  ==========================================  ==================================================

SageMaker, PyTorchJob and Indexed Jobs start ONE process per host (pod).
`from_environ` then returns a `NodeLayout` (node rank, nodes, master;
processes per node = HPCYOLO_NPROC, else a number in PET_NPROC_PER_NODE, else
the GPUs CUDA_VISIBLE_DEVICES or SM_NUM_GPUS show, else 1 on a CPU host), not a
`DistEnv`: one process per GPU must still be started on each host. `hpcyolo
train`, `val` and `exec` do it themselves, through `hpcyolo.node.local.launch_layout`
(process i of node n gets RANK = n * nproc + i, MASTER_ADDR = the master host,
the rendezvous of all hosts); torchrun can do it too. A child that gets only
LOCAL_RANK (and no RANK/WORLD_SIZE) is mapped the same way by `from_environ`.
With one process per host, the host process is the worker and gets a
`DistEnv`. SageMaker's network_interface_name is exported as
NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME unless one of them is set.

Checks (one clear line, `HpcyoloError`): rank and local rank in range; more
processes on a node than CUDA_VISIBLE_DEVICES shows GPUs (when it shows more
than one: one GPU per task, from --gpus-per-task, is the cuda:0 case); and a
master address that is, or resolves to, localhost (localhost, 127.0.0.1, ::1,
Debian's hostname alias 127.0.1.1) when the job spans several nodes. Other
127.x addresses stay valid: the Slurm testbed's nodes live on 127.0.0.11/12.

Master address: the first host of the allocation. When the site names an
interface (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME), the master host itself
uses that interface's IPv4 address instead of its own name, so the rendezvous
listens and connects on the fast network rather than on whatever the hostname
resolves to there (often 127.0.1.1, or the slow management network). See
`resolve_master`. OpenMPI has no notion of a first host: MASTER_ADDR must be
given for more than one node.

torchrun's MASTER_ADDR and MASTER_PORT name its own store: kept as they are.

Port: HPCYOLO_MASTER_PORT, else MASTER_PORT (PyTorchJob: the master
service's port), else PET_MASTER_PORT, else derived from SLURM_JOB_ID over
15000 ports, else from the MPI, SageMaker or JobSet job name (JOB_NAME_VARS). SLURM_JOB_ID is
unique for every job, each array task included (an array task's
SLURM_ARRAY_JOB_ID + SLURM_ARRAY_TASK_ID, used before, equals a later plain
job's id), so two jobs on a node share a port only when their ids differ by
a multiple of 15000. Should ports meet anyway, the rendezvous is keyed by the
job (HPCYOLO_JOB, see `job_identity` and hpcyolo_trainer.common.rendezvous): ranks refuse
another job's store with one line, and a port taken at init is reported with
`port_in_use_message`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zlib
from dataclasses import replace
from typing import Mapping

from hpcyolo_trainer.common.devices import check_gpus, env_int, short_hostname, visible_gpus
from hpcyolo_trainer.common.errors import HpcyoloError, shown
from hpcyolo_trainer.common.record import record
from hpcyolo_trainer.common.rendezvous import JOB_ENV, PORT_BASE, PORT_SPAN

from hpcyolo.node.netif import resolve_master, site_interface

SAGEMAKER_RESOURCE_CONFIG = "/opt/ml/input/config/resourceconfig.json"
SAGEMAKER_CONFIG_ENV = "HPCYOLO_SM_RESOURCE_CONFIG"  # another path for it (tests, a SageMaker-like platform)
# Names every process of one job shares, outside Slurm: its port and identity derive from them.
JOB_NAME_VARS = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "TRAINING_JOB_NAME", "JOBSET_NAME")
# Exact addresses only: 127.0.0.11 and 127.0.0.12 (the Slurm testbed's nodes) must stay valid.
LOCALHOST = frozenset({"localhost", "127.0.0.1", "::1", "127.0.1.1"})


@record
class DistEnv:
    """One process's place in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    source: str  # which launcher the values came from
    job: str | None = None  # the job's identity, shared by all its ranks and by no other job
    interface: str | None = None  # the network interface the launcher names (SageMaker), exported for NCCL/gloo

    def standard_vars(self) -> dict[str, str]:
        values = {
            "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank), "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
        }
        if self.job:
            values[JOB_ENV] = self.job
        if self.interface:
            values.update(NCCL_SOCKET_IFNAME=self.interface, GLOO_SOCKET_IFNAME=self.interface)
        return values


@record
class NodeLayout:
    """One host's place in a job whose launcher starts one process per host
    (SageMaker, a Kubernetes pod); hpcyolo's local launcher starts
    `nproc_per_node` processes from it (`hpcyolo.node.local.launch_layout`)."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    host: str
    source: str = "sagemaker"
    job: str | None = None
    interface: str | None = None

    def dist_env(self, local_rank: int) -> DistEnv:
        """The layout of the process with this local rank on this host."""
        n = self.nproc_per_node
        return DistEnv(rank=self.node_rank * n + local_rank, local_rank=local_rank, world_size=self.nnodes * n,
                       local_world_size=n, node_rank=self.node_rank, nnodes=self.nnodes,
                       master_addr=self.master_addr, master_port=self.master_port, source=self.source,
                       job=self.job, interface=self.interface)

    def standard_vars(self) -> dict[str, str]:
        # A host process is no rank: training in it would silently use one GPU of several.
        raise HpcyoloError(
            f"{self.source} starts one process per host, but {self.host} needs {self.nproc_per_node} (one per GPU): "
            f"run hpcyolo train or hpcyolo exec (they start them), or torchrun --nnodes={self.nnodes} "
            f"--node-rank={self.node_rank} "
            f"--nproc-per-node={self.nproc_per_node} --master-addr={self.master_addr} "
            f"--master-port={self.master_port}")


def default_port(job_id: int) -> int:
    """The port the sbatch script derives from SLURM_JOB_ID (with these
    constants, through the plan): consecutive jobs, array tasks among them,
    get distinct ports."""
    return PORT_BASE + job_id % PORT_SPAN


def job_identity(env: Mapping[str, str]) -> str | None:
    """A name every process of this job shares and no other job has: what
    hpcyolo's launcher set, else the Slurm job id (unique for each array
    task too), else the MPI or SageMaker job's name. None: unknown, and the
    rendezvous is not checked."""
    if env.get(JOB_ENV):
        return env[JOB_ENV]
    if env.get("SLURM_JOB_ID"):
        return f"slurm job {env['SLURM_JOB_ID']}"
    for name in JOB_NAME_VARS:
        if env.get(name):
            return f"{name} {env[name]}"
    return None


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list to names: 'gpu[01-03,07],login1' ->
    gpu01 gpu02 gpu03 gpu07 login1 (what `scontrol show hostnames` prints)."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", hostlist):
        prefix, ranges, suffix = m.groups()
        if not ranges:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{i:0{len(lo)}d}{suffix}")
    return hosts


# ---- the launchers ----

def from_environ(env: Mapping[str, str], *, sagemaker_config: str | os.PathLike | None = None) -> DistEnv | NodeLayout:
    """This process's layout, from the first launcher whose variables are
    present (see the module docstring); a `NodeLayout` for a host process
    (SageMaker, a Kubernetes pod) that must start several workers. Raises
    HpcyoloError when the values disagree with each other or with the
    hardware. `sagemaker_config`: the resource config's path (default
    HPCYOLO_SM_RESOURCE_CONFIG, else SAGEMAKER_RESOURCE_CONFIG)."""
    sagemaker_config = sagemaker_config or env.get(SAGEMAKER_CONFIG_ENV) or SAGEMAKER_RESOURCE_CONFIG
    job = job_identity(env)
    if "TORCHELASTIC_RUN_ID" in env or all(k in env for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return _checked(replace(_from_torchrun(env), job=job), env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return _checked(replace(_from_openmpi(env), job=job), env)
    if "SLURM_PROCID" in env:
        return _checked(replace(_from_slurm(env), job=job), env)
    if "PET_NODE_RANK" in env or all(k in env for k in ("RANK", "WORLD_SIZE")):
        return _host_or_worker(replace(_from_pytorchjob(env), job=job), env)
    if "JOB_COMPLETION_INDEX" in env:
        return _host_or_worker(replace(_from_indexed_job(env), job=job), env)
    if os.path.exists(sagemaker_config):
        return _host_or_worker(replace(sagemaker_layout(env, sagemaker_config), job=job), env)
    return DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, nnodes=1,
                   master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=_port(env), source="single process",
                   job=job)


def _host_or_worker(layout: NodeLayout, env: Mapping[str, str]) -> DistEnv | NodeLayout:
    """A process of a launcher that starts one per host: the worker itself
    when the host runs one process (or when it got a LOCAL_RANK, from a
    launcher that set nothing else), else the layout to start them from."""
    if "LOCAL_RANK" in env:
        return _checked(layout.dist_env(env_int(env, "LOCAL_RANK")), env)
    return _checked(layout.dist_env(0), env) if layout.nproc_per_node == 1 else layout


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    # torchrun always sets LOCAL_WORLD_SIZE and GROUP_WORLD_SIZE (the number of
    # agents, i.e. nodes); a hand-made RANK/LOCAL_RANK/WORLD_SIZE is one node.
    world = env_int(env, "WORLD_SIZE")
    nnodes = env_int(env, "GROUP_WORLD_SIZE") if "GROUP_WORLD_SIZE" in env else None
    local_world = env_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world // (nnodes or 1)
    nnodes = nnodes or -(-world // max(local_world, 1))
    rank = env_int(env, "RANK")
    node_rank = next((env_int(env, k) for k in ("GROUP_RANK", "NODE_RANK") if k in env), rank // max(local_world, 1))
    # torchrun's MASTER_PORT is its store's: never replace it.
    port = _port_value(env, "MASTER_PORT") if "MASTER_PORT" in env else _port(env)
    return DistEnv(rank=rank, local_rank=env_int(env, "LOCAL_RANK"), world_size=world, local_world_size=local_world,
                   node_rank=node_rank, nnodes=nnodes, master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                   master_port=port, source="torchrun")


def _from_openmpi(env: Mapping[str, str]) -> DistEnv:
    size, local_size = env_int(env, "OMPI_COMM_WORLD_SIZE"), env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    rank = env_int(env, "OMPI_COMM_WORLD_RANK")
    if local_size < size and not env.get("MASTER_ADDR"):
        raise HpcyoloError(f"environment: OpenMPI runs {size} ranks, {local_size} on this node: set MASTER_ADDR to the "
                           f"host of rank 0 (mpirun -x MASTER_ADDR=<first host>)")
    master = env.get("MASTER_ADDR") or "127.0.0.1"
    # OMPI_COMM_WORLD_NODE_RANK is not the node's index (it is the local rank
    # counted across all jobs on the node, see Open MPI's "Environment variables
    # set for MPI applications"); with mpirun's default by-slot mapping a
    # node's ranks are consecutive, so the node index is rank // local size.
    return DistEnv(rank=rank, local_rank=env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), world_size=size,
                   local_world_size=local_size, node_rank=rank // max(local_size, 1),
                   nnodes=-(-size // max(local_size, 1)), master_addr=resolve_master(master, site_interface(env)),
                   master_port=_port(env), source="openmpi")


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    # The step's values first: a step may use fewer tasks and nodes than the job.
    ntasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    hosts = expand_hostlist(nodelist)
    nnodes_var = next((k for k in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES") if k in env), None)
    node_id = env_int(env, "SLURM_NODEID")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
    master = env.get("MASTER_ADDR") or (hosts or ["127.0.0.1"])[0]
    return DistEnv(rank=env_int(env, "SLURM_PROCID"), local_rank=env_int(env, "SLURM_LOCALID"),
                   world_size=env_int(env, ntasks), local_world_size=_tasks_on_node(per_node, node_id),
                   node_rank=node_id, nnodes=env_int(env, nnodes_var) if nnodes_var else max(len(hosts), 1),
                   master_addr=resolve_master(master, site_interface(env)), master_port=_port(env), source="slurm")


def _tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """SLURM_TASKS_PER_NODE is '2(x3),1': 2 tasks on each of 3 nodes, then 1."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise HpcyoloError(f"environment: cannot read SLURM_TASKS_PER_NODE={shown(tasks_per_node)}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_id] if node_id < len(counts) else counts[-1]


def sagemaker_layout(env: Mapping[str, str], path: str | os.PathLike) -> NodeLayout:
    """This host's layout from SageMaker's resource config
    ({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"],
    "network_interface_name": "eth0"}). The interface is exported as
    NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME unless the environment names one."""
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        host, hosts = config["current_host"], list(config["hosts"])
        interface = config.get("network_interface_name")
    except OSError as e:
        raise HpcyoloError(f"{path}: cannot read: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise HpcyoloError(f"{path}: not a SageMaker resource config with current_host and hosts ({e})") from None
    if host not in hosts:
        raise HpcyoloError(f"{path}: current_host {shown(host)} is not one of hosts {shown(hosts)}")
    return _host_layout(env, node_rank=hosts.index(host), nnodes=len(hosts), master=hosts[0], host=host,
                        source="sagemaker", interface=None if site_interface(env) else interface)


def _from_pytorchjob(env: Mapping[str, str]) -> NodeLayout:
    """Kubeflow's PyTorchJob: each pod gets RANK and WORLD_SIZE counting
    pods (master pod 0, worker i is i+1) and MASTER_ADDR/MASTER_PORT naming
    the master pod's service (training-operator v1, pytorch/envvar.go). With
    nprocPerNode, and under Kubeflow Trainer's TrainJob, torchrun's PET_NNODES,
    PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and PET_MASTER_PORT say
    the same per node, and win: WORLD_SIZE may then count processes."""
    node_rank = env_int(env, "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK")
    nnodes_var = "PET_NNODES" if "PET_NNODES" in env else "WORLD_SIZE"
    if ":" in env.get(nnodes_var, ""):
        raise HpcyoloError(f"environment: {nnodes_var}={shown(env[nnodes_var])} is an elastic range; hpcyolo runs "
                           f"a fixed number of nodes (run it under torchrun for elastic training)")
    nnodes = env_int(env, nnodes_var)
    master = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    if not master and nnodes > 1:
        raise HpcyoloError("environment: PyTorchJob sets RANK and WORLD_SIZE but no MASTER_ADDR (or PET_MASTER_ADDR): "
                           "give the master pod's address")
    return _host_layout(env, node_rank=node_rank, nnodes=nnodes, master=master or "127.0.0.1",
                        host=short_hostname(), source="pytorchjob")


def _from_indexed_job(env: Mapping[str, str]) -> NodeLayout:
    """A Kubernetes Indexed Job, or a JobSet's: JOB_COMPLETION_INDEX is the
    pod's node rank. Kubernetes does not tell a pod how many there are
    (spec.completions): HPCYOLO_NNODES does. The master is pod 0: MASTER_ADDR,
    else under JobSet its DNS name <jobset>-<replicated job>-0-0.<jobset>
    (JobSet's default subdomain, the headless service it creates)."""
    if env.get("JOB_INDEX", "0") != "0":
        raise HpcyoloError(f"environment: JOB_INDEX={shown(env['JOB_INDEX'])}: a JobSet's replicated job must have "
                           f"replicas: 1 (one Indexed Job, parallelism = nodes)")
    if "HPCYOLO_NNODES" not in env:
        raise HpcyoloError("environment: JOB_COMPLETION_INDEX is set (an Indexed Job) but HPCYOLO_NNODES is not: set "
                           "it to the job's completions (= parallelism), the number of pods")
    nnodes = env_int(env, "HPCYOLO_NNODES")
    jobset = env.get("JOBSET_NAME")
    master = env.get("MASTER_ADDR") or (
        f"{jobset}-{env.get('REPLICATED_JOB_NAME', '')}-0-0.{jobset}" if jobset and env.get("REPLICATED_JOB_NAME")
        else None)
    if not master and nnodes > 1:
        raise HpcyoloError("environment: an Indexed Job of several pods needs MASTER_ADDR: pod 0's name "
                           "<job>-0.<headless service>")
    return _host_layout(env, node_rank=env_int(env, "JOB_COMPLETION_INDEX"), nnodes=nnodes,
                        master=master or "127.0.0.1", host=short_hostname(),
                        source="jobset" if jobset else "indexed job")


def _host_layout(env: Mapping[str, str], *, node_rank: int, nnodes: int, master: str, host: str, source: str,
                 interface: str | None = None) -> NodeLayout:
    """The layout of one host of a launcher that starts one process per host."""
    if not 0 <= node_rank < nnodes:
        raise HpcyoloError(f"{host}: node rank {node_rank} is not below the {nnodes} nodes (from {source})")
    nproc = _procs_per_host(env)
    check_gpus(nproc, env, host)
    return NodeLayout(node_rank=node_rank, nnodes=nnodes, nproc_per_node=nproc,
                      master_addr=resolve_master(master, site_interface(env) or interface, hostname=host),
                      master_port=_port(env), host=host, source=source, interface=interface)


def _procs_per_host(env: Mapping[str, str]) -> int:
    """HPCYOLO_NPROC, else a number in PET_NPROC_PER_NODE (Kubeflow), else
    one per visible GPU, else one (a CPU host: one process uses all cores;
    SM_NUM_CPUS counts cores, not processes)."""
    name = "HPCYOLO_NPROC" if "HPCYOLO_NPROC" in env else "PET_NPROC_PER_NODE"
    # PET_NPROC_PER_NODE may be torchrun's auto/gpu/cpu: then the GPUs decide.
    if name == "HPCYOLO_NPROC" or env.get(name, "").strip().isdigit():
        n = env_int(env, name)
        if n < 1:
            raise HpcyoloError(f"environment: {name}={n} must be at least 1")
        return n
    gpus = visible_gpus(env)
    if gpus is None and "SM_NUM_GPUS" in env:
        gpus = env_int(env, "SM_NUM_GPUS")
    return max(gpus or 1, 1)


def _port(env: Mapping[str, str]) -> int:
    for name in ("HPCYOLO_MASTER_PORT", "MASTER_PORT", "PET_MASTER_PORT"):
        if env.get(name):
            return _port_value(env, name)
    if "SLURM_JOB_ID" in env:
        return default_port(env_int(env, "SLURM_JOB_ID"))
    # Outside Slurm: a name every process of the job shares (crc32: Python's
    # hash() differs between processes).
    for name in JOB_NAME_VARS:
        if env.get(name):
            return PORT_BASE + zlib.crc32(env[name].encode()) % PORT_SPAN
    return PORT_BASE


def _port_value(env: Mapping[str, str], name: str) -> int:
    port = env_int(env, name)
    if not 1 <= port <= 65535:
        raise HpcyoloError(f"environment: {name}={port} is not a TCP port (1-65535)")
    return port


# ---- checks against each other and the hardware ----

def _checked(d: DistEnv, env: Mapping[str, str]) -> DistEnv:
    host = short_hostname()
    if not 0 <= d.rank < d.world_size:
        raise HpcyoloError(f"{host}: rank {d.rank} is not below the world size {d.world_size} (from {d.source})")
    if not 0 <= d.local_rank < d.local_world_size:
        raise HpcyoloError(f"{host}: local rank {d.local_rank} is not below the {d.local_world_size} processes on "
                           f"this node (from {d.source})")
    check_gpus(d.local_world_size, env, host)
    check_master(d.master_addr, d.nnodes)
    return d


def check_master(addr: str, nnodes: int) -> None:
    """A master on localhost cannot be reached from the other nodes: refuse
    it, and a name that resolves to it, when the job spans several nodes. A
    name that does not resolve is a warning: DNS can fail for a moment at job
    start, and torch's store client keeps retrying the lookup."""
    import socket  # here: `hpcyolo render` imports this module for the port's constants only

    if nnodes <= 1:
        return
    hint = (f"but the job spans {nnodes} nodes; set MASTER_ADDR (or the site's network.interface) to an address "
            f"the other nodes reach")
    if addr.strip("[]").lower() in LOCALHOST:
        raise HpcyoloError(f"MASTER_ADDR={addr} is localhost {hint}")
    try:
        found = {info[4][0] for info in socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError) as e:
        print(f"hpcyolo: warning: cannot resolve MASTER_ADDR={addr} on {short_hostname()} "
              f"({getattr(e, 'strerror', None) or e}); the rendezvous will fail unless it resolves",
              file=sys.stderr, flush=True)
        return
    loopback = sorted(found & LOCALHOST)
    if loopback:
        raise HpcyoloError(f"MASTER_ADDR={addr} resolves to localhost ({loopback[0]}) {hint}")
