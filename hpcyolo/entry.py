"""The `hpcyolo` console command, and when a staged copy is current.

A requeued job runs `hpcyolo stage --data DATA --dest DEST` again on a node
that already holds the copy. The answer takes a few stats and one small JSON
read, while importing the click CLI and the YAML parser takes ten times as
long. So `main` reads that one command line itself, with nothing but os and
json: a current copy at DEST gets the usual "already staged" line and exit 0;
a first stage goes to stage() without click. Everything else, and any command
line it does not read exactly, goes to the click CLI (hpcyolo.cli) unchanged.

What "current" means is defined here, once: stage() asks `current_marker`
too, before it parses anything and again under its lock.
"""

from __future__ import annotations

import json
import os
import sys

MARKER = ".hpcyolo-staged"
# In a run's scratch folder (SCRATCH/hpcyolo-USER/RUN, the copy at RUN/data):
# the Slurm job using it. A later stage on the node removes folders whose job
# has ended (hpcyolo.stage.remove_stale): a job killed outright leaves its
# copy behind, node memory taken from the next user.
OWNER = ".hpcyolo-job"
FORMAT = 2  # bump when the staged layout or the source identity changes: older copies are then staged again


def main() -> int | None:
    """The console script: `hpcyolo ...`."""
    args = sys.argv[1:]
    if args[:1] == ["stage"]:
        known = _stage_args(args[1:])
        if known is not None:
            data, dest, workers = known
            marker = current_marker(data, dest)
            if marker is not None:
                claim(dest)
                say(already_staged(data, dest, marker))
                return 0
            if _plain(data, dest):
                _exit(_stage(data, dest, workers))
    from .cli import main as cli

    return cli()


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


def _stage_args(args: list[str]) -> tuple[str, str, int | None] | None:
    """`--data DATA --dest DEST [--workers N]` in any order, each once; None
    for anything else (--help, --remove, --data=X, ...), which click reads."""
    options = dict(zip(args[::2], args[1::2]))
    if len(args) % 2 or len(options) != len(args) // 2 or not {"--data", "--dest"} <= options.keys() or \
            not options.keys() <= {"--data", "--dest", "--workers"} or \
            any(not value or value.startswith("-") for value in options.values()):
        return None
    workers = options.get("--workers")
    if workers is not None and not (workers.isascii() and workers.isdigit() and int(workers) >= 1):
        return None
    return options["--data"], options["--dest"], None if workers is None else int(workers)


def _plain(data: str, dest: str) -> bool:
    """Whether click's own checks of --data and --dest would pass for sure: a
    readable file, and a missing or readable folder."""
    return os.path.isfile(data) and os.access(data, os.R_OK) and \
        (not os.path.lexists(dest) or os.path.isdir(dest) and os.access(dest, os.R_OK))


def _stage(data: str, dest: str, workers: int | None) -> int:
    """`hpcyolo stage` as the click command runs it (hpcyolo.cli), errors included."""
    from .errors import HpcyoloError, printable
    from .stage import stage

    try:
        stage(data, dest, workers=workers)
    except HpcyoloError as e:
        print(f"hpcyolo: error: {printable(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("\nAborted!", file=sys.stderr)
        return 1
    return 0


def _exit(code: int):  # NoReturn (typing costs an import)
    """Exit now: after a copy, the interpreter's teardown (freeing each object
    and module one by one, some 10 ms) is work for nothing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
