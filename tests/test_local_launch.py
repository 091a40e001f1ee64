"""The local launcher (hpcyolo.node.local) waits on its ranks' pidfds: it
wakes when a rank exits, not at the next tick of a poll."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hpcyolo.node import local


def test_the_wait_wakes_when_a_rank_exits_and_otherwise_after_a_second():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    exits = local._exit_fds([quick, slow])
    try:
        assert len(exits) == 2  # Linux 5.3 and later: pidfds
        start = time.monotonic()
        local._until_one_ends([quick, slow], exits)
        woke = time.monotonic() - start
        assert quick.poll() == 0 and woke < 0.9, woke  # at the exit, not the second's end
        start = time.monotonic()
        local._until_one_ends([quick, slow], exits)  # only the slow one is still running
        assert time.monotonic() - start >= 0.95 and slow.poll() is None
    finally:
        slow.kill()
        slow.wait()
        for fd in exits.values():
            os.close(fd)


def test_a_failing_rank_stops_the_others_and_its_code_is_returned():
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '1': sys.exit(3)\n"
            "time.sleep(30)\n")
    start = time.monotonic()
    assert local.launch([sys.executable, "-c", code], 3, grace=5) == 3
    assert time.monotonic() - start < 10
