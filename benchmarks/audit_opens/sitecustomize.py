"""Imported by every Python process started with this folder on PYTHONPATH
(bench_startup.py, tests/trainer/test_data_index.py): logs each file that
Python opens under AUDIT_ROOT (the audit event `open`: builtins.open,
io.open, os.open, Pillow's files) to AUDIT_LOG as `RANK PID PATH` lines,
and, where AUDIT_LISTS is set, each folder under AUDIT_ROOT that it lists
(os.scandir, os.listdir: what os.walk, glob and Path.iterdir use) to that
file, in the same form."""

import os
import sys

_root, _log, _lists = os.environ.get("AUDIT_ROOT"), os.environ.get("AUDIT_LOG"), os.environ.get("AUDIT_LISTS")
if _root and _log:
    _flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    _fd = os.open(_log, _flags, 0o644)
    _list_fd = os.open(_lists, _flags, 0o644) if _lists else None

    def _hook(event, args):
        if event == "open":
            fd = _fd
        elif event in ("os.scandir", "os.listdir") and _list_fd is not None:
            fd = _list_fd
        else:
            return
        if isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith(_root):
                os.write(fd, f"{os.environ.get('RANK', '0')} {os.getpid()} {path}\n".encode())

    sys.addaudithook(_hook)
