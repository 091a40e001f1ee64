"""File writes that are all-or-nothing: a reader sees the old file or the
new one, never half of one (temp file in the same directory, fsync, rename)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


@contextmanager
def atomic_file(path: str | Path, mode: int = 0o666) -> Iterator[BinaryIO]:
    """An open binary file that becomes `path` only if the block finishes.

    The temporary file is created with `mode` (the umask applies, as for
    open(); mkstemp would make it 0600, and a group sharing a run directory
    could not read the weights). A failed block leaves no file behind; a
    killed process leaves a `.NAME.*.tmp`, which readers ignore."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
