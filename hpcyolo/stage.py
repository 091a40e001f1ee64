"""Copy a dataset into node-local scratch, once per node.

Many small files on Lustre or NFS are slow to read (DESIGN.md, section 4), so
the batch script runs `hpcyolo stage` as one task per node before training:

    DEST/.hpcyolo-staged   completion marker (JSON: source identity, counts)
    DEST/data.yaml         the source's data YAML with `path:` set to the copy
    DEST/dataset/          the dataset root (a tree), or the unpacked archive

The source is a data YAML (its dataset root is copied) or a tar archive holding
the dataset with one data YAML at its top level. The copy is built under a
temporary name next to DEST, checked against the source's manifest (the same
relative paths, file sizes and symlink targets), and renamed into place with
its marker inside, so a directory at DEST is always complete. An exclusive
lock next to DEST makes other tasks on the node wait for the one copying; a
later stage of the same source (a requeued job on the same node) finds the
marker and returns at once. The marker records what was stat'ed of the source;
whether a copy is still current is decided in hpcyolo_trainer.staged, which the
`hpcyolo` command asks before importing this module (or yaml, or click).
"""

from __future__ import annotations

import fcntl
import json
import marshal
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

from hpcyolo_trainer.dataset import SPLITS, archive_flags, data_spec, dataset_root, read_data_yaml, split_entries
from hpcyolo_trainer.errors import HpcyoloError, shown
from hpcyolo_trainer.staged import (MARKER, OWNER, already_staged, claim, current_marker, is_current, node_name,
                                    read_marker, remove, say, source_identity)
from hpcyolo_trainer.yamlfile import dump_yaml, loads

# Room left free after the copy: filesystem overhead, the staged YAML, and (on
# a tmpfs) memory the training processes still need.
MARGIN_BYTES = 64 << 20
MARGIN_FRACTION = 0.02
CHUNK = 256  # files per unit of work of a worker process
SMALL_FILE = 1 << 20  # copied with read + write; larger files with sendfile
PARALLEL_FROM = 1024  # files; fewer are done in-process (a fork costs ~1 ms)
MAX_WORKERS = 16
GiB = 1 << 30


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _relocated_splits(data_yaml: Path, spec: dict, root: Path) -> dict:
    """The splits as they must read in the staged YAML: relative paths stay;
    an absolute path inside the root becomes relative to it; anything outside
    the root is an error, since only the root is copied and training would
    quietly read the rest from shared storage."""
    changed = {}
    for key in SPLITS:
        value = spec.get(key)
        entries = value if isinstance(value, list) else [value]
        new = []
        for entry in entries:
            if not isinstance(entry, str) or not entry:
                new.append(entry)
                continue
            where = os.path.normpath(os.path.join(root, entry))
            if not _inside(where, str(root)) and not _inside(os.path.realpath(where), os.path.realpath(root)):
                raise HpcyoloError(f"{data_yaml}: {key}: {entry} is outside the dataset root {root}; staging "
                                   "copies only the root and cannot relocate it: move it under the root "
                                   "(path:) or turn staging off (data.stage: false)")
            new.append(os.path.relpath(where, root) if os.path.isabs(entry) else entry)
        if new != entries:
            changed[key] = new if isinstance(value, list) else new[0]
    return changed


def _check_list_files(data_yaml: Path, spec: dict, root: Path) -> None:
    """A .txt split lists images relative to the root, or absolute: absolute
    lines would still be read from where they are, not from the copy."""
    for key, entry in split_entries(data_yaml, spec):
        listing = root / entry
        if listing.suffix.lower() != ".txt" or not listing.is_file():
            continue
        try:
            with open(listing, encoding="utf-8") as f:
                first = next((line.strip() for line in f if line.lstrip().startswith(("/", "../"))), None)
        except (OSError, UnicodeDecodeError) as e:
            raise HpcyoloError(f"{data_yaml}: {key}: cannot read list file {listing}: {e}") from None
        if first:
            raise HpcyoloError(f"{data_yaml}: {key}: list file {listing} names images outside the dataset root "
                               f"(first: {first}); a staged copy cannot relocate them: make them relative to the "
                               "root, inside it")


def _staged_yaml_text(text: str, spec: dict, root: Path, splits: dict) -> str:
    """The original YAML (comments and order kept) with `path:` set to the
    staged root; a YAML whose text cannot be edited that simply is dumped
    from its parsed content instead."""
    want = {**spec, **splits, "path": str(root)}
    line = f"path: {json.dumps(str(root), ensure_ascii=False)}"  # JSON strings are YAML scalars
    if len(re.findall(r"^path[ \t]*:", text, flags=re.MULTILINE)) == 1:
        edited = re.sub(r"^path[ \t]*:.*$", lambda _: line, text, count=1, flags=re.MULTILINE)
    else:
        edited = f"{line}\n{text}"
    try:
        if data_spec(loads(edited, "data.yaml"), Path("data.yaml")) == want:
            return edited
    except HpcyoloError:
        pass
    return dump_yaml(want)


# == manifests: what a tree holds ============================================

class Manifest:
    """Relative paths (with `/`) of a tree: what the copy must reproduce."""

    def __init__(self) -> None:
        self.dirs: list[str] = []  # parents before children
        self.files: dict[str, int] = {}  # path -> size
        self.links: dict[str, str] = {}  # path -> symlink target
        self.by_dir: dict[str, list[tuple[str, int, int]]] = {}  # dir -> [(name, size, mode)]

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
    for (d, chunk), (sizes, modes) in zip(_chunks(names), results):
        m.files.update(zip(map(f"{d}/".__add__, chunk) if d else chunk, sizes))
        m.by_dir.setdefault(d, []).extend(zip(chunk, sizes, modes))
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


def _stat_files(folder: str, names: list[str]) -> tuple[list[int], list[int]]:
    """Sizes and permission bits of regular files in one folder (opened once:
    each lstat is then relative to it, sparing the kernel the whole path)."""
    sizes, modes, lstat, regular = [], [], os.stat, stat.S_ISREG
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
    except OSError as e:
        raise HpcyoloError(f"stage: cannot read {folder}/{e.filename}: {e.strerror}") from None
    finally:
        os.close(fd)
    return sizes, modes


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

def copy_tree(src: str | Path, dst: str | Path, m: Manifest, workers: int | None = None) -> Manifest:
    """Reproduce the tree `m` of `src` under the empty folder `dst` (folders
    and symlinks here, the files by `workers` processes, a chunk of one folder
    at a time), and return what the copy holds, to compare with `m`: its
    folders, symlinks and names from a listing of `dst`, the files' sizes as
    the filesystem has them once written (not as counted while copying)."""
    src, dst = str(src), str(dst)
    for rel in m.dirs:
        os.mkdir(f"{dst}/{rel}")
    for rel, target in m.links.items():
        os.symlink(target, f"{dst}/{rel}")
    chunks = list(_chunks(m.by_dir))
    jobs = [(f"{src}/{d}" if d else src, f"{dst}/{d}" if d else dst, chunk) for d, chunk in chunks]
    sizes = _fork_map(_copy_files, jobs, _workers(workers, len(jobs)))
    got, names = scan(dst)
    if all(copied == [size for _, size, _ in chunk] for (_, chunk), copied in zip(chunks, sizes)) and \
            all(set(names.get(d, ())) == {name for name, _, _ in entries} for d, entries in m.by_dir.items()) and \
            all(d in m.by_dir for d, files in names.items() if files):
        got.files = m.files  # the same names with the same sizes, folder by folder
        return got
    seen = {}  # a difference somewhere: spell the copy out, path by path
    for (d, chunk), copied in zip(chunks, sizes):
        prefix = f"{d}/" if d else ""
        seen.update(zip((prefix + name for name, _, _ in chunk), copied))
    for d, files in names.items():
        prefix = f"{d}/" if d else ""
        for name in files:
            got.files[prefix + name] = seen.get(prefix + name, -1)  # -1: not in the source
    return got


def _copy_files(src_dir: str, dst_dir: str, entries: list[tuple[str, int, int]]) -> list[int]:
    """Copy the named files between two folders, each folder opened once, and
    return the size of each copy: where its end lies once written, which is
    the filesystem's count, not ours (and, unlike an fstat, costs no Python
    object per file). Exactly the manifest's size is copied: a file that
    changed meanwhile shows up in the verification, not as a torn copy. (The
    hot loop of staging: hence the local names.)"""
    open_, read, write, seek, close = os.open, os.read, os.write, os.lseek, os.close
    rd, wr, end = os.O_RDONLY | os.O_NOFOLLOW, os.O_WRONLY | os.O_CREAT | os.O_EXCL, os.SEEK_END
    sizes: list[int] = []
    sfd = open_(src_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dfd = open_(dst_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name, size, mode in entries:
                fin = open_(name, rd, dir_fd=sfd)
                try:
                    fout = open_(name, wr, mode, dir_fd=dfd)
                    try:
                        # A small file costs less as one read and one write
                        # than through sendfile's splice machinery.
                        if size <= SMALL_FILE:
                            data = read(fin, size)
                            while data:
                                data = data[write(fout, data):]
                        else:
                            _send(fin, fout, size)
                        sizes.append(seek(fout, 0, end))
                    finally:
                        close(fout)
                finally:
                    close(fin)
        finally:
            close(dfd)
    finally:
        close(sfd)
    return sizes


def _send(fin: int, fout: int, size: int) -> None:
    """A large file, moved by the kernel alone."""
    done = 0
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


# == archives ================================================================

_LISTING = re.compile(r'^(?P<type>.)\S* \S+ +(?P<size>\d+|\d+, *\d+) \S+ \S+ "(?P<name>(?:[^"\\]|\\.)*)"'
                      r'(?: (?P<how>->|link to) "(?P<target>(?:[^"\\]|\\.)*)")?$')
_C_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34, "?": 63}
_ESCAPE = re.compile(rb"\\([0-7]{1,3}|.)", re.DOTALL)


def _unquote(text: str) -> str:
    """GNU tar's --quoting-style=c: C escapes, octal for any other byte."""
    if "\\" not in text:
        return text
    raw = text.encode("utf-8", "surrogateescape")
    return os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m[1], 8) & 0xFF] if m[1][:1] in b"01234567" else
                                                   [_C_ESCAPES.get(m[1].decode("latin-1"), m[1][0])]), raw))


def _tar(archive: Path, flags: tuple[str, ...], *args: str) -> bytes:
    import subprocess

    if "--zstd" in flags and not shutil.which("zstd"):
        raise HpcyoloError(f"stage: {archive}: reading a .tar.zst needs the zstd program, which is not on PATH")
    argv = ["tar", *flags, *args, "-f", str(archive)]
    try:
        r = subprocess.run(argv, capture_output=True, check=False, env={**os.environ, "LC_ALL": "C"})
    except FileNotFoundError:
        raise HpcyoloError("stage: unpacking an archive needs GNU tar, which is not on PATH") from None
    if r.returncode != 0:  # the first complaint is the cause; the last is "Exiting with failure status..."
        why = [ln for ln in r.stderr.decode(errors="replace").splitlines() if ln.strip()
               and "Exiting with failure status" not in ln] or ["no message"]
        more = f" (and {len(why) - 1} more messages)" if len(why) > 1 else ""
        raise HpcyoloError(f"stage: tar {args[0]} {archive} failed (exit {r.returncode}): {why[0]}{more}")
    return r.stdout


def list_archive(archive: Path, flags: tuple[str, ...]) -> Manifest:
    """The archive's members, from `tar --list --verbose` (C speed: Python's
    tarfile takes longer to read the headers than tar takes to unpack them).
    A compressed archive is decompressed once for this: the price of knowing
    its size before writing anything."""
    out = _tar(archive, flags, "--list", "--verbose", "--numeric-owner", "--full-time", "--quoting-style=c")
    m = Manifest()
    dirs: set[str] = set()
    for line in out.decode("utf-8", "surrogateescape").splitlines():
        match = _LISTING.match(line)
        if not match:
            raise HpcyoloError(f"stage: {archive}: cannot read this line of tar's listing: {shown(line)}")
        kind, name = match["type"], _member_name(archive, _unquote(match["name"]))
        if not name:
            continue
        if kind == "d":
            dirs.add(name)
        elif kind == "-":
            m.files[name] = int(match["size"])
        elif kind == "l":
            m.links[name] = _unquote(match["target"])
        elif kind == "h":  # a hard link: the same bytes as an earlier member
            target = _member_name(archive, _unquote(match["target"]))
            if target in m.links:
                m.links[name] = m.links[target]
            else:
                m.files[name] = m.files.get(target, 0)
        else:
            raise HpcyoloError(f"stage: {archive}: member {name} is not a file, folder or symlink")
    for parent in {p.rpartition("/")[0] for p in [*m.files, *m.links, *dirs]}:  # folders implied, not listed
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    m.dirs = sorted(dirs)
    return m


def _member_name(archive: Path, name: str) -> str:
    name = name.rstrip("/")
    while name.startswith("./"):
        name = name[2:]
    name = "" if name == "." else name
    if name.startswith("/") or ".." in name.split("/"):
        raise HpcyoloError(f"stage: {archive}: member {name} would land outside the destination; refusing it")
    return name


def archive_yaml(archive: Path, m: Manifest) -> str:
    """The member path of the one data YAML at the archive's top level (or
    inside its only top-level folder, as `tar -cf coco8.tar coco8` makes)."""
    def yamls(prefix: str) -> list[str]:
        return sorted(p for p in m.files if p.startswith(prefix) and "/" not in p[len(prefix):]
                      and p.lower().endswith((".yaml", ".yml")))

    found = yamls("")
    tops = {p.split("/")[0] for p in [*m.files, *m.links, *m.dirs]}
    if not found and len(tops) == 1 and next(iter(tops)) in m.dirs:
        found = yamls(f"{next(iter(tops))}/")
    if len(found) != 1:
        what = "no data YAML" if not found else f"{len(found)} YAML files ({', '.join(found)})"
        raise HpcyoloError(f"stage: {archive}: found {what} at its top level; the archive must hold the dataset "
                           "with exactly one data YAML (path:, train:, val:, names:) at the top")
    return found[0]


# == the source and its identity =============================================

class Source:
    def __init__(self, path: Path, flags: tuple[str, ...] | None, identity: dict, root: Path | None = None,
                 spec: dict | None = None) -> None:
        self.path = path  # the data YAML, or the archive
        self.flags = flags  # tar options of an archive; None for a YAML
        self.identity = identity  # what the marker records: see staged.source_identity
        self.root = root  # the dataset root of a YAML
        self.spec = spec


def resolve_source(data: str | Path) -> Source:
    path = Path(os.path.abspath(data))
    flags = archive_flags(path)
    try:
        st = path.stat()
    except OSError as e:
        raise HpcyoloError(f"stage: {path}: {e.strerror}") from None
    if flags is not None:
        if not stat.S_ISREG(st.st_mode):
            raise HpcyoloError(f"stage: {path}: not a file")
        return Source(path, flags, source_identity(str(path)))
    spec = read_data_yaml(path)
    root = dataset_root(path, spec)
    if not root.is_dir():
        raise HpcyoloError(f"{path}: dataset root {root} is not a directory")
    _relocated_splits(path, spec, root)  # fail early on splits outside the root
    named = path.parent / (spec.get("path") or ".")  # the root before resolving symlinks
    identity = source_identity(str(path), str(named), _watched(path, spec, root))
    return Source(path, None, identity, root, spec)


def _watched(data_yaml: Path, spec: dict, root: Path) -> set[str]:
    """The folders whose mtimes the marker records, relative to the root: the
    root, each split's folder and its labels twin, and their parents up to
    the root. A handful of stats that notice an added, removed or renamed file
    in any of them, without walking the tree. (A file rewritten in place is
    not noticed: touch the data YAML after that.)"""
    watched = {"."}
    for _, entry in split_entries(data_yaml, spec):
        rel = os.path.relpath(os.path.normpath(os.path.join(root, entry)), root)
        head, sep, tail = f"/{rel}".rpartition("/images/")
        for p in {rel, f"{head}/labels/{tail}".lstrip("/")} if sep else {rel}:
            while p not in ("", "."):
                watched.add(p)
                p = os.path.dirname(p)
    return watched


# == stage ===================================================================

def stage(data: str | Path, dest: str | Path, *, workers: int | None = None) -> Path:
    """Stage `data` (a data YAML or a tar archive) into `dest` unless this
    node already holds a current copy; returns the staged data YAML.
    `workers`: processes that stat and copy the files (None: one per CPU,
    2 to 16, for 1024 files or more)."""
    dest = Path(os.path.abspath(dest))
    marker = current_marker(data, dest)  # a requeued job: no lock, no YAML
    if marker is not None:
        claim(dest)
        say(already_staged(data, dest, marker))
        return dest / "data.yaml"
    source = resolve_source(data)
    _check_apart(source, dest)
    lock_path = dest.parent / f".{dest.name}.lock"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock_path.touch()
    except OSError as e:
        raise HpcyoloError(f"stage: cannot create {lock_path}: {e.strerror}") from None
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other tasks on this node wait here
        claim(dest)
        remove_stale(dest)  # under the lock, our own run folder made: never two sweeps at once
        marker = read_marker(dest)
        if is_current(marker, data, dest):  # another task staged it while we waited
            say(already_staged(data, dest, marker))
            return dest / "data.yaml"
        _clear(dest, stale=marker is not None)
        return _copy(source, dest, workers)


def remove_stale(dest: Path) -> list[Path]:
    """Remove the scratch folders beside DEST's run folder (this user's, in
    hpcyolo's layout) whose recorded Slurm job has ended: what a job killed
    outright, or on a node that went away, left in node memory. A folder
    whose job Slurm still knows as pending or running (a requeue) stays, and
    so does every folder when Slurm cannot be asked."""
    run = dest.parent
    if not run.parent.name.startswith("hpcyolo-") or not os.environ.get("SLURM_JOB_ID") or not run.parent.is_dir():
        return []
    from hpcyolo_trainer.errors import SlurmError

    from . import slurm

    removed = []
    for folder in run.parent.iterdir():
        owner = folder / OWNER
        try:
            if folder == run or owner.stat().st_uid != os.getuid():
                continue
            job = owner.read_text().strip()
        except OSError:  # no record, or another task removed the folder meanwhile
            continue
        try:
            state = slurm.show_job(int(job)).get("JobState", "")
        except ValueError:
            continue
        except SlurmError as e:
            if "Invalid job id" not in str(e):
                return removed  # Slurm cannot say: keep everything
            state = "forgotten"
        if state in slurm.FINAL_STATES or state == "forgotten":
            remove(folder)
            say(f"removed {folder}, node-local scratch of job {job}, which has ended ({state.lower()}), "
                f"on {node_name()}")
            removed.append(folder)
    return removed


def _check_apart(source: Source, dest: Path) -> None:
    here = os.path.realpath(dest)
    there = os.path.realpath(source.root if source.root is not None else source.path)
    if _inside(there, here) or source.root is not None and _inside(here, there):
        raise HpcyoloError(f"stage: {dest} and the dataset {there} overlap; choose a --dest outside it")


def _clear(dest: Path, stale: bool) -> None:
    """Remove what a stale copy or a killed stage left (we hold the lock)."""
    for partial in dest.parent.glob(f".{glob_escape(dest.name)}.partial-*"):
        shutil.rmtree(partial, ignore_errors=True)
    if dest.is_symlink() or dest.exists() and not dest.is_dir():
        raise HpcyoloError(f"stage: {dest} exists and is not a folder")
    if dest.exists():
        if not stale and any(dest.iterdir()):
            raise HpcyoloError(f"stage: {dest} exists and is not a staged copy (no {MARKER}); "
                               "remove it or choose another --dest")
        if stale:
            say(f"{dest} holds an out-of-date copy (the source changed); staging again on {node_name()}")
        shutil.rmtree(dest)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _copy(source: Source, dest: Path, workers: int | None) -> Path:
    partial = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    restore = _exit_on_sigterm()
    try:
        os.mkdir(partial)
        staged = _copy_archive(source, dest, partial, workers) if source.flags is not None else \
            _copy_tree_source(source, dest, partial, workers)
        os.replace(partial, dest)
    except OSError as e:
        raise HpcyoloError(f"stage: copying {source.path} to {dest} on {node_name()} failed: "
                           f"{e.filename or ''}{': ' if e.filename else ''}{e.strerror}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        restore()
    return staged


def _exit_on_sigterm():
    """scancel and the time limit send SIGTERM: unwind (removing the partial
    copy, which on a tmpfs holds the node's memory) instead of dying on the
    spot. Returns what puts the old handler back."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, old)


def _copy_tree_source(source: Source, dest: Path, partial: Path, workers: int | None) -> Path:
    root, spec = source.root, source.spec
    assert root is not None and spec is not None
    _check_list_files(source.path, spec, root)
    start = time.monotonic()
    m = walk(root, workers)
    _check_space(dest, m)
    outside = [p for p, target in m.links.items() if _escapes(p, target)]
    if outside:
        say(f"note: {len(outside)} symlink(s) point outside {root} (first: {outside[0]} -> {m.links[outside[0]]}); "
            "they are copied as links, so training reads their targets from where they are")
    say(f"copying {root} ({len(m.files)} files, {m.nbytes / 1e6:.1f} MB) to {dest} on {node_name()}")
    os.mkdir(partial / "dataset")
    _verify(m, copy_tree(root, partial / "dataset", m, workers), dest)
    text = source.path.read_text(encoding="utf-8")
    staged_root = dest / "dataset"
    _finish(source, dest, partial, _staged_yaml_text(text, spec, staged_root,
                                                     _relocated_splits(source.path, spec, root)), m, start)
    return dest / "data.yaml"


def _escapes(link: str, target: str) -> bool:
    """Whether a symlink at `link` (relative to the root) leads out of the root."""
    return os.path.isabs(target) or os.path.normpath(os.path.join(os.path.dirname(link), target)).startswith("..")


def _copy_archive(source: Source, dest: Path, partial: Path, workers: int | None) -> Path:
    start = time.monotonic()
    m = list_archive(source.path, source.flags or ())
    member = archive_yaml(source.path, m)
    _check_space(dest, m)
    say(f"unpacking {source.path} ({len(m.files)} files, {m.nbytes / 1e6:.1f} MB) to {dest} on {node_name()}")
    os.mkdir(partial / "dataset")
    # -m: fresh mtimes (no utime per file, no clock-skew warnings); owners are
    # the user's, whoever packed the archive.
    _tar(source.path, source.flags or (), "--extract", "-m", "--no-same-owner", "-C", str(partial / "dataset"))
    _verify(m, walk(partial / "dataset", workers), dest)
    real = Path(os.path.realpath(partial))  # dataset_root() resolves symlinks
    yaml_path = real / "dataset" / member
    spec = read_data_yaml(yaml_path)
    top = yaml_path.parent
    root = dataset_root(yaml_path, spec)
    if not (_inside(str(root), str(top)) and root.is_dir()):
        # An absolute or escaping `path:` names where the dataset lay when it
        # was packed; in the archive, its top level is the root.
        say(f"note: {source.path}: `path: {spec.get('path')}` of {member} is not a folder inside the archive; "
            "using the archive's top level as the dataset root")
        root = top
    name = Path(f"{source.path}:{member}")  # for messages
    splits = _relocated_splits(name, spec, root)
    _check_list_files(name, spec, root)
    staged_root = Path(os.path.normpath(dest / os.path.relpath(root, real)))
    text = yaml_path.read_text(encoding="utf-8")
    _finish(source, dest, partial, _staged_yaml_text(text, spec, staged_root, splits), m, start)
    return dest / "data.yaml"


def _verify(want: Manifest, got: Manifest, dest: Path) -> None:
    problem = first_difference(want, got)
    if problem:
        raise HpcyoloError(f"stage: the copy in {dest} on {node_name()} does not match the source: {problem}; "
                           "the partial copy was removed")


def _finish(source: Source, dest: Path, partial: Path, yaml_text: str, m: Manifest, start: float) -> None:
    """Write the staged YAML, then the marker: the copy counts from here on."""
    (partial / "data.yaml").write_text(yaml_text, encoding="utf-8")
    seconds = time.monotonic() - start
    marker = {"source": source.identity, "files": len(m.files), "links": len(m.links), "dirs": len(m.dirs),
              "bytes": m.nbytes, "seconds": round(seconds, 3), "node": node_name(),
              "staged_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (partial / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    say(f"staged {len(m.files)} files, {m.nbytes / 1e6:.1f} MB in {seconds:.2f} s "
        f"({m.nbytes / 1e6 / max(seconds, 1e-9):.0f} MB/s) to {dest} on {node_name()}; data YAML {dest / 'data.yaml'}")


def _check_space(dest: Path, m: Manifest) -> None:
    """Fail before writing anything if the copy cannot fit, in bytes or inodes."""
    where = dest.parent
    vfs = os.statvfs(where)
    need = m.blocks_bytes(vfs.f_frsize or 4096)
    need += int(need * MARGIN_FRACTION) + MARGIN_BYTES
    free = shutil.disk_usage(where).free
    fs = _mount_point(where)
    if need > free:
        raise HpcyoloError(f"stage: {dest} needs {need / GiB:.2f} GiB, only {free / GiB:.2f} GiB free on {fs} "
                           f"(node {node_name()})")
    inodes = len(m.files) + len(m.links) + len(m.dirs) + 8
    if vfs.f_files and inodes > vfs.f_favail:
        raise HpcyoloError(f"stage: {dest} needs {inodes} inodes, only {vfs.f_favail} free on {fs} "
                           f"(node {node_name()})")


def _mount_point(path: Path) -> str:
    path = Path(os.path.realpath(path))
    while not os.path.ismount(path):
        path = path.parent
    return str(path)
