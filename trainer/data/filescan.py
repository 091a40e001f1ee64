"""The dataset's files, as metadata: each image's and label file's size and
mtime (`stats`), work per file in one thread or a pool (`per_file`), and
rank 0's listing and stats of the data YAML's splits in a child process
that runs while the training process imports torch (`Prescan`). No torch
here: `hpcyolo train` forks the child before torch loads.

A second start on an unchanged dataset opens no image or label file (the
dataset's index, dataindex.py), but rank 0 still lists the splits' folders
and stats every image and label file, to see whether anything changed: at
50k images 0.45 s of a 2 s start on 2 cores, and on a parallel file system
a metadata round trip per file. Importing torch is the other long wait of a
start (about 1 s of CPU, seconds on a cold shared file system), and the two
do not depend on each other: the child lists and stats while the parent
imports, and hands over the data YAML's splits and the stats through a pipe.
Where the child fails (the YAML cannot be read, a folder is missing, the
child is killed), the parent does the work itself and says what is wrong
in its own words, as without the child.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..common.datayaml import DataSpec, ImagePaths, label_str, load_data_spec, texts, training_files

KEYPOINT_KEYS = ("kpt_shape", "flip_idx", "kpt_oks_sigmas")  # the DataSpec's keypoint fields, handed over as read

FILE_CHUNK = 256  # files per task of per_file's thread pool, and per measured chunk
IO_BOUND = 2.0  # a chunk whose wall time exceeds this many times its CPU time waited (threads for the rest) ...
IO_WAITS = 1 / 16  # ... where it also blocked (a voluntary context switch) at least once per 16 files: on I/O
SPLITS = ("train", "val", "test")
RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def per_file(fn, files: list) -> list:
    """fn(chunk) over `files` in chunks of FILE_CHUNK, its results in order:
    in this thread while the work is the CPU's, in a pool of threads once a
    chunk waited on I/O: its wall time exceeds IO_BOUND times this thread's
    CPU time in it, and the thread blocked (IO_WAITS).

    Files in the kernel's cache cost CPU alone (a stat, a header, a label
    file parsed), and threads then only contend for the GIL: 10k images
    checked (check_one) on 2 cores took 2.6 s in one thread and 6.6 s in
    eight, 50k stats 0.37 against 0.75 s. Where each file is a round trip (a
    parallel file system's metadata server, a cold disk), the chunk waits
    more than it computes and the pool overlaps the waits. A thread that
    waited for a CPU instead (other processes on it: the ranks of a node,
    torch's import beside `Prescan`'s child) did not block: the kernel
    counts that wait as an involuntary switch, and a pool would only add
    threads to the CPUs' queue (a second start at 50k images took 0.2 s
    longer where its prescan had turned to the pool)."""
    chunks = [files[i:i + FILE_CHUNK] for i in range(0, len(files), FILE_CHUNK)]
    out: list = []
    for k, chunk in enumerate(chunks):
        wall, cpu, blocked = time.perf_counter(), time.thread_time(), _blocks()
        out += fn(chunk)
        waited = time.perf_counter() - wall > IO_BOUND * (time.thread_time() - cpu) and \
            (RUSAGE_THREAD is None or _blocks() - blocked >= IO_WAITS * len(chunk))
        if waited and k + 1 < len(chunks):
            with ThreadPoolExecutor(max_workers=min(32, cpus() * 4)) as pool:
                out += [r for part in pool.map(fn, chunks[k + 1:]) for r in part]
            break
    return out


def _blocks() -> int:
    """This thread's voluntary context switches so far (it blocked: on I/O, a
    lock, a sleep); 0 where the system does not count them per thread (then
    per_file goes by the wall time alone)."""
    return 0 if RUSAGE_THREAD is None else resource.getrusage(RUSAGE_THREAD).ru_nvcsw


def stats(files):
    """int64 [N, 4] (numpy): image size and mtime (ns), label file size and
    mtime; -1 where a file is missing. One stat per file, no open; threads
    only where the stats wait on the file system (per_file)."""
    import numpy as np

    def one(chunk: list[str]) -> list[tuple[int, int, int, int]]:
        rows = []
        for image in chunk:
            row = []
            for path in (image, label_str(image)):
                try:
                    st = os.stat(path)
                    row += [st.st_size, st.st_mtime_ns]
                except OSError:
                    row += [-1, -1]
            rows.append(tuple(row))
        return rows

    strings = files.strings if isinstance(files, ImagePaths) else texts(files)
    return np.array(per_file(one, strings), dtype=np.int64).reshape(-1, 4)


@dataclass(frozen=True)
class Scan:
    """What the child found: the data YAML with its splits listed, and the
    stats of the training images (training_files at `fraction`) and of the
    validation images, by split."""

    spec: DataSpec
    stats: dict


class Prescan:
    """Rank 0's listing and stats of `data`'s splits, in a child forked now
    (call it before torch loads); `take` waits for them."""

    def __init__(self, data: str, fraction: float):
        self.data, self.fraction = str(data), fraction
        self.pid, self.fd = None, None
        if threading.active_count() > 1:  # fork copies one thread: a lock another held stays held
            return
        read, write = os.pipe()
        try:
            pid = os.fork()
        except OSError:  # no process to spare: the trainer lists and stats itself
            os.close(read)
            os.close(write)
            return
        if pid == 0:  # the child: its result into the pipe, then out without the parent's exit handlers
            os.close(read)
            _child(write, self.data, fraction)
        os.close(write)
        self.pid, self.fd = pid, read

    def take(self, data: str, fraction: float) -> Scan | None:
        """The child's scan, where it is of `data` at `fraction` and the
        child succeeded; else None (the caller lists and stats itself)."""
        if self.pid is None:
            return None
        with os.fdopen(self.fd, "rb") as f:
            raw = f.read()
        pid, self.pid = self.pid, None
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already (SIGCHLD ignored): its exit status is lost
            return None
        if status != 0 or (str(data), fraction) != (self.data, self.fraction):
            return None
        return _decode(raw)


def _child(fd: int, data: str, fraction: float):  # NoReturn
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)  # the parent's stop handlers are the parent's
        with os.fdopen(fd, "wb") as f:
            f.write(_encode(load_data_spec(data), fraction))
        code = 0
    except BaseException:  # noqa: BLE001 - the parent does the work again and says what fails
        pass
    os._exit(code)


def _encode(spec: DataSpec, fraction: float) -> bytes:
    """A header line (JSON) and then, in the header's order, each listed
    split's paths (NUL-separated, no path holds a NUL) and the stats."""
    lists = {split: getattr(spec, split) for split in SPLITS if getattr(spec, split) is not None}
    counted = {"train": stats(training_files(spec.train, fraction, spec.folders)), "val": stats(spec.val)}
    blobs = [("\0".join(lists[s].strings)).encode("utf-8", "surrogateescape") for s in lists]
    blobs += [counted[s].tobytes() for s in counted]
    header = {"root": str(spec.root), "names": spec.names, "yaml": spec.yaml, "folders": spec.folders, "lists": list(lists),
              "stats": list(counted), "sizes": [len(b) for b in blobs],
              "keypoints": {key: getattr(spec, key) for key in KEYPOINT_KEYS}}
    return json.dumps(header).encode() + b"\n" + b"".join(blobs)


def _decode(raw: bytes) -> Scan | None:
    import numpy as np

    line, _, body = raw.partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        return None
    blobs, at = [], 0
    for size in header["sizes"]:
        blobs.append(body[at:at + size])
        at += size
    if at != len(body):
        return None
    lists = {s: ImagePaths(b.decode("utf-8", "surrogateescape").split("\0")) for s, b in zip(header["lists"], blobs)}
    counted = {s: np.frombuffer(b, np.int64).reshape(-1, 4) for s, b in zip(header["stats"], blobs[len(lists):])}
    keypoints = {key: None if value is None else tuple(value) for key, value in header["keypoints"].items()}
    spec = DataSpec(root=Path(header["root"]), names=header["names"], yaml=header["yaml"],
                    folders=header.get("folders", False), **{s: lists.get(s) for s in SPLITS}, **keypoints)
    return Scan(spec, counted)
