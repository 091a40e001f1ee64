"""Loader workers that inherit no other thread's state.

A DataLoader forks its workers from the process that iterates it. In a
training process, once the process group runs, gloo's C threads create and
drop Python thread states around each collective and so take the runtime's
thread-state lock without the GIL; on CPython before 3.12 (3.11 before
3.11.8: gh-112275) a child forked while one holds it waits for good before
it runs a line. Seen in CI and on the Slurm testbed: a worker stuck in
PyOS_AfterFork_Child, its rank waiting in the loader's __next__, the other
rank in a collective. Any other thread of the parent can leave a forked
child in the same state (a lock held at the fork is held for good there).

`start()`, called before the process group (or any other thread) exists
where a loader will have workers (`hpcyolo train` calls it first thing, so
that the server imports torch while the training process does; dist.setup
again, for other callers; a run with --workers 0 starts none),
starts multiprocessing's fork server: a fresh interpreter with one thread,
which imports the modules a worker needs (PRELOAD) once. Every loader of
the run then takes `context()` and forks its workers from that server,
never from the training process. A worker gets its dataset pickled (the
datasets send no image cache: the cache file is mapped again in the
worker) and the server's environment, which is the training process's as
it was at `start()`.

Slurm signals every process of a step (the warning signal, SIGTERM at the
end): the server ignores those (workers_server.py, imported first), so
that it outlives them as the workers do (ignore_signals); it exits when
the training process does.

Each worker, first thing (`in_worker()`, from the loaders' worker_init_fn),
ties its life to its rank's, however the rank ends (SIGKILL, a failed
collective, an exception past the loader's shutdown). A worker forked by
the server is the server's child, so torch's own check (is my parent's pid
still my parent) watches the server; and the server lives while any
process holds its alive pipe's write end, which each of its children
inherits. Left so, a rank that died left its server and workers running for
good, and Slurm waited for them before ending the step. So the worker
closes its copy of that pipe (the server then exits when the rank does) and
watches the rank itself: the pipe the rank keeps open for each child
(multiprocessing's parent sentinel) reads EOF the moment the rank is gone,
and the worker exits then.

A process that never calls `start()` (`hpcyolo val` and `predict` alone,
no process group) forks its workers as before: `context()` is None.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import os
import threading

# What the server imports once, so that each worker forked from it has them
# already (a module a worker imports itself costs it tens of milliseconds,
# numpy.random's extensions hundreds): the worker's side of multiprocessing,
# numpy's random generators, torch, Pillow (classify's transforms), the
# modules of the datasets a loader pickles (training: data/, validation:
# eval/evaluate.py) and of the workers' worker_init_fn, and the `hpcyolo`
# console script's (each worker runs the main module again, as spawn does;
# Python 3.11 does not pass "__main__" to the server).
PRELOAD = ["hpcyolo_trainer.parallel.workers_server", "hmac", "secrets", "multiprocessing.queues",
           "multiprocessing.synchronize", "multiprocessing.popen_fork", "multiprocessing.popen_forkserver",
           "numpy", "numpy.random", "torch", "torch.utils.data", "PIL.Image", "PIL.ImageEnhance", "PIL.ImageFile",
           "PIL.ImageOps", "PIL.ImagePalette", "PIL.GimpGradientFile", "PIL.GimpPaletteFile", "PIL.PaletteFile",
           "hpcyolo.entry", "hpcyolo_trainer.data.dataset", "hpcyolo_trainer.data.classify",
           "hpcyolo_trainer.eval.evaluate", "hpcyolo_trainer.run.inputs"]

_context: multiprocessing.context.BaseContext | None = None


def start() -> multiprocessing.context.BaseContext:
    """Start the workers' fork server (once per process) and return its
    context. Call it before the process group exists: the server is started
    with fork and exec, and whatever threads run later are not in it."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        multiprocessing.forkserver.ensure_running()
        _context = context
    return _context


def context() -> multiprocessing.context.BaseContext | None:
    """The context loaders start their workers in (DataLoader's
    multiprocessing_context): the fork server's after `start()`, else None
    (fork, in a process with no threads of that kind)."""
    return _context


def loader_context(num_workers: int) -> multiprocessing.context.BaseContext | None:
    """DataLoader's multiprocessing_context for a loader of `num_workers`
    (which refuses a context without workers)."""
    return _context if num_workers else None


def server_pid() -> int | None:
    """The fork server's process id, where it runs (for tests)."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    return pid if _context is not None else None


def in_worker() -> None:
    """In a loader worker, first thing: let go of the server's alive pipe
    (a child forked by the server holds it) and end this worker when its
    rank ends (see the module's docstring)."""
    server = multiprocessing.forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        server._forkserver_alive_fd = None
        try:
            os.close(alive)
        except OSError:
            pass
    rank = multiprocessing.parent_process()
    if rank is not None and rank.sentinel is not None:
        threading.Thread(target=_end_with, args=(rank.sentinel,), name="hpcyolo-rank-watch", daemon=True).start()


def _end_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)  # the rank is gone: nothing this worker makes can be used
