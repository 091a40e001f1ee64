"""Copying a tree fast and checking the copy: a tree's manifest (paths,
sizes, symlink targets) read with parallel stat calls, the copy made by a
few forked worker processes (read + write for small files, sendfile for
the others), and the first difference between two manifests. `hpcyolo
stage` (stage.py) copies a dataset with it.
"""

from __future__ import annotations

import marshal
import os
import stat
import threading
from pathlib import Path

from hpcyolo_trainer.common.errors import HpcyoloError

CHUNK = 256  # files per unit of work of a worker process
# Copied with one read + one write; larger files with sendfile, which moves
# the bytes once, inside the kernel, instead of twice through a buffer: from
# 32 KiB on, ~15% less system time per byte (a COCO JPEG, 50-250 KiB), the
# same below. (copy_file_range would be cheaper still, but not between two
# filesystems, as from shared storage to a node's tmpfs.)
SMALL_FILE = 16 << 10
PARALLEL_FROM = 1024  # files; fewer are done in-process (a fork costs ~1 ms)
MAX_WORKERS = 16


class Manifest:
    """Relative paths (with `/`) of a tree: what the copy must reproduce."""

    def __init__(self) -> None:
        self.dirs: list[str] = []  # parents before children
        self.files: dict[str, int] = {}  # path -> size
        self.links: dict[str, str] = {}  # path -> symlink target
        # dir -> [(name, size, mode, mtime in ns)]: the copy keeps each file's mtime, so that what was
        # recorded of the source by size and mtime (the trainer's dataset index) holds for the copy too.
        self.by_dir: dict[str, list[tuple[str, int, int, int]]] = {}

    @property
    def nbytes(self) -> int:
        return sum(self.files.values())

    def blocks_bytes(self, block: int) -> int:
        """Space on disk: every file rounded up to whole blocks, a block per folder."""
        return sum(-(-size // block) * block for size in self.files.values()) + block * len(self.dirs)


def walk(root: str | Path, workers: int | None = None) -> Manifest:
    """The tree under `root`, no symlink followed: the folders are listed
    here (readdir alone is cheap), the files' sizes are lstat'ed by `workers`
    processes (one stat is a round trip to the servers on Lustre or NFS)."""
    m, names = scan(root)
    root = str(root)
    jobs = [(f"{root}/{d}" if d else root, chunk) for d, chunk in _chunks(names)]
    results = _fork_map(_stat_files, jobs, _workers(workers, len(jobs)))
    for (d, chunk), (sizes, modes, mtimes) in zip(_chunks(names), results):
        m.files.update(zip(map(f"{d}/".__add__, chunk) if d else chunk, sizes))
        m.by_dir.setdefault(d, []).extend(zip(chunk, sizes, modes, mtimes))
    return m


def scan(root: str | Path) -> tuple[Manifest, dict[str, list[str]]]:
    """Folders and symlinks of the tree, and the names of its other entries
    per folder, from readdir alone (is_file, is_dir and is_symlink read the
    entry's type; no stat)."""
    root = str(root)
    m = Manifest()
    names: dict[str, list[str]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        here = f"{root}/{rel}" if rel else root
        prefix = f"{rel}/" if rel else ""
        files = names[rel] = []
        try:
            with os.scandir(here) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):  # most entries: asked first
                        files.append(e.name)
                    elif e.is_dir(follow_symlinks=False):
                        m.dirs.append(prefix + e.name)
                        stack.append(prefix + e.name)
                    elif e.is_symlink():
                        m.links[prefix + e.name] = os.readlink(e.path)
                    else:  # a fifo, socket or device: _stat_files refuses it
                        files.append(e.name)
        except OSError as e:
            raise HpcyoloError(f"stage: cannot read {e.filename or here}: {e.strerror}") from None
    return m, names


def _chunks(names: dict[str, list]):
    """(folder, up to CHUNK of its entries): the unit of work of a worker."""
    for d, entries in names.items():
        for i in range(0, len(entries), CHUNK):
            yield d, entries[i:i + CHUNK]


def _stat_files(folder: str, names: list[str]) -> tuple[list[int], list[int], list[int]]:
    """Sizes, permission bits and mtimes (ns) of regular files in one folder
    (opened once: each lstat is then relative to it, sparing the kernel the
    whole path)."""
    sizes, modes, mtimes, lstat, regular = [], [], [], os.stat, stat.S_ISREG
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise HpcyoloError(f"stage: cannot read {folder}: {e.strerror}") from None
    try:
        for name in names:
            st = lstat(name, dir_fd=fd, follow_symlinks=False)
            if not regular(st.st_mode):
                raise HpcyoloError(f"stage: cannot copy {folder}/{name}: not a file, folder or symlink")
            sizes.append(st.st_size)
            modes.append(st.st_mode & 0o7777)
            mtimes.append(st.st_mtime_ns)
    except OSError as e:
        raise HpcyoloError(f"stage: cannot read {folder}/{e.filename}: {e.strerror}") from None
    finally:
        os.close(fd)
    return sizes, modes, mtimes


def first_difference(want: Manifest, got: Manifest) -> str | None:
    """The first path (in sorted order) where `got` differs from `want`, with why."""
    if want.files == got.files and want.links == got.links and set(want.dirs) == set(got.dirs):
        return None
    kinds = [("file", want.files, got.files), ("symlink", want.links, got.links),
             ("folder", dict.fromkeys(want.dirs, 0), dict.fromkeys(got.dirs, 0))]
    problems = []
    for kind, a, b in kinds:
        for path in a.keys() - b.keys():
            problems.append((path, f"{kind} {path} is missing from the copy"))
        for path in b.keys() - a.keys():
            problems.append((path, f"{kind} {path} is in the copy but not in the source"))
        for path in a.keys() & b.keys():
            if a[path] != b[path]:
                what = "bytes" if kind == "file" else "target"
                problems.append((path, f"{kind} {path} has {b[path]!r} {what} in the copy, {a[path]!r} in the source"))
    return min(problems)[1]


# == copying =================================================================

def copy_tree(src: str | Path, dst: str | Path, m: Manifest, workers: int | None = None,
              offsets: dict[str, int] | None = None) -> Manifest:
    """Reproduce the tree `m` of `src` under the empty folder `dst` (folders
    and symlinks here, the files by `workers` processes, a chunk of one folder
    at a time), and return what the copy holds, to compare with `m`: its
    folders, symlinks and names from a listing of `dst`, the files' sizes as
    the filesystem has them once written (not as counted while copying).
    With `offsets` (path -> where its bytes start), `src` is an uncompressed
    tar archive (archive.scan_tar) and each file is copied out of it."""
    src, dst = str(src), str(dst)
    for rel in m.dirs:
        os.mkdir(f"{dst}/{rel}")
    for rel, target in m.links.items():
        os.symlink(target, f"{dst}/{rel}")
    chunks = list(_chunks(m.by_dir))
    if offsets is None:
        jobs = [(f"{src}/{d}" if d else src, f"{dst}/{d}" if d else dst, chunk) for d, chunk in chunks]
        sizes = _fork_map(_copy_files, jobs, _workers(workers, len(jobs)))
    else:
        jobs = [(src, f"{dst}/{d}" if d else dst, [(*entry, offsets[f"{d}/{entry[0]}" if d else entry[0]])
                                                   for entry in chunk]) for d, chunk in chunks]
        sizes = _fork_map(_unpack_files, jobs, _workers(workers, len(jobs)))
    got, names = scan(dst)
    if all(copied == [entry[1] for entry in chunk] for (_, chunk), copied in zip(chunks, sizes)) and \
            all(set(names.get(d, ())) == {entry[0] for entry in entries} for d, entries in m.by_dir.items()) and \
            all(d in m.by_dir for d, files in names.items() if files):
        got.files = m.files  # the same names with the same sizes, folder by folder
        return got
    seen = {}  # a difference somewhere: spell the copy out, path by path
    for (d, chunk), copied in zip(chunks, sizes):
        prefix = f"{d}/" if d else ""
        seen.update(zip((prefix + entry[0] for entry in chunk), copied))
    for d, files in names.items():
        prefix = f"{d}/" if d else ""
        for name in files:
            got.files[prefix + name] = seen.get(prefix + name, -1)  # -1: not in the source
    return got


def _copy_files(src_dir: str, dst_dir: str, entries: list[tuple[str, int, int, int]]) -> list[int]:
    """Copy the named files between two folders, each folder opened once, with
    their mtimes, and
    return the size of each copy: where its end lies once written, which is
    the filesystem's count, not ours (and, unlike an fstat, costs no Python
    object per file). Exactly the manifest's size is copied: a file that
    changed meanwhile shows up in the verification, not as a torn copy. (The
    hot loop of staging: hence the local names.)"""
    open_, read, write, seek, close = os.open, os.read, os.write, os.lseek, os.close
    send, utime = os.sendfile, os.utime
    rd, wr, end, cur = os.O_RDONLY | os.O_NOFOLLOW, os.O_WRONLY | os.O_CREAT | os.O_EXCL, os.SEEK_END, os.SEEK_CUR
    small = SMALL_FILE
    sizes: list[int] = []
    sfd = open_(src_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dfd = open_(dst_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name, size, mode, mtime in entries:
                fin = open_(name, rd, dir_fd=sfd)
                try:
                    fout = open_(name, wr, mode, dir_fd=dfd)
                    try:
                        if size <= small:
                            data = read(fin, size)
                            while data:
                                data = data[write(fout, data):]
                        elif send(fout, fin, None, size) < size:  # short: the rest in a loop
                            _send(fin, fout, size, seek(fout, 0, cur))
                        sizes.append(seek(fout, 0, end))
                        utime(fout, ns=(mtime, mtime))
                    finally:
                        close(fout)
                finally:
                    close(fin)
        finally:
            close(dfd)
    finally:
        close(sfd)
    return sizes


def _unpack_files(archive: str, dst_dir: str, entries: list[tuple[str, int, int, int]]) -> list[int]:
    """_copy_files for members of a tar archive: (name, size, mode, mtime,
    offset) each, their bytes sent from the archive at that offset (which moves no
    shared file position: the workers share nothing)."""
    open_, seek, close, send, utime = os.open, os.lseek, os.close, os.sendfile, os.utime
    wr, end = os.O_WRONLY | os.O_CREAT | os.O_EXCL, os.SEEK_END
    sizes: list[int] = []
    afd = open_(archive, os.O_RDONLY)
    try:
        dfd = open_(dst_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name, size, mode, mtime, offset in entries:
                fout = open_(name, wr, mode, dir_fd=dfd)
                try:
                    done = send(fout, afd, offset, size) if size else 0
                    while 0 < done < size:
                        n = send(fout, afd, offset + done, size - done)
                        if not n:  # the archive ended early: the size check tells
                            break
                        done += n
                    sizes.append(seek(fout, 0, end))
                    utime(fout, ns=(mtime, mtime))
                finally:
                    close(fout)
        finally:
            close(dfd)
    finally:
        close(afd)
    return sizes


def _send(fin: int, fout: int, size: int, done: int = 0) -> None:
    """The rest of a file from byte `done` on, moved by the kernel alone."""
    while done < size:
        n = os.sendfile(fout, fin, None, size - done)
        if not n:
            return
        done += n


def _workers(asked: int | None, jobs: int) -> int:
    if asked is not None:
        return asked
    if jobs * CHUNK < PARALLEL_FROM:
        return 1
    # One per CPU: from page cache the work is CPU-bound and each fork costs
    # a few ms; on Lustre/NFS, where workers wait, ask for more (--workers).
    return max(2, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def _fork_map(fn, jobs: list[tuple], workers: int) -> list:
    """[fn(*job) for job in jobs], spread over `workers` processes: this one
    and `workers - 1` forked ones, each taking every `workers`-th job.

    Processes, not threads: per small file the work is a handful of system
    calls with a little Python between them, and threads would spend more on
    handing the GIL back and forth than they gain. A child's result comes
    back through a pipe, marshalled (lists of numbers: marshal suffices, and
    is loaded already); an exception in it, pickled."""
    workers = min(workers, len(jobs))
    if workers <= 1 or threading.active_count() > 1:  # forking a threaded process is not safe
        return [fn(*job) for job in jobs]
    children: list[tuple[int, int]] = []
    try:
        for w in range(1, workers):
            r, wr = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns into the caller's stack
                os.close(r)
                _child(wr, fn, jobs[w::workers])
            os.close(wr)
            children.append((pid, r))
        results: list = [None] * len(jobs)
        results[::workers] = [fn(*job) for job in jobs[::workers]]  # this process's share
        for w, (pid, r) in enumerate(children, 1):
            children[w - 1] = (pid, -1)  # the file object below owns (and closes) r
            with os.fdopen(r, "rb") as f:
                payload = f.read()
            if payload[:1] != b"+":  # an exception, or nothing at all from a worker that died
                import pickle

                raise pickle.loads(payload[1:]) if payload else HpcyoloError("stage: a worker died")
            results[w::workers] = marshal.loads(payload[1:])
        return results
    finally:
        for pid, r in children:
            if r >= 0:  # an error elsewhere: stop this one
                os.close(r)
                _kill(pid)
            os.waitpid(pid, 0)


def _child(wr: int, fn, jobs: list[tuple]) -> None:
    code = 0
    try:
        try:
            payload = b"+" + marshal.dumps([fn(*job) for job in jobs])
        except BaseException as e:  # noqa: BLE001 (anything: the parent must hear of it, not read an empty pipe)
            import pickle

            code, payload = 1, b"!" + pickle.dumps(e if isinstance(e, (OSError, HpcyoloError)) else
                                                   HpcyoloError(f"stage: worker failed: {e!r}"))
        with os.fdopen(wr, "wb") as f:
            f.write(payload)
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
