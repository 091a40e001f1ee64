"""Imported by every Python process started with this folder on PYTHONPATH
(bench_startup.py, tests/trainer/test_data_index.py): logs each file that
Python opens under AUDIT_ROOT (the audit event `open`: builtins.open,
io.open, os.open, Pillow's files) to AUDIT_LOG as `RANK PID PATH` lines."""

import os
import sys

_root, _log = os.environ.get("AUDIT_ROOT"), os.environ.get("AUDIT_LOG")
if _root and _log:
    _fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith(_root):
                os.write(_fd, f"{os.environ.get('RANK', '0')} {os.getpid()} {path}\n".encode())

    sys.addaudithook(_hook)
