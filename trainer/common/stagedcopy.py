"""A staged copy in node-local scratch, as every command sees it: its
completion marker, whether it is current, the Slurm job that uses it, and its
removal. Standard library only.

A requeued job runs `hpcyolo stage` again on a node that already holds the
copy; the console entry point (hpcyolo.entry) answers that from here with a
few stats and one small JSON read, before it imports click or the YAML
parser. What "current" means is defined here, once: hpcyolo.node.stage asks
`current_marker` too, before it parses anything and again under its lock.
The trainer removes the node's scratch with `remove` when the job ends.
"""

from __future__ import annotations

import json
import os
import sys

MARKER = ".hpcyolo-staged"
# In a run's scratch folder (SCRATCH/hpcyolo-USER/RUN, the copy at RUN/data):
# the Slurm job using it. A later stage on the node removes folders whose job
# has ended (hpcyolo.node.stage.remove_stale): a job killed outright leaves its
# copy behind, node memory taken from the next user.
OWNER = ".hpcyolo-job"
FORMAT = 2  # bump when the staged layout or the source identity changes: older copies are then staged again



def claim(dest: str | os.PathLike) -> None:
    """Record this Slurm job as the user of DEST's run scratch folder (only
    in hpcyolo's layout, SCRATCH/hpcyolo-USER/RUN/data, inside a job)."""
    job = os.environ.get("SLURM_JOB_ID")
    run = os.path.dirname(os.path.abspath(dest))
    if job and os.path.basename(os.path.dirname(run)).startswith("hpcyolo-"):
        owner = os.path.join(run, OWNER)
        with open(f"{owner}.{os.getpid()}", "w") as f:
            f.write(job + "\n")
        os.replace(f"{owner}.{os.getpid()}", owner)


# == the completion marker ===================================================

def source_identity(path: str, root: str | None = None, watched=()) -> dict:
    """What a staged copy records of its source, from stats alone: the size
    and mtime of the archive or data YAML `path` (absolute); for a YAML also
    its dataset root as `path:` names it, where that leads (symlinks
    resolved), and the mtimes of the `watched` folders under it (relative
    paths, None for a missing one). An unchanged YAML names the same root and
    folders, so stat'ing again what a marker records tells whether it is
    current, without reading the YAML."""
    st = os.stat(path)
    identity = {"format": FORMAT, "yaml" if root is not None else "archive": path, "size": st.st_size,
                "mtime_ns": st.st_mtime_ns}
    if root is not None:
        real = os.path.realpath(root)
        mtimes = {rel: _mtime(os.path.join(real, rel)) for rel in sorted(watched)}
        identity.update(root=root, realpath=real, mtimes=mtimes)
    return identity


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def read_marker(dest: str | os.PathLike) -> dict | None:
    """DEST's marker, None if there is none (or it is unreadable). It is
    written inside the copy before the copy is renamed into place, so a marker
    at DEST means a complete copy: no lock is needed to read it."""
    try:
        with open(os.path.join(dest, MARKER), "rb") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_current(marker: dict | None, data: str | os.PathLike, dest: str | os.PathLike) -> bool:
    """Whether `marker` (DEST's) records a copy of `data` as it is now."""
    source = marker.get("source") if marker else None
    if not isinstance(source, dict) or source.get("format") != FORMAT:
        return False
    root, mtimes = source.get("root"), source.get("mtimes", {})
    if "yaml" in source and not (isinstance(root, str) and isinstance(mtimes, dict)):
        return False
    try:
        now = source_identity(os.path.abspath(data), root if "yaml" in source else None, mtimes)
    except (OSError, TypeError, ValueError):  # gone, or a marker not written by us
        return False
    return now == source and os.path.isfile(os.path.join(dest, "data.yaml"))


def current_marker(data: str | os.PathLike, dest: str | os.PathLike) -> dict | None:
    """DEST's marker if DEST holds a current copy of `data`, else None."""
    marker = read_marker(os.path.abspath(dest))
    return marker if is_current(marker, data, dest) else None


def already_staged(data: str | os.PathLike, dest: str | os.PathLike, marker: dict) -> str:
    return (f"{os.path.abspath(dest)} already staged on {node_name()} ({marker.get('files')} files from "
            f"{os.path.abspath(data)})")


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def say(message: str) -> None:
    print(f"hpcyolo stage: {message}", file=sys.stderr, flush=True)


def remove(dest: str | os.PathLike) -> None:
    """Remove a staged copy (or a whole scratch folder) and its lock file; a
    missing one is fine."""
    dest = os.path.abspath(dest)
    parent, name = os.path.split(dest)
    if not name:
        from .errors import HpcyoloError

        raise HpcyoloError(f"stage: refusing to remove {dest}")
    import shutil  # here: the fast path of `hpcyolo stage` never removes

    shutil.rmtree(dest, ignore_errors=True)
    try:
        os.unlink(os.path.join(parent, f".{name}.lock"))
    except FileNotFoundError:
        pass
    if os.path.basename(parent).startswith("hpcyolo-"):  # the user's folder in hpcyolo's layout, once empty
        try:
            os.rmdir(parent)
        except OSError:
            pass  # another run of the user's is there


def dataset_of(data: str) -> str:
    """The dataset a data YAML stands for: a staged copy's source (its
    marker names it), else the path made absolute. The ranks of a staged job
    read a copy in node-local scratch whose path is not the dataset's."""
    source = (read_marker(os.path.dirname(os.path.abspath(data))) or {}).get("source") or {}
    return source.get("yaml") or source.get("archive") or os.path.abspath(data)
