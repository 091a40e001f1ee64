"""The local launcher (hpcyolo.node.local) waits on its ranks' pidfds: it
wakes when a rank exits, not at the next tick of a poll."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from hpcyolo.node import local


@pytest.fixture
def many_fds():
    """Descriptors 0..1100 taken, so that the pidfds are above select()'s 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), max(hard, 2048)))
    taken = []
    while not taken or taken[-1] < 1100:
        taken.append(os.open(os.devnull, os.O_RDONLY))
    yield
    for fd in taken:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_wait_wakes_when_a_rank_exits_and_otherwise_after_a_second(many_fds):
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    exits = local._exit_fds([quick, slow])
    try:
        assert len(exits) == 2 and min(exits.values()) > 1024  # Linux 5.3 and later: pidfds
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
