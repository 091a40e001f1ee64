"""Tar archives as `hpcyolo stage` reads them: GNU tar's verbose listing
parsed into a manifest (names with C escapes, sizes, link targets), and the
one data YAML at the archive's top level.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from hpcyolo.node.treecopy import Manifest
from hpcyolo_trainer.errors import HpcyoloError, shown

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


def run_tar(archive: Path, flags: tuple[str, ...], *args: str) -> bytes:
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
    out = run_tar(archive, flags, "--list", "--verbose", "--numeric-owner", "--full-time", "--quoting-style=c")
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
