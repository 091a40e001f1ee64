"""Copy a dataset into node-local scratch, once per node.

The copy is built under a temporary name and renamed into place with its
completion marker inside, so a directory at `dest` is always complete; an
exclusive lock makes other tasks on the same node wait for the one copying.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from pathlib import Path

import yaml

from .errors import HpcyoloError
from .fsutil import write_atomic

MARKER = ".hpcyolo-staged"


def dataset_root(data_yaml: Path, spec: dict) -> Path:
    """Ultralytics semantics: `path` is the root (relative to the YAML's
    folder); empty means the YAML's folder itself."""
    root = Path(spec.get("path") or ".")
    return root if root.is_absolute() else (data_yaml.parent / root).resolve()


def read_data_yaml(data_yaml: str | Path) -> dict:
    path = Path(data_yaml)
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise HpcyoloError(f"{path}: cannot read data YAML: {e}") from None
    if not isinstance(spec, dict):
        raise HpcyoloError(f"{path}: a data YAML must be a mapping")
    return spec


def stage(data_yaml: str | Path, dest: str | Path) -> Path:
    data_yaml, dest = Path(data_yaml), Path(dest)
    spec = read_data_yaml(data_yaml)
    root = dataset_root(data_yaml, spec)
    if not root.is_dir():
        raise HpcyoloError(f"{data_yaml}: dataset root {root} is not a directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other tasks on this node wait here
        if (dest / MARKER).exists():
            print(f"hpcyolo stage: {dest} already staged on {os.uname().nodename}", file=sys.stderr)
            return dest / "data.yaml"
        partial = dest.parent / f".{dest.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(root, partial / "dataset", symlinks=True)
        write_atomic(partial / "data.yaml", yaml.safe_dump({**spec, "path": str(dest / "dataset")}).encode())
        (partial / MARKER).write_text(f"{root}\n")
        shutil.rmtree(dest, ignore_errors=True)  # a copy without its marker is incomplete
        os.replace(partial, dest)
    print(f"hpcyolo stage: copied {root} to {dest} on {os.uname().nodename}", file=sys.stderr)
    return dest / "data.yaml"


def remove(dest: str | Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    Path(dest).parent.joinpath(f".{Path(dest).name}.lock").unlink(missing_ok=True)
