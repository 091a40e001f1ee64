"""Tar archives as `hpcyolo stage` reads them: an uncompressed archive's
headers read here (the members' offsets: the copy then takes each file's
bytes straight from the archive, by several workers), any other archive
through GNU tar's verbose listing (names with C escapes, sizes, link targets)
and GNU tar itself; and the one data YAML at the archive's top level.
"""

from __future__ import annotations

import os
import re
import shutil
import zlib
from pathlib import Path

from hpcyolo_trainer.common.errors import HpcyoloError, shown

from hpcyolo.node.treecopy import Manifest

_LISTING = re.compile(r'^(?P<type>.)\S* \S+ +(?P<size>\d+|\d+, *\d+) \S+ \S+ +"(?P<name>(?:[^"\\]|\\.)*)"'
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


BLOCK = 512
_WINDOW = 1 << 16  # bytes read at once after a small member: the next few headers likely within
_REGULAR, _DIR, _SYMLINK = frozenset(b"07\0"), ord("5"), ord("2")


class Unusual(Exception):
    """A header scan_tar leaves to GNU tar: what that means is tar's call."""


def scan_tar(archive: Path) -> tuple[Manifest, dict[str, int]] | None:
    """An uncompressed tar archive's manifest (with by_dir filled, as walk()
    fills it) and where each file's bytes start, from its headers alone; None
    where the archive holds anything beyond regular files, folders and
    symlinks named once each (hard links, sparse files, global or unknown
    pax keys, a bad checksum, ...): GNU tar unpacks those (list_archive),
    with its own rules and messages. Formats: v7, ustar, GNU (long names),
    pax (path, linkpath, size)."""
    try:
        fd = os.open(archive, os.O_RDONLY)
    except OSError as e:
        raise HpcyoloError(f"stage: cannot read {archive}: {e.strerror}") from None
    try:
        return _scan(archive, fd, os.fstat(fd).st_size)
    except Unusual:
        return None
    except OSError as e:
        raise HpcyoloError(f"stage: cannot read {archive}: {e.strerror}") from None
    finally:
        os.close(fd)


def _scan(archive: Path, fd: int, end: int) -> tuple[Manifest, dict[str, int]]:
    m, offsets, dirs = Manifest(), {}, set()
    pread, adler32, window, at, size = os.pread, zlib.adler32, b"", 0, 0
    pos, long_name, long_link, pax = 0, None, None, {}
    while True:
        if pos + BLOCK > end:
            raise Unusual  # no end-of-archive blocks: tar says what is wrong
        if not at <= pos <= at + len(window) - BLOCK:
            window, at = pread(fd, BLOCK if size >= _WINDOW // 4 else _WINDOW, pos), pos
        h = window[pos - at:pos - at + BLOCK]
        if h.count(0) == BLOCK:
            break  # the end (tar stops at the first zero block too)
        # The checksum: the header's byte sum with its own field as spaces;
        # modulo 65521, as adler32 sums in C (sum() takes 10x as long).
        if ((adler32(h) & 0xFFFF) - 1 - sum(h[148:156]) + 256 - _octal(h[148:156])) % 65521:
            raise Unusual
        kind, size = h[156], _size(h[124:136])
        data = pos + BLOCK
        pos = data + -(-size // BLOCK) * BLOCK
        if kind in b"LKx":  # a GNU long name or link, a pax header: for the next member
            if size > 1 << 20 or data + size > end:
                raise Unusual
            text = pread(fd, size, data)
            if kind == ord("L"):
                long_name = text.split(b"\0", 1)[0]
            elif kind == ord("K"):
                long_link = text.split(b"\0", 1)[0]
            else:
                pax = _pax(text)
            continue
        raw = pax.get("path") or long_name or _name(h)
        target = pax.get("linkpath") or long_link or h[157:257].split(b"\0", 1)[0]
        if "size" in pax:
            size = int(pax["size"])
            pos = data + -(-size // BLOCK) * BLOCK
        long_name = long_link = None
        pax = {}
        if b"\0" in raw or b"\0" in target:
            raise Unusual
        name = _member_name(archive, os.fsdecode(raw))
        if kind in _REGULAR and not raw.endswith(b"/"):
            if not name or name in m.files or data + size > end:
                raise Unusual
            m.files[name] = size
            offsets[name] = data
            d, _, base = name.rpartition("/")
            mode, mtime = _octal(h[100:108]) & 0o7777, _octal(h[136:148]) * 10**9
            m.by_dir.setdefault(d, []).append((base, size, mode, mtime))
        elif kind == _DIR or kind in _REGULAR:  # (v7 marks a folder by its name's trailing /)
            if name:
                dirs.add(name)
        elif kind == _SYMLINK and name and name not in m.links:
            m.links[name] = os.fsdecode(target)
        else:
            raise Unusual
    m.dirs = _with_parents(dirs, m)
    if set(m.dirs) & (m.files.keys() | m.links.keys()) or m.files.keys() & m.links.keys():
        raise Unusual  # the same path twice, as different things
    return m, offsets


def _octal(field: bytes) -> int:
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise Unusual from None


def _size(field: bytes) -> int:
    if field[0] == 0x80:  # GNU's base-256, for 8 GiB and more
        return int.from_bytes(field[1:], "big")
    if field[0] & 0x80:
        raise Unusual
    return _octal(field)


def _name(h: bytes) -> bytes:
    name = h[:100].split(b"\0", 1)[0]
    if h[257:263] == b"ustar\0":  # POSIX ustar: a prefix (GNU's format uses these bytes otherwise)
        prefix = h[345:500].split(b"\0", 1)[0]
        if prefix:
            return prefix + b"/" + name
    return name


_PAX_KEYS = {"path", "linkpath", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "comment"}


def _pax(text: bytes) -> dict[str, bytes]:
    """A pax extended header's records ("LEN key=value\n"), of the keys that
    a plain member may carry; any other (sparse files, a binary charset) is
    unusual."""
    records, i = {}, 0
    while i < len(text) and text[i]:
        space = text.index(b" ", i)
        n = int(text[i:space])
        key, _, value = text[space + 1:i + n - 1].partition(b"=")
        key = key.decode("utf-8", "replace")
        if key not in _PAX_KEYS or not text[i + n - 1:i + n] == b"\n":
            raise Unusual
        records[key] = value
        i += n
    if "size" in records and not records["size"].isdigit():
        raise Unusual
    return {k: v.decode() if k == "size" else v for k, v in records.items()}


def _with_parents(dirs: set[str], m: Manifest) -> list[str]:
    """The folders listed and those implied by a member's path, parents first."""
    for parent in {p.rpartition("/")[0] for p in [*m.files, *m.links, *dirs]}:  # folders implied, not listed
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    return sorted(dirs)


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
    m.dirs = _with_parents(dirs, m)
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
