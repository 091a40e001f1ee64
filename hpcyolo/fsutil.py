"""File writes that are all-or-nothing: a reader sees the old file or the
new one, never half of one (temp file in the same directory, fsync, rename)."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


def _read_umask() -> int:
    # Read once, at import (single-threaded): os.umask() can only be read by
    # setting it, which would race with the background checkpoint writer.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()


@contextmanager
def atomic_file(path: str | Path, mode: int = 0o666) -> Iterator[BinaryIO]:
    """An open binary file that becomes `path` only if the block finishes.

    mkstemp creates its file 0600; the result gets `mode` less the umask, as
    open() would give it, so a group sharing a run directory can read the
    weights. A failed block leaves no file behind (a killed process leaves a
    `.NAME.*.tmp`, which readers ignore)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode & ~UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: str | Path, data: bytes, mode: int = 0o666) -> None:
    with atomic_file(path, mode) as f:
        f.write(data)


def fsync_dir(path: str | Path) -> None:
    """Make a rename in `path` durable (POSIX: the directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
