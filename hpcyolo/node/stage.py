"""Copy a dataset into node-local scratch, once per node.

Many small files on Lustre or NFS are slow to read (DESIGN.md, section 4), so
the batch script runs `hpcyolo stage` as one task per node before training:

    DEST/.hpcyolo-staged   completion marker (JSON: source identity, counts)
    DEST/data.yaml         the source's data YAML with `path:` set to the copy
    DEST/dataset/          the dataset root (a tree), or the unpacked archive

The source is a data YAML (its dataset root is copied), a classification
dataset's folder (train/CLASS, val/CLASS: copied whole, DEST/data.yaml then
`folders: true` and its `path:`) or a tar archive holding the dataset with one
data YAML at its top level. The copy is built under a
temporary name next to DEST, checked against the source's manifest (the same
relative paths, file sizes and symlink targets), and renamed into place with
its marker inside, so a directory at DEST is always complete. An exclusive
lock next to DEST makes other tasks on the node wait for the one copying; a
later stage of the same source (a requeued job on the same node) finds the
marker and returns at once. The marker records what was stat'ed of the source;
whether a copy is still current is decided in hpcyolo_trainer.common.stagedcopy, which the
`hpcyolo` command asks before importing this module (or yaml, or click).

A stop while staging: the site's preemption signal, or a SIGTERM that Slurm
says is a preemption, a requeue or the time limit (the trainer's rule:
hpcyolo.node.slurm_stop), removes the partial copy, leaves the preemption
marker (HPCYOLO_PREEMPT_MARKER) and exits EXIT_CODE (75): the batch script
then requeues the job as after a checkpoint, and the next start stages again
from the beginning (a copy counts only once it is complete and checked).
Any other SIGTERM (scancel) removes the partial copy and exits 143.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

from hpcyolo_trainer.common.datayaml import (
    FOLDERS,
    SPLITS,
    classify_splits,
    classify_spec,
    archive_flags,
    data_spec,
    dataset_root,
    read_data_yaml,
    split_entries,
)
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.preemption import EXIT_CODE, mark_preempted
from hpcyolo_trainer.common.stagedcopy import (
    MARKER,
    OWNER,
    already_staged,
    claim,
    current_marker,
    is_current,
    node_name,
    read_marker,
    remove,
    say,
    source_identity,
)
from hpcyolo_trainer.common.yamlfile import dump_yaml, loads

from hpcyolo.node.archive import archive_yaml, list_archive, run_tar, scan_tar
from hpcyolo.node.treecopy import Manifest, copy_tree, first_difference, walk

# Room left free after the copy: filesystem overhead, the staged YAML, and (on
# a tmpfs) memory the training processes still need.
MARGIN_BYTES = 64 << 20
MARGIN_FRACTION = 0.02
GiB = 1 << 30
# A drill for tests: a file; while it exists, a stage that copies waits once
# its files are copied, before the copy is checked and put in place (a job
# can then be signalled while it stages, however small its dataset).
STALL_ENV = "HPCYOLO_DRILL_STAGE_STALL"


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
    if stat.S_ISDIR(st.st_mode):  # a classification dataset's class folders: the folder is the root
        classify_spec(path, listed=False)  # a bad layout stops here, in one line
        watched = {"."} | {os.path.relpath(where, path) for where in classify_splits(path).values()}
        watched |= {os.path.join(split, e.name) for split in set(watched) - {"."} for e in os.scandir(path / split)
                    if e.is_dir()}
        return Source(path, None, source_identity(str(path), str(path), watched), path, {FOLDERS: True})
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

def stage(data: str | Path, dest: str | Path, *, workers: int | None = None, signal: str | None = None) -> Path:
    """Stage `data` (a data YAML or a tar archive) into `dest` unless this
    node already holds a current copy; returns the staged data YAML.
    `workers`: processes that stat and copy the files (None: one per CPU,
    2 to 16, for 1024 files or more). `signal`: the site's preemption signal
    (USR2, ...): it stops the stage for a requeue (SystemExit(EXIT_CODE)),
    as a SIGTERM does when Slurm is preempting, requeueing or timing out."""
    dest = Path(os.path.abspath(dest))
    marker = current_marker(data, dest)  # a requeued job: no lock, no YAML
    if marker is not None:
        claim(dest)
        say(already_staged(data, dest, marker))
        return dest / "data.yaml"
    with _stops(signal, dest):
        return _stage_locked(data, dest, workers)


def _stage_locked(data: str | Path, dest: Path, workers: int | None) -> Path:
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


class _Stopped(BaseException):
    """Raised by the signal handler: unwind (the partial copy is removed on
    the way), then exit EXIT_CODE for a requeue."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@contextlib.contextmanager
def _stops(signal_name: str | None, dest: Path):
    """SIGTERM and the site's signal while staging. Unwinding, not dying on
    the spot, removes the partial copy, which on a tmpfs holds the node's
    memory. The site's signal, and a SIGTERM for which Slurm says the job is
    being preempted, requeued or timed out (what makes the trainer
    checkpoint), end in SystemExit(EXIT_CODE) with the preemption marker
    written: the batch script requeues. Another SIGTERM (scancel) ends in
    SystemExit(143). The copy's forked workers inherit the handler and let
    it be: their parent decides, and kills them as it unwinds."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()
    stopping: list[str] = []

    def handler(signum, frame):
        if os.getpid() != pid or stopping:  # a copy worker, or a second signal while unwinding
            return
        if signum == signal.SIGTERM:
            from hpcyolo_trainer.common.preemption import CHECKPOINT

            from hpcyolo.node.slurm_stop import sigterm_decision

            decision = sigterm_decision(os.environ)
            stopping.append(decision.reason)
            if decision.action != CHECKPOINT:
                raise SystemExit(128 + signum)
            raise _Stopped(decision.reason)
        stopping.append(f"SIG{signal_name}")
        raise _Stopped(stopping[0])

    signums = {signal.SIGTERM}
    if signal_name and signal_name != "TERM":
        signums.add(getattr(signal, f"SIG{signal_name}"))
    old = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    except _Stopped as e:
        mark_preempted(f"{e.reason} while staging, before the copy was complete")
        say(f"stopped by {e.reason} on {node_name()} before {dest} was complete; the partial copy was removed. "
            f"Exit {EXIT_CODE}: the job is requeued, and its next start stages again")
        raise SystemExit(EXIT_CODE) from None
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)


def remove_stale(dest: Path) -> list[Path]:
    """Remove the scratch folders beside DEST's run folder (this user's, in
    hpcyolo's layout) whose recorded Slurm job has ended: what a job killed
    outright, or on a node that went away, left in node memory. A folder
    whose job Slurm still knows as pending or running (a requeue) stays, and
    so does every folder when Slurm cannot be asked."""
    run = dest.parent
    if not run.parent.name.startswith("hpcyolo-") or not os.environ.get("SLURM_JOB_ID") or not run.parent.is_dir():
        return []
    from hpcyolo_trainer.common.errors import SlurmError

    from hpcyolo import slurm

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
    return staged


def _drill_stall() -> None:
    """STALL_ENV's drill: wait while its file exists."""
    path = os.environ.get(STALL_ENV)
    if path and os.path.exists(path):
        say(f"drill: the files are copied; waiting while {path} exists, before the copy is checked")
        while os.path.exists(path):
            time.sleep(0.1)


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
    copied = copy_tree(root, partial / "dataset", m, workers)
    _drill_stall()
    _verify(m, copied, dest)
    text = "" if spec.get(FOLDERS) else source.path.read_text(encoding="utf-8")  # a folder's: its mark alone
    staged_root = dest / "dataset"
    _finish(source, dest, partial, _staged_yaml_text(text, spec, staged_root,
                                                     _relocated_splits(source.path, spec, root)), m, start)
    return dest / "data.yaml"


def _escapes(link: str, target: str) -> bool:
    """Whether a symlink at `link` (relative to the root) leads out of the root."""
    return os.path.isabs(target) or os.path.normpath(os.path.join(os.path.dirname(link), target)).startswith("..")


def _copy_archive(source: Source, dest: Path, partial: Path, workers: int | None) -> Path:
    start = time.monotonic()
    # An uncompressed archive of plain members: its headers read here, the
    # files copied out of it by workers in parallel (tar -x is one process
    # that moves every byte twice). Anything else: GNU tar lists and unpacks.
    scanned = scan_tar(source.path) if not source.flags else None
    m, offsets = scanned or (list_archive(source.path, source.flags or ()), None)
    member = archive_yaml(source.path, m)
    _check_space(dest, m)
    say(f"unpacking {source.path} ({len(m.files)} files, {m.nbytes / 1e6:.1f} MB) to {dest} on {node_name()}")
    os.mkdir(partial / "dataset")
    if offsets is not None:
        copied = copy_tree(source.path, partial / "dataset", m, workers, offsets)
    else:
        # -m: fresh mtimes (no utime per file, no clock-skew warnings); owners
        # are the user's, whoever packed the archive.
        run_tar(source.path, source.flags or (), "--extract", "-m", "--no-same-owner", "-C",
                str(partial / "dataset"))
    _drill_stall()
    _verify(m, copied if offsets is not None else walk(partial / "dataset", workers), dest)
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
