"""Loader workers forked beside torch.distributed's threads, without hanging.

CPython before 3.12 (3.11 before 3.11.8: gh-112275) has a child created by
fork() take the runtime's thread-state lock (HEAD_LOCK) before resetting
it. Where another thread of the parent held that lock at the fork, the
child waits for good, before it runs a line of Python: a data-loader
worker that never answers, a rank that waits on it, a job that hangs.

Threads that hold that lock without the GIL are C threads creating a
Python thread state. In a training process these are gloo's work threads
(pt_gloo_runloop): a collective whose tensor Python has already let go
ends with the thread dropping the tensor's Python object, under a fresh
thread state. They do it right after each collective, which is when the
trainer forks (validation's loader after the EMA's broadcast). Seen in CI
and on the Slurm testbed as a worker stuck in PyOS_AfterFork_Child.

`install()` registers a before-fork hook (os.register_at_fork) that, on
the affected versions, waits until the lock is free (it is held for
microseconds; the forking thread holds the GIL, so a thread that took the
lock cannot take it again before the fork). The lock is read as the
runtime's first field after its flags, a pointer to a POSIX semaphore,
checked when installing: where it does not read as a lock, nothing is
installed.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

_OFFSET = 32  # of _PyRuntime.interpreters.mutex: five ints, then the _finalizing pointer (3.8 to 3.11)
_installed = False


def affected(version: tuple = tuple(sys.version_info[:3])) -> bool:
    """Whether this CPython's child takes HEAD_LOCK before resetting it."""
    if version >= (3, 12) or (version[:2] == (3, 11) and version >= (3, 11, 8)):
        return False
    return sys.implementation.name == "cpython" and sys.platform.startswith("linux")


def lock_address() -> int | None:
    """The address of HEAD_LOCK's semaphore (a forked child has a new one), or None."""
    try:
        runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    except (AttributeError, OSError, ValueError):
        return None
    return ctypes.c_void_p.from_address(runtime + _OFFSET).value


_libc = ctypes.CDLL(None, use_errno=True)


def _value(sem: int) -> int:
    value = ctypes.c_int(-1)
    if _libc.sem_getvalue(ctypes.c_void_p(sem), ctypes.byref(value)) != 0:
        return -1
    return value.value


def held(sem: int) -> bool:
    return _value(sem) == 0


def wait_free(timeout: float = 2.0) -> float:
    """Wait until the lock reads free three times in a row; returns the
    seconds waited. Past `timeout` the fork goes ahead (a holder stuck for
    good would hang the child whatever we do)."""
    start = time.monotonic()
    sem = lock_address()
    free = 0
    while free < 3 and time.monotonic() - start < timeout:
        if held(sem):
            free = 0
            time.sleep(0.0001)  # the holder needs no GIL to let go
        else:
            free += 1
    return time.monotonic() - start


def install() -> bool:
    """Register the before-fork wait (once per process); returns whether it
    is in place (False on unaffected versions, or where the lock is not found)."""
    global _installed
    if _installed:
        return True
    if not affected():
        return False
    sem = lock_address()
    if not sem or _value(sem) not in (0, 1):  # not a semaphore used as a lock: another layout
        return False
    os.register_at_fork(before=wait_free)
    _installed = True
    return True
