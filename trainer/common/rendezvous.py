"""The process group's rendezvous, keyed by the job, so that two jobs never meet.

Two jobs on one node that end up with the same MASTER_PORT (a derived port
that coincides, a port chosen by hand) used to meet: one job's rank 0 failed
with "address already in use" while its other ranks connected to the other
job's store and joined that job's process group. Here rank 0 hosts the store
and writes the job's identity into it (HPCYOLO_JOB, set by hpcyolo's env layer
from SLURM_JOB_ID, or by the local launcher); every other rank reads it back
before joining and refuses a store of another job with one line. The process
group's own keys live under a prefix made of that identity as well.

Under torchrun (TORCHELASTIC_RUN_ID) the workers' store is torchrun's, keyed
by its --rdzv-id: the default env:// rendezvous is used as it is.

Rank 0 listens on MASTER_PORT before torch loads (`listen_early`, from
`hpcyolo train`), and its store takes that socket over. A rank whose connect
is refused, because rank 0 is still importing torch, has torch's store
client back off (half a second, then longer) and every rank waits for that
retry: with rank 0 1.5 s later than the other three, rank 0 waited 0.93 s
for the group after making its store, and 0.010 s with the early socket
(the kernel queues the connects until the store accepts them;
benchmarks/bench_rendezvous.py, 2 cores, medians of 5).
"""

from __future__ import annotations

import datetime
import errno
import os

from .errors import HpcyoloError

OWNER_KEY = "hpcyolo/job"
JOB_ENV = "HPCYOLO_JOB"  # the job's identity, checked here (hpcyolo.node.distenv and hpcyolo.node.local set it)
# The rendezvous port a job derives from its id, PORT_BASE + id % PORT_SPAN (hpcyolo.node.distenv.default_port;
# the batch script, through the plan): below Linux's ephemeral range (32768-60999).
PORT_BASE, PORT_SPAN = 15000, 15000


def port_in_use_message(host: str, port: int | str) -> str:
    """What to say when rank 0 cannot listen on the rendezvous port."""
    return (f"MASTER_PORT {port} on {host} is already in use (another job or launcher on that node?); "
            f"set HPCYOLO_MASTER_PORT to a free port or resubmit")


# Rank 0's socket on MASTER_PORT, listening since before torch's import (listen_early); its store takes it over.
_listener = None  # a socket.socket


def keyed_by_job(env) -> bool:
    """Whether the rendezvous is hpcyolo's own store, keyed by the job (else torchrun's, or env://)."""
    return bool(env.get(JOB_ENV)) and "TORCHELASTIC_RUN_ID" not in env


def listen_early(env=os.environ) -> None:
    """Rank 0 of several, with hpcyolo's store: listen on MASTER_PORT now, on
    every interface as torch's store does, so that the other ranks' connects
    wait in the kernel's queue instead of backing off (see the module's doc).
    A port in use is the one-line error the store's own failure gives."""
    global _listener
    if _listener is not None or not keyed_by_job(env) or env.get("RANK") != "0" \
            or int(env.get("WORLD_SIZE", "1")) < 2:
        return
    port = int(env.get("MASTER_PORT") or 0)
    if not port:
        return
    try:
        _listener = _listening_socket(port)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise HpcyoloError(port_in_use_message(env.get("MASTER_ADDR", "127.0.0.1"), port)) from None
        # Anything else: the store tries itself, and says what fails.


def _listening_socket(port: int):
    """A socket listening on `port` of every interface: IPv6 and IPv4 where
    the host has IPv6, else IPv4 (as torch's store binds)."""
    import socket  # here, as below: `hpcyolo render` imports this module

    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, port))
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE or family == socket.AF_INET:
                raise
    raise OSError(errno.EAFNOSUPPORT, "no IPv4 or IPv6 socket")


def _take_listener(port: int) -> int | None:
    """The early socket's descriptor, handed over (its owner is then the store), where it is on `port`."""
    global _listener
    if _listener is None or _listener.getsockname()[1] != port:
        return None
    fd, _listener = _listener.detach(), None
    return fd


def init_process_group(backend: str, timeout_s: int, device_id=None) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    job = os.environ.get(JOB_ENV)
    if not keyed_by_job(os.environ):
        try:
            dist.init_process_group(backend, timeout=timeout, device_id=device_id)
        except RuntimeError as e:  # torch.distributed.DistNetworkError is a RuntimeError
            _raise_if_port_taken(e)
            raise
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = job_store(job, rank, world, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout,
                            device_id=device_id)


def job_store(job: str, rank: int, world: int, timeout: datetime.timedelta):
    """The store at MASTER_ADDR:MASTER_PORT, checked to belong to `job`; a
    store whose keys are all under that job's prefix."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
    try:
        store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False,
                              master_listen_fd=_take_listener(port) if rank == 0 else None)
    except RuntimeError as e:
        _raise_if_port_taken(e)
        raise
    if rank == 0:
        store.set(OWNER_KEY, job)
    else:
        owner = store.get(OWNER_KEY).decode(errors="replace")  # waits for rank 0 to write it
        if owner != job:
            import socket  # here: `hpcyolo render` imports this module (JOB_ENV) and needs no socket

            raise HpcyoloError(
                f"rank {rank} on {socket.gethostname()}: {host}:{port} is the rendezvous of {owner}, not of this "
                f"job ({job}): two jobs got the same MASTER_PORT, and this rank will not join another job's "
                f"process group; set HPCYOLO_MASTER_PORT to a free port, or resubmit")
    return dist.PrefixStore(f"hpcyolo/{job}/", store)


def _raise_if_port_taken(e: RuntimeError) -> None:
    """Rank 0 failing to listen on MASTER_PORT becomes one line naming host and port."""
    text = str(e)
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        raise HpcyoloError(port_in_use_message(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                                               os.environ.get("MASTER_PORT", "?"))) from None


def side_store(seconds: float):
    """A second client of the rendezvous store, for a thread beside the
    training loop (the watchdog): its keys under this job start's own
    prefix, each operation given up after `seconds` (a stopped rank 0
    cannot answer: its process hosts the store)."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
    job = os.environ.get(JOB_ENV) or os.environ.get("TORCHELASTIC_RUN_ID", "local")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", os.environ.get("SLURM_RESTART_COUNT", "0"))
    store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=seconds),
                          wait_for_workers=False)
    return dist.PrefixStore(f"hpcyolo/{job}/watchdog/{restart}/", store)
