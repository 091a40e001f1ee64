"""Checkpoints: complete, atomic, discoverable (compare torchtitan).

A checkpoint is one file `ckpt-<global step>.pt` in RUN/checkpoints, written
to a temporary name, fsynced and renamed: a reader sees a whole file or none.
Resume takes the newest file that loads (torch.load(weights_only=True)) and
says it is complete; a corrupt or partial one is skipped with a warning.

`Writer` keeps the training loop from waiting on storage: it copies the
state into CPU buffers reused from one checkpoint to the next and writes
the copy from a background thread, one write in flight at a time; the next
checkpoint, or `wait()`, waits for the previous write and raises its error
if it failed. What only the optimizer step changes (parameters, EMA,
optimizer state: the bulk of the bytes) the thread copies while the loop
runs the next forward and backward passes; the loop calls `settle()`
before that step, so the file holds exactly the state of the step it names.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from ..common.fsutil import atomic_file

FORMAT = 1
_NAME = re.compile(r"ckpt-(\d{9})\.pt")
_PARTIAL = re.compile(r"\.ckpt-(\d{9})\.pt\..*\.tmp")

# A drill for tests: while the file this names exists, the write of the first
# checkpoint at or after the global step written in it stops half-way (the
# temporary file holds part of the bytes) until the file is removed, so that
# a test can kill the writer there.
STALL_DRILL_ENV = "HPCYOLO_DRILL_CKPT_STALL"


def path_for(folder: Path, global_step: int) -> Path:
    return folder / f"ckpt-{global_step:09d}.pt"


def save(obj: dict, path: Path) -> None:
    """torch.save, all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        torch.save(obj, _stall_drill(f, obj.get("global_step")))


def save_checkpoint(state: dict, folder: Path, keep: int) -> Path:
    path = path_for(folder, state["global_step"])
    save({**state, "format": FORMAT, "complete": True}, path)
    for old in checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


_ONE_THREAD = 32768  # elements: ATen copies a tensor this small on the calling thread (its grain size)
_NUMPY_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool}


def copy_into(buf: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> None:
    """buf[...] = src. A CPU tensor goes through numpy: one thread's memcpy,
    without the GIL. ATen's copy_ splits a large tensor over its OpenMP
    threads, and where the training keeps the cores busy each split waits
    for a time slice: yolov8n's 720 steady tensors took 0.4 to 1.5 s that
    way on 2 busy cores, against 7 to 9 ms through numpy."""
    if src.device.type == "cpu" and src.dtype in _NUMPY_DTYPES:
        np.copyto(buf.numpy(), src.numpy())
    else:
        buf.copy_(src, non_blocking=non_blocking)


class Snapshot:
    """A copy of a state that later training steps cannot change.

    Tensors in `steady` (the parameters, the EMA, the optimizer's state:
    what only the next optimizer step changes, and most of the bytes) are
    copied later, by `copy()` on the writing thread, while the loop goes on
    with the next forward and backward passes; the loop calls
    Writer.settle() before that optimizer step. They go into CPU buffers
    that the next snapshot of the same state reuses (allocated once: no
    page faults, no allocator work per checkpoint; pinned for a GPU's state,
    so the device copies them without a staging buffer). Every other tensor
    (BatchNorm's running statistics, which a forward pass changes; the loss
    sums; RNG states: small) is copied at once. The training thread only
    walks the containers: the buffers' bookkeeping is the writing thread's."""

    def __init__(self, state: dict, steady: Iterable[torch.Tensor], buffers: list[torch.Tensor]):
        self._spare, self._steady = buffers, {t.data_ptr() for t in steady} - {0}  # 0: an empty tensor
        self.later: list[torch.Tensor] = []  # the steady tensors, in the state's order
        self.buffers: list[torch.Tensor] = []  # their copies, once copy() ran
        self.state = self._walk(state)
        self._event = None
        device = next((src.device for src in self.later if src.is_cuda), None)
        if device is not None:  # the device's later copies follow the kernels of the step the state is at
            self._event = torch.cuda.current_stream(device).record_event()

    def _walk(self, obj):
        if isinstance(obj, torch.Tensor):  # a few calls per tensor: a state holds a thousand of them
            if obj.data_ptr() in self._steady:
                self.later.append(obj)
                return _Later(len(self.later) - 1)
            if obj.device.type == "cpu" and obj.numel() < _ONE_THREAD:
                return obj.detach().clone()  # one call: BatchNorm's statistics, a few hundred of them
            buf = torch.empty(obj.shape, dtype=obj.dtype)
            copy_into(buf, obj.detach())
            return buf
        if isinstance(obj, dict):
            return {k: self._walk(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._walk(v) for v in obj)
        return obj  # other values are immutable or fresh

    def copy(self) -> None:
        """On the writing thread: the steady tensors into the buffers, and
        the state made whole."""
        self.later = [src.detach() for src in self.later]
        for i, src in enumerate(self.later):
            buf = self._spare[i] if i < len(self._spare) else None
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.is_pinned() != src.is_cuda:
                buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
            self.buffers.append(buf)
        pairs = zip(self.buffers, self.later)
        if self._event is None:
            for buf, src in pairs:
                copy_into(buf, src)
        else:
            stream = torch.cuda.Stream(device=self.later[0].device)
            with torch.cuda.stream(stream):  # beside the loop's stream: its next kernels need not wait
                stream.wait_event(self._event)
                for buf, src in pairs:
                    copy_into(buf, src, non_blocking=True)
            stream.synchronize()
        self.state = _filled(self.state, self.buffers)


class _Later:
    """Where a steady tensor's copy goes in a snapshot's state."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _filled(obj, buffers: list[torch.Tensor]):
    if isinstance(obj, _Later):
        return buffers[obj.index]
    if isinstance(obj, dict):
        return {k: _filled(v, buffers) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_filled(v, buffers) for v in obj)
    return obj


WRITER_THREAD = "checkpoint-writer"


def finish_writes() -> None:
    """Let a checkpoint write still in flight reach the disk: for a rank that
    ends with os._exit (an error in a collective while the step's
    checkpoint was being written), which would kill the thread half-way and
    lose the newest checkpoint. What it cannot write in time (a node or a
    store that stopped) is ended by srun's or the launcher's kill."""
    for thread in threading.enumerate():
        if thread.name == WRITER_THREAD:
            thread.join()


class Writer:
    """Checkpoints written in the background after a fast snapshot."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._copied = threading.Event()
        self._copied.set()
        self._buffers: list[torch.Tensor] = []  # the last snapshot's, for the next to reuse
        self.stall = 0.0  # seconds the caller spent in save() and settle(), summed

    def save(self, state: dict, folder: Path, keep: int, wait: bool = False,
             steady: Iterable[torch.Tensor] = ()) -> Path:
        """Snapshot `state` and write it as the checkpoint of its step (see
        save_checkpoint); returns at once unless `wait`. The tensors of
        `state` that share memory with `steady` are copied by the writing
        thread: the caller must call settle() before it changes them."""
        start = time.perf_counter()
        self.wait()  # one write in flight: never two copies of the state in memory, and its buffers are free
        copy = Snapshot(state, steady, self._buffers)
        self._copied.clear()
        go = threading.Event()
        self._thread = threading.Thread(target=self._write, args=(copy, folder, keep, go), name=WRITER_THREAD)
        self._thread.start()
        # The thread waits until save() is done with Python: started at once, its work held the GIL
        # the loop needed to come back from start() (a few ms on 2 busy cores).
        go.set()
        self.stall += time.perf_counter() - start
        if wait:
            self.wait()
        return path_for(folder, state["global_step"])

    def _write(self, copy: Snapshot, folder: Path, keep: int, go: threading.Event) -> None:
        go.wait()
        try:
            try:
                copy.copy()
                self._buffers = copy.buffers  # the next save() waits for this thread before it takes them
            finally:
                self._copied.set()
            save_checkpoint(copy.state, folder, keep)
        except BaseException as e:  # noqa: BLE001 (handed to the training thread)
            self._error = e

    @property
    def copying(self) -> bool:
        """Whether the thread still copies the last snapshot's steady tensors."""
        return not self._copied.is_set()

    def settle(self) -> None:
        """Block until the last snapshot's steady tensors are copied: call
        before changing them (before the optimizer step)."""
        if self.copying:
            start = time.perf_counter()
            self._copied.wait()
            self.stall += time.perf_counter() - start

    def wait(self) -> None:
        """Block until the write in flight is on disk; raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error


def remove_partials(folder: Path) -> list[Path]:
    """Delete the temporary files of writes that never finished (a process
    killed while saving); returns what it removed."""
    if not folder.is_dir():
        return []
    removed = sorted(p for p in folder.iterdir() if _PARTIAL.fullmatch(p.name))
    for p in removed:
        p.unlink(missing_ok=True)
    return removed


def _stall_drill(f, step):
    """The file to write to: `f`, or under the drill, a file that stops half-way."""
    flag = os.environ.get(STALL_DRILL_ENV)
    if not flag or step is None or not os.path.exists(flag) or step < int(Path(flag).read_text() or 0):
        return f
    return _StallingFile(f, flag)


class _StallingFile:
    def __init__(self, f, flag: str) -> None:
        self.f, self.flag, self.written, self.stalled = f, flag, 0, False

    def write(self, data) -> int:
        n = self.f.write(data)
        self.written += n
        if not self.stalled and self.written >= 1 << 20:
            self.stalled = True
            self.f.flush()
            print(f"drill: checkpoint write stalled after {self.written} bytes while {self.flag} exists",
                  flush=True)
            while os.path.exists(self.flag):
                time.sleep(0.1)
        return n

    def flush(self) -> None:
        self.f.flush()


def checkpoints(folder: Path) -> list[Path]:
    """Checkpoint files, oldest first (temporary files are not listed)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.fullmatch(p.name))


def load_latest(folder: Path, warn: Callable[[str], None]) -> dict | None:
    """The newest checkpoint that loads and is complete, or None."""
    for path in reversed(checkpoints(folder)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated or corrupt file: any unpickling error
            warn(f"skipping unreadable checkpoint {path.name}: {type(e).__name__}: {e}")
            continue
        if not (isinstance(state, dict) and state.get("complete") and state.get("format") == FORMAT):
            warn(f"skipping incomplete checkpoint {path.name}")
            continue
        state["path"] = str(path)
        return state
    return None
