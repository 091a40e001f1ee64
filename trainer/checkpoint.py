"""Checkpoints: complete, atomic, discoverable (compare torchtitan).

A checkpoint is one file `ckpt-<global step>.pt` in RUN/checkpoints, written
to a temporary name, fsynced and renamed: a reader sees a whole file or none.
Resume takes the newest file that loads (torch.load(weights_only=True)) and
says it is complete; a corrupt or partial one is skipped with a warning.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Callable

import torch

from hpcyolo.fsutil import fsync_dir

FORMAT = 1
_NAME = re.compile(r"ckpt-(\d{9})\.pt")


def path_for(folder: Path, global_step: int) -> Path:
    return folder / f"ckpt-{global_step:09d}.pt"


def save(obj: dict, path: Path) -> None:
    """torch.save, all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def save_checkpoint(state: dict, folder: Path, keep: int) -> Path:
    path = path_for(folder, state["global_step"])
    save({**state, "format": FORMAT, "complete": True}, path)
    for old in checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


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
