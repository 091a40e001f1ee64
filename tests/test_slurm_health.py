"""Beyond preemption, on the real Slurm testbed: a rank stopped with SIGSTOP
or stuck in a step ends the job within the watchdog's bound, named, with the
stacks in the run directory; a node whose ranks were killed is retried once
without it and the run completes; a slow rank is named; and `hpcyolo status`
accounts for the hours of a run preempted once and failed once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import VENV_BIN, job_log, submit, write
from test_slurm_train import leftovers, site_file, task_pid, wait_for_log

from hpcyolo import slurm
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.preemption import HANG_EXIT_CODE

pytestmark = pytest.mark.slurm
LONG = 1000  # epochs: far more than the jobs below run before they are stopped
HANG_MIN = 5.0  # run.hang_min of these jobs (the default, 60 s, would make the tests a minute longer each)


@pytest.fixture
def scratch_root():
    """Node-local scratch of this test's jobs, in /dev/shm as on the testbed's site."""
    root = Path("/dev/shm") / f"hpcyolo-test-{uuid.uuid4().hex[:8]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def job(tmp_path, name, data, nodes=1, epochs=LONG, run=None, every_steps=0):
    spec = {"name": name, "resources": {"nodes": nodes, "tasks_per_node": 2, "time": "00:10:00"},
            "data": {"yaml": str(data), "stage": True},
            "train": {"model": "n", "epochs": epochs, "batch": 8, "nbs": 8, "imgsz": 64, "workers": 2,
                      "close_mosaic": 0, "seed": 0, "plots": False, "tensorboard": False},
            "checkpoint": {"every_steps": every_steps},
            "run": {"hang_min": HANG_MIN, "hang_factor": 5.0, **(run or {})}}
    return write(tmp_path / f"{name}.yaml", json.dumps(spec))


def hang_line(log: str) -> str:
    return next(line for line in log.splitlines() if line.startswith("hpcyolo: hang:"))


def test_a_stopped_rank_ends_the_job_within_the_bound_named_with_the_others_stacks(tmp_path, shapes, slurm_env,
                                                                                  scratch_root):
    site = site_file(tmp_path, scratch_root, max_failures=0)
    job_id = submit(site, job(tmp_path, "stop", shapes, nodes=2), slurm_env, tmp_path)
    wait_for_log(tmp_path, "stop", job_id, slurm_env, lambda log: f"epoch 1/{LONG}: loss" in log, 600,
                 "the first epoch")
    os.kill(task_pid(job_id, 3), signal.SIGSTOP)  # kill -STOP of rank 3 (node2's second task)
    stopped = time.monotonic()
    info = slurm.wait(job_id, timeout=180, env=slurm_env, poll=0.5)
    took = time.monotonic() - stopped
    log = job_log(tmp_path, "stop", job_id)
    line = hang_line(log)
    print(f"stopped rank: the job ended {took:.1f} s after SIGSTOP; {line}")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == f"{HANG_EXIT_CODE}:0", log[-3000:]
    bound = float(line.split("(bound ")[1].split(" s")[0])
    assert bound >= HANG_MIN and took < bound + 30, (took, line)  # the bound, the answers' wait, srun's teardown
    assert "rank 3 on node2 did not answer" in line and "wait in a collective" in line, line
    folder = rundir.hang_folder(tmp_path / "runs" / "stop", str(job_id), "0")
    # Rank 3 may leave its own once Slurm's teardown sends it SIGCONT (with SIGTERM): after the verdict.
    assert {"rank-0.txt", "rank-1.txt", "rank-2.txt"} <= {p.name for p in folder.glob("rank-*.txt")}
    assert "thread hpcyolo-watchdog" in (folder / "rank-0.txt").read_text()
    assert json.loads((folder / "blame.json").read_text())["nodes"] == ["node2"]
    assert "not retried: preemption.max_failures is 0" in log and "Traceback" not in log
    assert leftovers(scratch_root) == []


def test_a_rank_stuck_in_a_step_shows_where_in_its_own_stack(tmp_path, shapes, slurm_env, scratch_root):
    site = site_file(tmp_path, scratch_root, max_failures=0, env={"HPCYOLO_DRILL_STALL": "1:9"})
    job_id = submit(site, job(tmp_path, "stall", shapes), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=300, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, "stall", job_id)
    assert info["ExitCode"] == f"{HANG_EXIT_CODE}:0", log[-3000:]
    line = hang_line(log)
    assert "after step 9" in line and "is stuck in drill_stall" in line, line
    node = line.split("rank 1 on ")[1].split(" ")[0]
    folder = rundir.hang_folder(tmp_path / "runs" / "stall", str(job_id), "0")
    assert "in drill_stall" in (folder / "rank-1.txt").read_text()
    assert json.loads((folder / "blame.json").read_text())["nodes"] == [node]


def test_a_slowed_rank_is_named_and_an_even_run_names_none(tmp_path, shapes, slurm_env, scratch_root):
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_SLOW": "0:0.15"})
    job_id = submit(site, job(tmp_path, "slow", shapes, epochs=2, run={"straggler_every": 2}), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=300, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, "slow", job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    named = [line for line in log.splitlines() if line.startswith("straggler:")]
    # 12 steps, an interval of 2: named after 3 slow intervals, within the first 5 (the job's first step,
    # slow on every rank, may hide the first)
    assert named and all(" rank 0 on " in line and "waiting on compute" in line for line in named), log[-3000:]
    assert int(named[0].split(" to step ")[1].split(",")[0]) <= 10, named[0]
    rows = rundir.read_rows(tmp_path / "runs" / "slow" / rundir.STRAGGLERS)
    assert [r["rank"] for r in rows] == ["0"] * len(named)

    even = tmp_path / "even"
    even.mkdir()
    job_id = submit(site_file(even, scratch_root), job(even, "even", shapes, epochs=2, run={"straggler_every": 2}),
                    slurm_env, even)
    info = slurm.wait(job_id, timeout=300, env=slurm_env, poll=0.5)
    log = job_log(even, "even", job_id)
    assert info["JobState"] == "COMPLETED" and "straggler:" not in log, log[-3000:]


def test_preempted_once_and_failed_once_the_run_completes_without_the_node_and_the_ledger_adds_up(
        tmp_path, shapes, slurm_env, scratch_root):
    # 48 images, 8 a step: 6 steps an epoch, 4 epochs, checkpoints every 4 steps and at each epoch's end.
    # A drill checkpoints after step 3 and requeues; in the second start (on node1: an idle testbed gives
    # a one-node job its first node) both ranks kill themselves after step 14, 2 steps past the checkpoint
    # of step 12; the third start runs without node1, where the kill drill does nothing.
    failed_node = "node1"
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_PREEMPT_STEP": "3",
                                                  "HPCYOLO_DRILL_KILL": f"{failed_node}:14"})
    spec = job(tmp_path, "ledger", shapes, epochs=4, every_steps=4)
    job_id = submit(site, spec, slurm_env, tmp_path)
    submitted = slurm.show_job(job_id, env=slurm_env)["SubmitTime"]
    info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5, settled=lambda i: i.get("Restarts") == "2")
    log = job_log(tmp_path, "ledger", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "2"), log[-3000:]
    assert info["NodeList"] != failed_node and failed_node in slurm.hostnames(info["ExcNodeList"], slurm_env)
    assert f"Killed; requeueing job {job_id} without {failed_node} to resume from its newest checkpoint" in log
    run = tmp_path / "runs" / "ledger"
    rows = rundir.read_rows(run / rundir.FAILURES)
    assert [(r["nodes"], r["retried"], r["lost_steps"]) for r in rows] == [(failed_node, "yes", "2")]

    status = subprocess.run([str(VENV_BIN / "hpcyolo"), "status", str(run)], capture_output=True, text=True,
                            env=slurm_env)
    assert status.returncode == 0, status.stderr
    print(status.stdout)
    assert "where the hours went (3 start(s) of the job)" in status.stdout and "goodput:" in status.stdout
    assert f"failure   job {job_id} start 1: rank " in status.stdout and f"on {failed_node}: Killed (retried without" in status.stdout
    figures = json.loads(subprocess.run([str(VENV_BIN / "hpcyolo"), "status", "--json", str(run)],
                                        capture_output=True, text=True, env=slurm_env, check=True).stdout)
    parts = figures["parts"]
    assert figures["starts"] == 3 and parts["lost"] > 0 and parts["idle"] > 0 and parts["staging"] > 0
    assert abs(figures["booked"] - figures["wall"]) <= 0.02 * figures["wall"]
    # Against Slurm's own clock (whole seconds): from the submission to the last start's end.
    since = (time.mktime(time.strptime(info["EndTime"], "%Y-%m-%dT%H:%M:%S"))
             - time.mktime(time.strptime(submitted, "%Y-%m-%dT%H:%M:%S")))
    total = parts["queued"] + parts["idle"] + figures["booked"]
    print(f"ledger: {total:.1f} s from submission to the end; Slurm: {since:.0f} s")
    assert abs(total - since) <= 0.02 * since + 2, (total, since)  # 2 s: Slurm's times are whole seconds


def test_a_node_the_job_cannot_do_without_is_not_excluded_and_the_retries_end(tmp_path, shapes, slurm_env,
                                                                              scratch_root):
    # A 2-node job on the 2-node testbed: excluding node2 would leave it waiting for good, so the retry keeps
    # it; node2's ranks are killed again in the second start, and with max_failures 1 the job then fails.
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_KILL": "node2:3"}, max_failures=1)
    job_id = submit(site, job(tmp_path, "keep", shapes, nodes=2, epochs=2), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5, settled=lambda i: i.get("Restarts") == "1")
    log = job_log(tmp_path, "keep", job_id)
    assert (info["JobState"], info["Restarts"]) == ("FAILED", "1"), log[-3000:]
    assert info.get("ExcNodeList") in ("(null)", ""), info.get("ExcNodeList")
    assert "node2 not excluded: the job's partition would keep fewer nodes than it asks for" in log, log[-3000:]
    assert "not retried: preemption.max_failures is 1 and was reached" in log, log[-3000:]
    rows = rundir.read_rows(tmp_path / "runs" / "keep" / rundir.FAILURES)
    assert [(r["nodes"], r["retried"]) for r in rows] == [("node2", "yes"), ("node2", "no")]


def test_through_submitit_a_failed_network_is_retried_without_its_node(tmp_path, shapes, slurm_env, scratch_root):
    # `hpcyolo submit` (submitit): in the first start, on node1, both ranks' network fails after step 9 (the
    # drill raises NCCL's error); the task that sees it first requeues the job without node1; the second
    # start resumes from the checkpoint of step 8 on node2 and completes.
    failed_node = "node1"
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_FAULT": f"{failed_node}:9"})
    spec = job(tmp_path, "fault", shapes, epochs=2, every_steps=4)
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", str(site), str(spec)], capture_output=True, text=True,
                       env=slurm_env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job_id = int(r.stdout.strip())
    info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5, settled=lambda i: i.get("Restarts") == "1")
    run = tmp_path / "runs" / "fault"
    logs = "".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob(f"{job_id}_*_log.*")))
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), logs[-4000:]
    assert info["NodeList"] != failed_node and failed_node in slurm.hostnames(info["ExcNodeList"], slurm_env)
    assert "its device or network failed (DistBackendError: NCCL error" in logs, logs[-4000:]
    assert (f"its device or network failed; requeueing job {job_id} without {failed_node} to resume from its "
            "newest checkpoint") in logs, logs[-4000:]
    assert "resumed from ckpt-000000008.pt" in logs, logs[-4000:]
    rows = rundir.read_rows(run / rundir.FAILURES)
    assert [(r["nodes"], r["retried"], r["lost_steps"]) for r in rows] == [(failed_node, "yes", "1")]
    assert (run / "results.csv").read_text().count("\n") == 3  # header and 2 epochs
    figures = json.loads(subprocess.run([str(VENV_BIN / "hpcyolo"), "status", "--json", str(run)],
                                        capture_output=True, text=True, env=slurm_env, check=True).stdout)
    assert figures["starts"] == 2 and figures["parts"]["training"] > 0 and figures["parts"]["idle"] > 0
    assert abs(figures["booked"] - figures["wall"]) <= 0.02 * figures["wall"]


def test_a_users_error_in_the_training_step_is_not_retried(tmp_path, shapes, slurm_env, scratch_root):
    """Labels whose every class id is out of range: the trainer refuses them
    (one line, exit 1) on every rank; job end calls that the user's, not a node's."""
    data = tmp_path / "bad"
    shutil.copytree(shapes.parent, data)
    for label in (data / "labels").rglob("*.txt"):
        label.write_text("".join(f"99 {line.split(' ', 1)[1]}\n" for line in label.read_text().splitlines() if line))
    job_id = submit(site_file(tmp_path, scratch_root), job(tmp_path, "bad", data / "data.yaml", epochs=1), slurm_env,
                    tmp_path)
    info = slurm.wait(job_id, timeout=300, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, "bad", job_id)
    # The step's code is 1, or 143 where srun ended a rank still at work after another exited 1 (each rank
    # refuses the data once rank 0's index says so: one may be first).
    assert (info["JobState"], info["Restarts"]) == ("FAILED", "0") and info["ExitCode"] in ("1:0", "143:0"), \
        log[-3000:]
    assert "no label line is usable" in log and "(Exited with exit code 1)" in log, log[-3000:]
    assert "requeueing" not in log, log[-3000:]
    assert not (tmp_path / "runs" / "bad" / rundir.FAILURES).exists()
