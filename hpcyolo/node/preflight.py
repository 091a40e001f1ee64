"""`hpcyolo doctor --in-job`: the preflight step, on every task of the job,
before training (the batch script runs it when the job spec says
`preflight: true`).

On each task: the site's interface exists and has an address; the master
host resolves; its port accepts a TCP connection (rank 0 listens on
MASTER_PORT, every other rank connects and says who it is); node-local
scratch has room for the dataset. Then all tasks all-reduce a buffer over the
job's backend (NCCL on GPUs, Gloo otherwise) and rank 0 prints the bus
bandwidth. A task whose check fails prints it, with the fix, and exits 1, so
srun ends the step and the job fails before it spends its allocation.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass

from hpcyolo_trainer.common.errors import HpcyoloError

from hpcyolo.node.distenv import from_environ
from hpcyolo.node.netif import interface_ipv4

CONNECT_TIMEOUT = 60.0


@dataclass
class Check:
    name: str
    status: str  # PASS | WARN | FAIL | SKIP (only FAIL fails the doctor)
    detail: str
    fix: str = ""


def check_interface(name: str | None, host: str) -> Check:
    if not name:
        return Check("interface", "SKIP", "the site names no interface")
    if name not in [n for _, n in socket.if_nameindex()]:
        return Check("interface", "FAIL", f"{name} does not exist on {host}",
                     f"run `ip -br addr` on {host} and set network.interface to the fast one")
    try:
        address, _ = interface_ipv4(name)
    except HpcyoloError:
        return Check("interface", "FAIL", f"{name} has no IPv4 address on {host}",
                     "choose an interface that is up and configured (network.interface)")
    return Check("interface", "PASS", f"{name} {address} on {host}")


def check_resolves(master: str, port: int) -> Check:
    try:
        found = socket.getaddrinfo(master, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return Check("master host", "FAIL", f"{master} does not resolve: {e.strerror}",
                     "check network.master_suffix and the node names (scontrol show hostnames)")
    return Check("master host", "PASS", f"{master} is {found[0][4][0]}")


def check_port(rank: int, world: int, master: str, port: int, host: str) -> Check:
    """Rank 0 listens; every other rank connects within CONNECT_TIMEOUT."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    if rank == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("", port))
            server.listen(max(world, 8))
        except OSError as e:
            server.close()
            return Check("master port", "FAIL", f"rank 0 on {host} cannot listen on port {port}: {e.strerror}",
                         "another process holds it: set HPCYOLO_MASTER_PORT to a free port")
        seen = set()
        try:
            while len(seen) < world - 1:
                server.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    missing = sorted(set(range(1, world)) - seen)
                    return Check("master port", "FAIL", f"ranks {missing} never reached {master}:{port} in "
                                 f"{CONNECT_TIMEOUT:.0f} s", "a firewall or the wrong interface between the nodes: "
                                 "check network.interface and that the port range is open")
                with conn:
                    conn.settimeout(5)
                    seen.add(int(conn.recv(16).decode() or -1))
        finally:
            server.close()
        return Check("master port", "PASS", f"{master}:{port} reached by all {world - 1} other rank(s)")
    error = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((master, port), timeout=5) as conn:
                conn.sendall(str(rank).encode())
            return Check("master port", "PASS", f"{master}:{port} reached from {host}")
        except OSError as e:
            error = e.strerror or str(e)
            time.sleep(0.5)
    return Check("master port", "FAIL", f"rank {rank} on {host} cannot reach {master}:{port}: {error}",
                 "a firewall or the wrong interface between the nodes: check network.interface, "
                 "network.master_suffix, and that rank 0 could listen (its own line)")


def check_room(scratch: str | None, data: str | None) -> Check:
    if not scratch or not data:
        return Check("scratch room", "SKIP", "no staging")

    from hpcyolo_trainer.common.datayaml import data_root

    from hpcyolo.node.stage import walk

    os.makedirs(scratch, exist_ok=True)
    free = shutil.disk_usage(scratch).free
    need = walk(data_root(data)).nbytes
    if need > free:
        return Check("scratch room", "FAIL", f"{scratch} has {free / 2**30:.2f} GiB free, the dataset needs "
                     f"{need / 2**30:.2f} GiB", "choose a larger node-local storage.scratch, or data.stage: false")
    return Check("scratch room", "PASS", f"{free / 2**30:.1f} GiB free in {scratch}, the dataset needs "
                 f"{need / 2**30:.2f} GiB")


def check_gpus(local_world: int, gpus_per_task: int = 1) -> Check:
    """Visible GPUs against the tasks of this node (CUDA_VISIBLE_DEVICES as
    Slurm sets it: the node's GPUs, or this task's own)."""
    from hpcyolo.node.distenv import visible_gpus

    seen = visible_gpus(os.environ)
    if seen is None:
        return Check("gpus", "SKIP", "CUDA_VISIBLE_DEVICES is not set (a CPU site)")
    if seen not in (1, local_world):
        return Check("gpus", "FAIL", f"{seen} GPU(s) visible to a node with {local_world} task(s)",
                     "ask one GPU per task in the site's style (slurm.gpu_request) and node.gpus = the node's GPUs")
    return Check("gpus", "PASS", f"{seen} GPU(s) visible for {local_world} task(s) on this node")


def _timed_gemm(device, n: int, repeats: int = 7) -> float:
    """Seconds per n x n matmul on `device`: the median of `repeats` timed
    products after a warm-up (one preempted product does not decide)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    return sorted(seconds)[repeats // 2]


def slow_ranks(times: list[tuple[str, int, float]], cuda: bool) -> tuple[str, bool]:
    """The GEMM report from every rank's (host, rank, seconds), and whether it
    passes. A rank over twice the median is named. On GPUs that fails the
    preflight (a throttled or broken GPU holds every rank back); CPU ranks of
    one host share its cores, so a spread there is the host's load: named,
    not failed."""
    median = sorted(t for _, _, t in times)[len(times) // 2]
    slow = [(h, r, t) for h, r, t in times if t > 2 * median]
    n = 8192 if cuda else 512
    line = (f"gemm {n}x{n}: median {median * 1e3:.1f} ms per rank"
            + "".join(f"; SLOW rank {r} on {h}: {t * 1e3:.1f} ms" for h, r, t in slow))
    if slow and not cuda:
        line += " (CPU ranks share their host's cores: not counted as a failure)"
    return line, not (slow and cuda)


def collective_checks(host: str, mib: int = 64, repeats: int = 5) -> tuple[list[str], bool]:
    """All ranks: a GEMM each (8192 on a GPU, 512 on CPU: a slow or broken
    device shows), an all-reduce of `mib` MiB, and the per-rank GEMM times
    gathered, so rank 0 names any host much slower than the others. Returns
    rank 0's report lines and whether all went well."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=CONNECT_TIMEOUT))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        dist.barrier()  # every rank times its GEMM at once, none while others still start up
        gemm = _timed_gemm(device, 8192 if cuda else 512)
        x = torch.ones(mib * 2**20 // 4, device=device)
        dist.all_reduce(x)  # warm-up: connections, buffers
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / repeats
        times: list = [None] * world
        dist.all_gather_object(times, (host, rank, gemm))
    finally:
        dist.destroy_process_group()
    ok = x[0].item() == world ** (repeats + 1)
    # nccl-tests' bus bandwidth: what each link carries in a ring all-reduce.
    busbw = x.numel() * 4 * 2 * (world - 1) / world / seconds / 1e9
    lines = [f"all_reduce bus bandwidth {busbw:.2f} GB/s ({backend}, {world} ranks, {mib} MiB)"
             + ("" if ok else "; WRONG RESULT")]
    gemm_line, gemm_ok = slow_ranks(times, cuda)
    lines.append(gemm_line)
    return (lines if rank == 0 else []), ok and gemm_ok


def preflight(interface: str | None, scratch: str | None, data: str | None) -> int:
    env = from_environ(os.environ)
    values = env.standard_vars()
    os.environ.update(values)
    rank, world = int(values["RANK"]), int(values["WORLD_SIZE"])
    master, port = values["MASTER_ADDR"], int(values["MASTER_PORT"])
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    checks = [check_interface(interface, host), check_resolves(master, port)]
    if int(values["LOCAL_RANK"]) == 0:
        checks.append(check_room(scratch, data))
    checks.append(check_port(rank, world, master, port, host))
    checks.append(check_gpus(int(values["LOCAL_WORLD_SIZE"])))
    failed = [c for c in checks if c.status == "FAIL"]
    for c in checks:
        if c.status == "FAIL" or rank == 0:
            print(f"preflight rank {rank} ({host}): {c.status:4}  {c.name:12} {c.detail}", flush=True)
            if c.fix:
                print(f"preflight rank {rank} ({host}):       fix: {c.fix}", flush=True)
    if failed:
        return 1
    lines, ok = collective_checks(host)
    for line in lines:
        print(f"preflight: {line}", flush=True)
    if rank == 0 and ok:
        print("preflight: all checks passed on every task", flush=True)
    return 0 if ok else 1
