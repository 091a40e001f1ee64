"""Run many `hpcyolo` command lines cheaply: a server process that has
imported the CLI once and forks a child per command line.

Each child is the console script (hpcyolo.entry.main) as a fresh process
would run it, with sys.argv set, stdout and stderr on files of its own, the
caller's address-space limit and an alarm: what `hpcyolo` prints, its exit
code, a traceback or a signal come back as from a subprocess, without the
~0.15 s of interpreter start and imports per command line. Used by the
fuzzing test, which runs a few hundred of them.

Protocol (one JSON object per line): stdin gets
{"args": [...], "stdout": PATH, "stderr": PATH, "memory": BYTES, "seconds": S, "cwd": DIR};
stdout answers {"returncode": N} (negative: the signal that ended it).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import traceback


def child(request: dict) -> None:
    """In the forked child: run the command line and _exit with its code."""
    code = 1
    try:
        os.chdir(request["cwd"])
        for fd, key in ((1, "stdout"), (2, "stderr")):
            out = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        sys.argv = ["hpcyolo", *request["args"]]
        resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
        signal.alarm(request["seconds"])
        from hpcyolo.entry import main

        try:
            result = main()
            code = 0 if result is None else result
        except SystemExit as e:
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else (print(e.code, file=sys.stderr), 1)[1]
        except BaseException:  # noqa: BLE001  (as the interpreter would: the traceback, exit 1)
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    # Imported once, in the server: the children inherit them.
    import hpcyolo.cli
    import hpcyolo.entry
    import hpcyolo.login.edge

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"returncode": code}), flush=True)


if __name__ == "__main__":
    serve()
