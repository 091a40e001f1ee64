"""What a stop means: the site's signal checkpoints and requeues; SIGTERM does
only when Slurm is in fact requeueing, preempting or timing out the job (the
`scontrol show job -o` lines here and in tests/slurm_output/ were recorded in
tasks of the testbed that got SIGTERM: a partition-priority preemption with
its grace, the requeue at the grace's end, a time limit without a signal);
a cancel stops. And the rendezvous keyed by the job: a rank
that reaches another job's store refuses to join it (real processes)."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcyolo.node.local import free_port
from hpcyolo.node.slurm_stop import sigterm_decision, slurm_stop_reason
from hpcyolo_trainer.common.preemption import CHECKPOINT, HOLD_ENV, NONE, STOP, Decision, StopFlag

STOP_ON_SIGTERM = Decision(STOP, "SIGTERM")

COMMON = ("JobId=14045994 JobName=job.sh UserId=root(0) GroupId=root(0) Priority=4294901757 Nice=0 {state} "
          "Requeue=1 {restarts} BatchFlag=1 Reboot=0 {times} Partition=debug NodeList=node[1-2] BatchHost=node1 "
          "NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 StdOut=/tmp/exp/sig/14045994.out")
CANCELLED = COMMON.format(state="JobState=COMPLETING Reason=None", restarts="Restarts=0",
                          times="RunTime=00:00:04 TimeLimit=365-00:00:00")
REQUEUED = COMMON.format(state="JobState=COMPLETING Reason=None", restarts="Restarts=1",
                         times="RunTime=00:00:00 TimeLimit=UNLIMITED")
RUNNING = COMMON.format(state="JobState=RUNNING Reason=None", restarts="Restarts=0",
                        times="RunTime=00:03:10 TimeLimit=01:00:00")
TIMED_OUT = COMMON.format(state="JobState=COMPLETING Reason=None", restarts="Restarts=0",
                          times="RunTime=00:02:00 TimeLimit=00:02:00")
RECORDED = Path(__file__).parent / "slurm_output"
PREEMPT_GRACE = (RECORDED / "scontrol_show_job_preempt_grace.txt").read_text()
PREEMPT_REQUEUED = (RECORDED / "scontrol_show_job_preempt_requeued.txt").read_text()
TIME_LIMIT = (RECORDED / "scontrol_show_job_time_limit.txt").read_text()


def fields(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


@pytest.mark.parametrize("line, action, requeue, words", [
    (CANCELLED, STOP, False, "cancelled"),
    (REQUEUED, CHECKPOINT, True, "requeueing"),
    (RUNNING, STOP, False, "srun is ending the step"),
    (TIMED_OUT, CHECKPOINT, False, "time limit"),
    (PREEMPT_GRACE, CHECKPOINT, True, "preempting"),
    (PREEMPT_REQUEUED, CHECKPOINT, True, "requeueing"),
    (TIME_LIMIT, CHECKPOINT, False, "time limit"),
])
def test_sigterm_means_what_slurm_says(line, action, requeue, words):
    d = slurm_stop_reason(fields(line), restarts=0)
    assert (d.action, d.requeue) == (action, requeue) and words in d.reason


def test_a_requeued_job_that_restarted_before_is_not_requeued_again():
    # SLURM_RESTART_COUNT=1 and Restarts=1: this start's own count, so a cancel.
    assert slurm_stop_reason(fields(REQUEUED), restarts=1).action == STOP


@pytest.fixture
def restore_signals():
    """StopFlag installs handlers for this process: put the old ones back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture
def flag(restore_signals):
    return StopFlag("USR2", on_sigterm=sigterm_decision)  # as `hpcyolo train` makes it


def test_the_sites_signal_checkpoints_and_requeues(flag):
    assert flag.decide(1, env={}).action == NONE
    os.kill(os.getpid(), signal.SIGUSR2)
    d = flag.decide(2, env={})
    assert (d.action, d.requeue, d.reason) == (CHECKPOINT, True, "SIGUSR2")


def test_the_hold_drill_waits_at_its_step_for_a_signal(monkeypatch, capsys, restore_signals):
    monkeypatch.setenv(HOLD_ENV, "3")
    flag = StopFlag("USR2")
    assert flag.decide(2, env={}).action == NONE  # other steps go on at once
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR2))
    start = time.monotonic()
    timer.start()
    d = flag.decide(3, env={})
    assert time.monotonic() - start >= 0.25 and (d.action, d.reason) == (CHECKPOINT, "SIGUSR2")
    assert "drill: holding after step 3 until a signal arrives" in capsys.readouterr().out


def test_sigterm_stops_where_nobody_says_why(restore_signals):
    flag = StopFlag("USR2")  # the trainer's own default, as a script that calls it directly gets it
    os.kill(os.getpid(), signal.SIGTERM)
    assert flag.decide(1, env={"SLURM_JOB_ID": "7"}) == STOP_ON_SIGTERM


def test_sigterm_outside_slurm_or_where_the_site_says_stop_stops(flag):
    os.kill(os.getpid(), signal.SIGTERM)
    assert flag.decide(1, env={}).action == STOP
    assert flag.decide(1, env={"SLURM_JOB_ID": "7", "HPCYOLO_SIGTERM": "stop"}).action == STOP


def test_sigterm_when_slurm_cannot_answer_stops_and_says_why(flag, tmp_path):
    os.kill(os.getpid(), signal.SIGTERM)
    d = flag.decide(1, env={"SLURM_JOB_ID": "7", "PATH": str(tmp_path)})  # no scontrol on PATH
    assert d.action == STOP and "Slurm cannot say why" in d.reason


PROBE = "from hpcyolo.node.probe import run; raise SystemExit(run())"


def test_a_rank_that_reaches_another_jobs_store_refuses_to_join(tmp_path):
    """Another job's rank 0 holds MASTER_PORT (its store, its identity written
    in it). This job's rank 0 cannot listen there and says so; its rank 1
    reaches the other store, reads whose it is, and refuses in one line
    instead of joining another job's process group."""
    import torch.distributed as dist

    port = free_port()
    stranger = dist.TCPStore("127.0.0.1", port, 2, is_master=True, timeout=datetime.timedelta(seconds=30),
                             wait_for_workers=False)
    stranger.set("hpcyolo/job", "slurm job 41")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "HPCYOLO_JOB": "slurm job 42", "HPCYOLO_DIST_TIMEOUT": "30"}
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    out = [p.communicate(timeout=60)[0] for p in procs]
    assert procs[0].returncode != 0 and procs[1].returncode != 0, out
    assert f"MASTER_PORT {port} on 127.0.0.1 is already in use" in out[0], out[0]
    assert (f"rank 1 on {os.uname().nodename}: 127.0.0.1:{port} is the rendezvous of slurm job 41, not of this job "
            f"(slurm job 42)") in out[1], out[1]
    assert "Traceback" not in out[0] + out[1]
    assert stranger.num_keys() <= 2  # the owner key (and the store's own counter): nothing of job 42 joined


def test_two_launches_with_their_own_identity_train_side_by_side(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    procs = []
    for job in ("a", "b"):
        port = free_port()
        procs += [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env={**env, "MASTER_PORT": str(port), "HPCYOLO_JOB": f"local {job}",
                                                   "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    out = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), out
    assert all("all_reduce 3 (expected 3)" in o for o in out)
