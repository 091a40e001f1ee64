"""Loader workers that inherit no other thread's state (parallel/workers.py).

The hazard: on CPython before 3.12 (3.11.8) a child forked while another
thread holds the runtime's thread-state lock (HEAD_LOCK, as gloo's threads
do around each collective) waits for good before it runs a line
(gh-112275). Here a thread holds that lock while a DataLoader starts its
workers: forked from the process, they hang (on the affected versions);
forked from the workers' server, they answer. Only this test reads the
interpreter's memory (to take the lock); the trainer does not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from hpcyolo_trainer.common.settings import SIGNALS

AFFECTED = sys.implementation.name == "cpython" and sys.platform.startswith("linux") and (
    sys.version_info < (3, 11, 8) if sys.version_info[:2] == (3, 11) else sys.version_info < (3, 11))

# Run in a fresh interpreter (the server is started once per process). A
# thread takes HEAD_LOCK through ctypes (the GIL released: _PyRuntime's
# interpreters.mutex, 32 bytes in on CPython 3.8 to 3.11) and holds it for
# 1.5 s; meanwhile a worker process is started in the loaders' context (a
# DataLoader's worker is such a process; the DataLoader itself would start
# its queue's feeder thread here, which waits for the same lock with the GIL
# held, and the holder could never return). The worker exits with 7 at once;
# prints its exit code after 5 s (None: it never ran) and its parent.
SCENARIO = r"""
import ctypes, json, os, sys, threading, time
import multiprocessing
from hpcyolo_trainer.parallel import workers

if sys.argv[1] == "server":
    workers.start()
context = workers.context() or multiprocessing.get_context("fork")
libc = ctypes.CDLL(None)
runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
lock = ctypes.c_void_p.from_address(runtime + 32).value
held = threading.Event()
def hold():
    libc.PyThread_acquire_lock(ctypes.c_void_p(lock), 1)
    held.set()
    libc.usleep(1500000)
    libc.PyThread_release_lock(ctypes.c_void_p(lock))
holder = threading.Thread(target=hold, daemon=True)
holder.start()
held.wait()
worker = context.Process(target=os._exit, args=(7,), daemon=True)
worker.start()
parent = int(open(f"/proc/{worker.pid}/status").read().split("PPid:")[1].split()[0])
worker.join(5)
print(json.dumps({"exit": worker.exitcode, "parent": parent, "server": workers.server_pid(), "me": os.getpid()}),
      flush=True)
if worker.exitcode is None:
    worker.kill()
holder.join()  # the lock let go: an interpreter ending while a thread holds it waits for good
"""

# The loaders' own path: a DataLoader in the run's context takes its items from workers the server forked.
LOADER = r"""
import json, os
import torch
from torch.utils.data import DataLoader, TensorDataset
from hpcyolo_trainer.parallel import workers

workers.start()
loader = DataLoader(TensorDataset(torch.arange(6)), batch_size=None, num_workers=2,
                    multiprocessing_context=workers.context(), timeout=60)
batches = iter(loader)
parents = {int(open(f"/proc/{w.pid}/status").read().split("PPid:")[1].split()[0]) for w in batches._workers}
print(json.dumps({"items": [item.item() for (item,) in batches], "parents": sorted(parents),
                  "server": workers.server_pid(), "me": os.getpid()}))
"""


def run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_worker_forked_by_the_server_runs_while_another_thread_holds_the_runtime_lock():
    result = run(SCENARIO, "server")
    assert result["exit"] == 7 and result["parent"] == result["server"] != result["me"], result


@pytest.mark.skipif(not AFFECTED, reason="this CPython resets the lock in a forked child (3.11.8+, 3.12+)")
def test_a_worker_forked_by_the_process_hangs_there_which_is_what_the_server_prevents():
    """The hazard itself, on this interpreter (3.11.7 in CI): the same worker forked from the process
    never runs a line while the lock is held."""
    result = run(SCENARIO, "fork")
    assert result["exit"] is None and result["parent"] == result["me"], result


def test_a_loaders_workers_are_the_servers_children():
    result = run(LOADER)
    assert result["items"] == list(range(6)) and result["parents"] == [result["server"]] != [result["me"]], result


def test_the_server_ignores_slurms_signals_and_ends_with_the_process():
    code = ("import sys, time\nfrom hpcyolo_trainer.parallel import workers\nworkers.start()\n"
            "print(workers.server_pid(), flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        server = int(proc.stdout.readline())
        ignored = 0
        for _ in range(100):  # the server sets its dispositions while it imports PRELOAD
            status = open(f"/proc/{server}/status").read()
            ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
            if all(ignored >> (getattr(signal, f"SIG{name}") - 1) & 1 for name in SIGNALS):
                break
            subprocess.run(["sleep", "0.1"])
        assert all(ignored >> (getattr(signal, f"SIG{name}") - 1) & 1 for name in SIGNALS), hex(ignored)
        os.kill(server, signal.SIGUSR2)
        os.kill(server, signal.SIGTERM)
        assert os.path.exists(f"/proc/{server}")  # still there
    finally:
        proc.kill()
        proc.wait()
    for _ in range(100):  # its alive pipe closed: it exits
        if not os.path.exists(f"/proc/{server}") or "State:\tZ" in open(f"/proc/{server}/status").read():
            break
        subprocess.run(["sleep", "0.1"])
    assert not os.path.exists(f"/proc/{server}") or "State:\tZ" in open(f"/proc/{server}/status").read()


def test_every_module_the_server_preloads_imports():
    """The fork server skips a preload that fails to import, silently: each worker would then import it."""
    out = subprocess.run([sys.executable, "-c", "import importlib\nfrom hpcyolo_trainer.parallel.workers import "
                          "PRELOAD\nfor name in PRELOAD:\n    importlib.import_module(name)\n"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# A rank that dies without shutting its loader (SIGKILL here; a failed collective, an exception past
# the shutdown): its workers and the server must not outlive it (they once did, for good, and Slurm
# waited for them). The loader is the training loader's: its worker_init_fn is the run's.
KILLED = r"""
import functools, json, time
import torch
from torch.utils.data import DataLoader, TensorDataset
from hpcyolo_trainer.parallel import workers
from hpcyolo_trainer.run.inputs import ignore_signals

workers.start()
loader = DataLoader(TensorDataset(torch.arange(1000)), batch_size=2, num_workers=2, multiprocessing_context=workers.loader_context(2),
                    worker_init_fn=functools.partial(ignore_signals, ("USR1", "TERM")), timeout=60)
batches = iter(loader)
next(batches)
print(json.dumps({"workers": [w.pid for w in batches._workers], "server": workers.server_pid()}), flush=True)
time.sleep(60)
"""


def gone(pid: int) -> bool:
    try:
        return "State:\tZ" in open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return True


def test_a_killed_ranks_workers_and_server_end_with_it():
    proc = subprocess.Popen([sys.executable, "-c", KILLED], stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    left = [started["server"], *started["workers"]]
    assert len(left) == 3 and all(left), started
    for _ in range(50):
        if all(gone(pid) for pid in left):
            break
        subprocess.run(["sleep", "0.1"])
    still = [pid for pid in left if not gone(pid)]
    for pid in still:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not still, f"still running 5 s after their rank was killed: {still} of {started}"
