"""The `hpcyolo` console command.

A requeued job runs `hpcyolo stage --data DATA --dest DEST` again on a node
that already holds the copy. The answer takes a few stats and one small JSON
read, while importing the click CLI and the YAML parser takes ten times as
long. So `main` reads that one command line itself, with nothing but
hpcyolo_trainer.common.stagedcopy (os and json): a current copy at DEST gets the usual "already
staged" line and exit 0; a first stage goes to stage() without click.
`hpcyolo render SITE JOB` (no option) runs hpcyolo.login.edge.render without
click either: on a login node, click and the other commands' modules were a
third of its time. Everything else, and any command line it does not read
exactly, goes to the click CLI (hpcyolo.cli) unchanged.

What "current" means is defined in hpcyolo_trainer.common.stagedcopy, once: stage() asks
`current_marker` too, before it parses anything and again under its lock.
"""

from __future__ import annotations

import os
import sys

from hpcyolo_trainer.common.stagedcopy import already_staged, claim, current_marker, say


def main() -> int | None:
    """The console script: `hpcyolo ...`."""
    args = sys.argv[1:]
    if args[:1] == ["stage"]:
        known = _stage_args(args[1:])
        if known is not None:
            data, dest, workers, signal = known
            marker = current_marker(data, dest)
            if marker is not None:
                claim(dest)
                say(already_staged(data, dest, marker))
                return 0
            if _plain(data, dest) and _handled(signal):
                _exit(_stage(data, dest, workers, signal))
    if args[:1] == ["render"] and len(args) == 3 and not any(a.startswith("-") for a in args[1:]):
        _exit(_render(args[1], args[2]))
    from hpcyolo.cli import main as cli

    return cli()


def _stage_args(args: list[str]) -> tuple[str, str, int | None, str | None] | None:
    """`--data DATA --dest DEST [--workers N] [--signal NAME]` in any order,
    each once; None for anything else (--help, --remove, --data=X, ...),
    which click reads."""
    options = dict(zip(args[::2], args[1::2]))
    if len(args) % 2 or len(options) != len(args) // 2 or not {"--data", "--dest"} <= options.keys() or \
            not options.keys() <= {"--data", "--dest", "--workers", "--signal"} or \
            any(not value or value.startswith("-") for value in options.values()):
        return None
    workers = options.get("--workers")
    if workers is not None and not (workers.isascii() and workers.isdigit() and int(workers) >= 1):
        return None
    return options["--data"], options["--dest"], None if workers is None else int(workers), options.get("--signal")


def _plain(data: str, dest: str) -> bool:
    """Whether click's own checks of --data and --dest would pass for sure: a
    readable file, and a missing or readable folder."""
    return os.path.isfile(data) and os.access(data, os.R_OK) and \
        (not os.path.lexists(dest) or os.path.isdir(dest) and os.access(dest, os.R_OK))


def _handled(signal: str | None) -> bool:
    """Whether click's check of --signal would pass (a first stage only: the
    settings' table costs imports that a requeued job's answer does without)."""
    from hpcyolo_trainer.common.settings import SIGNALS

    return signal is None or signal in SIGNALS


def _stage(data: str, dest: str, workers: int | None, signal: str | None) -> int:
    """`hpcyolo stage` as the click command runs it (hpcyolo.cli), errors included."""
    from hpcyolo.node.stage import stage

    return _as_click_would(lambda: stage(data, dest, workers=workers, signal=signal))


def _render(site: str, job: str) -> int:
    """`hpcyolo render SITE JOB` as the click command runs it (hpcyolo.cli), errors included."""
    import gc
    import io

    # A process that ends once the script is written (_exit): the cyclic collector's 30 passes over
    # what importing jinja2, yaml and the schema makes (4 ms of 90) would free a few hundred objects.
    gc.disable()

    from hpcyolo.login.edge import render

    if isinstance(sys.stdout, io.TextIOWrapper):  # paths as the bytes they are (hpcyolo.cli.group.main)
        sys.stdout.reconfigure(errors="surrogateescape")
    return _as_click_would(lambda: render(site, job))


def _as_click_would(command) -> int:
    """Run `command` and return the exit code, its errors said as the click
    group says them (hpcyolo.cli.group): one line, or Aborted! on Ctrl-C."""
    from hpcyolo_trainer.common.errors import HpcyoloError, printable

    try:
        command()
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
