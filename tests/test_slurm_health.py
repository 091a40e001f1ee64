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
from conftest import VENV_BIN, job_log, max_abs_diff, submit, write
from test_slurm_train import final_state, leftovers, site_file, task_pid, wait_for_log

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


def job(tmp_path, name, data, nodes=1, epochs=LONG, run=None, every_steps=0, spare_nodes=0):
    spec = {"name": name, "resources": {"nodes": nodes, "tasks_per_node": 2, "time": "00:10:00",
                                        "spare_nodes": spare_nodes},
            "data": {"yaml": str(data), "stage": True},
            "train": {"model": "n", "epochs": epochs, "batch": 8, "nbs": 8, "imgsz": 64, "workers": 2,
                      "close_mosaic": 0, "seed": 0, "plots": False, "tensorboard": False},
            "checkpoint": {"every_steps": every_steps},
            "run": {"hang_min": HANG_MIN, "hang_factor": 5.0, **(run or {})}}
    return write(tmp_path / f"{name}.yaml", json.dumps(spec))


def back_to_training(run: Path, job_id: int, failed: str, next_start: str) -> float:
    """Seconds from the failed start's training step ending (its srun returned: the kill, srun's teardown)
    to the next start's training loop (the ledger's stamps: the batch script's, the trainer's)."""
    folder = run / rundir.LEDGER
    ended = dict(line.split() for line in (folder / f"{job_id}-{failed}.times").read_text().splitlines())["end"]
    return json.loads((folder / f"{job_id}-{next_start}.json").read_text())["times"]["loop"] - float(ended)


def ledger_against(run: Path, job_id: int, steps: dict[int, tuple[float, float]]) -> list[tuple[str, float, float]]:
    """The ledger's srun parts (preflight, staging, each start's training:
    from its stamp to the script's next) of a job that was never requeued,
    against Slurm's own record of the steps they launched, in order (`steps`:
    step number -> (start, end), from the slurmd logs or from sacct): (part,
    start difference, end difference) in seconds. The step after them is the
    scratch's removal, which the ledger books to the script's end."""
    parts = []
    for times in sorted((run / rundir.LEDGER).glob(f"{job_id}-*.times")):
        stamps = [(name, float(t)) for name, t in (line.split() for line in times.read_text().splitlines())]
        parts += [(name, t, stamps[i + 1][1]) for i, (name, t) in enumerate(stamps[:-1])
                  if name in ("preflight", "stage", "train")]
    parts.sort(key=lambda p: p[1])
    assert len(steps) >= len(parts), (parts, steps)
    return [(name, round(steps[k][0] - start, 2), round(steps[k][1] - end, 2))
            for k, (name, start, end) in zip(sorted(steps), parts)]


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


def test_a_rank_stuck_in_a_step_shows_where_in_its_own_stack_and_is_not_retried_without_its_node(
        tmp_path, shapes, slurm_env, scratch_root):
    # retries left: a rank stuck in code of its own answered, so its node works: the run's failure, not retried
    site = site_file(tmp_path, scratch_root, max_failures=2, env={"HPCYOLO_DRILL_STALL": "1:9"})
    job_id = submit(site, job(tmp_path, "stall", shapes), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=300, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, "stall", job_id)
    assert info["ExitCode"] == f"{HANG_EXIT_CODE}:0", log[-3000:]
    line = hang_line(log)
    assert "after step 9" in line and "is stuck in drill_stall" in line, line
    node = line.split("rank 1 on ")[1].split(" ")[0]
    folder = rundir.hang_folder(tmp_path / "runs" / "stall", str(job_id), "0")
    assert "in drill_stall" in (folder / "rank-1.txt").read_text()
    assert node in ("node1", "node2") and "the run's own failure" in line, line
    blame = json.loads((folder / "blame.json").read_text())
    assert blame["ranks"] == [1] and blame["nodes"] == [], blame
    assert info["Restarts"] == "0" and not (tmp_path / "runs" / "stall" / rundir.FAILURES).exists(), info
    assert "requeue" not in log.split("hpcyolo: hang:")[1], log[-2000:]


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
    print(f"requeued: training again {back_to_training(run, job_id, '1', '2'):.1f} s after the failed step ended")
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


def test_a_two_node_job_that_loses_a_node_goes_on_in_its_allocation_on_the_other_with_half_the_ranks(
        tmp_path, shapes, slurm_env, scratch_root, testbed):
    # A 2-node x 2-task job on the 2-node testbed: node2's ranks are killed after step 3 (past the checkpoint
    # of step 2). The batch script starts the training again inside the same allocation on node1 alone, 2
    # ranks for the same global batch, from that checkpoint: no requeue, the same job id, and it completes.
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_KILL": "node2:3"})
    job_id = submit(site, job(tmp_path, "shrink", shapes, nodes=2, epochs=2, every_steps=2), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, "shrink", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "0"), log[-4000:]
    assert ("Killed; starting the training again in this allocation without node2, on 1 node(s) (2 ranks, "
            "global batch 8), from its newest checkpoint (failure 1 of preemption.max_failures 2)") in log, log[-4000:]
    assert "resumed from ckpt-000000002.pt" in log and "checkpoint has the state of 4 ranks, not 2" in log, log[-4000:]
    run = tmp_path / "runs" / "shrink"
    rows = rundir.read_rows(run / rundir.FAILURES)
    assert [(r["restart"], r["nodes"], r["retried"], r["lost_steps"]) for r in rows] == [("0", "node2", "yes", "1")]
    assert (run / "results.csv").read_text().count("\n") == 3  # header and 2 epochs
    assert {p.name for p in (run / rundir.LEDGER).glob("*.times")} == {f"{job_id}-0.times", f"{job_id}-0.1.times"}
    status = subprocess.run([str(VENV_BIN / "hpcyolo"), "status", str(run)], capture_output=True, text=True,
                            env=slurm_env)
    assert status.returncode == 0, status.stderr
    print(status.stdout)
    assert f"failure   job {job_id} start 0: rank" in status.stdout and "on node2: Killed (retried without node2" \
        in status.stdout, status.stdout
    assert "where the hours went (2 start(s) of the job)" in status.stdout, status.stdout
    took = back_to_training(run, job_id, "0", "0.1")
    print(f"in place: training again {took:.1f} s after the failed step ended")
    assert 0 < took < 60, took
    # The ledger's steps (staging, the failed training, the training in place) where Slurm's own record puts them
    compared = ledger_against(run, job_id, testbed.steps(job_id))
    print("ledger against slurmd's record (part, start, end difference in s):", compared)
    assert [name for name, _, _ in compared] == ["stage", "train", "train"], compared
    assert all(abs(a) <= 2 for _, a, _ in compared) and abs(compared[0][2]) <= 2 and abs(compared[2][2]) <= 2, \
        compared
    # The failed step's end: srun returns (the ledger's end) once the tasks are reported killed; Slurm ends the
    # step on node1 only when its slurmstepd finds none of the step's processes left (proctrack/linuxproc
    # polls with growing sleeps): 2.4 and 2.6 s later in two runs, while the restart's step already ran there.
    assert 0 <= compared[1][2] <= 3.5, compared
    # And against Slurm's accounting (sacct's step Start and End, whole seconds: up to 1 s more either way).
    accounted = ledger_against(run, job_id, {int(k): v for k, v in testbed.sacct_steps(job_id).items() if k.isdigit()})
    print("ledger against sacct (part, start, end difference in s):", accounted)
    assert [name for name, _, _ in accounted] == ["stage", "train", "train"], accounted
    assert all(abs(a) <= 2 for _, a, _ in accounted) and abs(accounted[0][2]) <= 2 and abs(accounted[2][2]) <= 2, \
        accounted
    assert -1 <= accounted[1][2] <= 4.5, accounted
    assert leftovers(scratch_root) == []


def test_a_node_slurm_takes_down_leaves_the_job_its_allocation_and_it_goes_on_without_it(
        tmp_path, shapes, slurm_env, scratch_root, testbed):
    # Slurm's own node failure: node2 is set DOWN while the 2-node job trains (what slurmctld does to a node
    # whose slurmd stopped answering). Submitted with --no-kill (the script asks for it where it restarts in
    # place), the job keeps its allocation: Slurm ends the step's tasks on node2, srun says "Node failure",
    # and the script trains on node1 alone from the newest checkpoint; no requeue.
    job_id = submit(site_file(tmp_path, scratch_root), job(tmp_path, "down", shapes, nodes=2, epochs=2,
                                                           every_steps=2), slurm_env, tmp_path)
    run = tmp_path / "runs" / "down"
    try:
        wait_for_log(tmp_path, "down", job_id, slurm_env, lambda _: (run / rundir.CHECKPOINTS /
                                                                     "ckpt-000000002.pt").exists(), 600,
                     "the checkpoint of step 2")
        subprocess.run(["scontrol", "update", "nodename=node2", "state=down", "reason=hpcyolo-test"], env=slurm_env,
                       check=True)
        info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5)
    finally:
        subprocess.run(["scontrol", "update", "nodename=node2", "state=resume"], env=slurm_env)
    log = job_log(tmp_path, "down", job_id)
    print(log[-3000:])
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "0"), log[-4000:]
    assert "node failure on node2; starting the training again in this allocation without node2" in log, log[-4000:]
    rows = rundir.read_rows(run / rundir.FAILURES)
    assert [(r["restart"], r["nodes"], r["retried"]) for r in rows] == [("0", "node2", "yes")]
    assert (run / "results.csv").read_text().count("\n") == 3  # header and 2 epochs


def test_a_job_with_a_spare_node_goes_on_on_the_spare_when_its_node_fails(tmp_path, shapes, slurm_env,
                                                                           scratch_root):
    # A 1-node x 2-task job with spare_nodes: 1 on the 2-node testbed: it holds node1 and node2, trains on node1
    # (the allocation's first), node2 staged and idle. node1's ranks are killed after step 3; the training starts
    # again on node2 inside the same job, with as many ranks, from the checkpoint of step 2, and completes.
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_KILL": "node1:3"})
    spec = job(tmp_path, "spare", shapes, nodes=1, epochs=2, every_steps=2, spare_nodes=1)
    job_id = submit(site, spec, slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, "spare", job_id)
    assert (info["JobState"], info["Restarts"], info["NodeList"]) == ("COMPLETED", "0", "node[1-2]"), log[-4000:]
    assert ("Killed; starting the training again in this allocation without node1, on 1 node(s) (2 ranks, "
            "global batch 8), from its newest checkpoint (failure 1 of preemption.max_failures 2)") in log, log[-4000:]
    assert "resumed from ckpt-000000002.pt" in log and "checkpoint has the state of" not in log, log[-4000:]
    assert "on host node2" in log.split("starting the training again")[1], log[-4000:]
    run = tmp_path / "runs" / "spare"
    rows = rundir.read_rows(run / rundir.FAILURES)
    assert [(r["restart"], r["nodes"], r["retried"]) for r in rows] == [("0", "node1", "yes")]
    assert (run / "results.csv").read_text().count("\n") == 3  # header and 2 epochs
    print(f"spare: training again {back_to_training(run, job_id, '0', '0.1'):.1f} s after the failed step ended")
    # Against Slurm's own path: the same job, checkpointed at step 2 by a preemption drill and requeued by
    # Slurm, resumed from that checkpoint with as many ranks and never failed: the same final state.
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_PREEMPT_STEP": "2"})
    reference = submit(site, job(tmp_path, "spare-ref", shapes, nodes=1, epochs=2, every_steps=2, spare_nodes=1),
                       slurm_env, tmp_path)
    info = slurm.wait(reference, timeout=600, env=slurm_env, poll=0.5, settled=lambda i: i.get("Restarts") == "1")
    ref_log = job_log(tmp_path, "spare-ref", reference)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1") and "resumed from ckpt-000000002.pt" in \
        ref_log, ref_log[-3000:]
    a, b = final_state(run), final_state(tmp_path / "runs" / "spare-ref")
    assert a["global_step"] == b["global_step"] == 12
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part
    assert leftovers(scratch_root) == []


def test_through_submitit_a_failed_network_restarts_in_place_without_its_node(tmp_path, shapes, slurm_env,
                                                                             scratch_root):
    # `hpcyolo submit` (submitit, whose job runs the rendered script): a 2-node x 2-task job; node2's ranks'
    # network fails after step 9 (the drill raises NCCL's error). The training starts again inside the same
    # allocation on node1 alone, 2 ranks for the same global batch, from the checkpoint of step 8, and
    # completes: no requeue, one failure row, the restart in the ledger, and submitit's one result.
    failed_node = "node2"
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_FAULT": f"{failed_node}:9"})
    spec = job(tmp_path, "fault", shapes, nodes=2, epochs=2, every_steps=4)
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", str(site), str(spec)], capture_output=True, text=True,
                       env=slurm_env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job_id = int(r.stdout.strip())
    info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5)
    run = tmp_path / "runs" / "fault"
    log = (run / "submitit" / f"{job_id}_0_log.out").read_text(errors="replace")
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "0"), log[-4000:]
    assert "its device or network failed (DistBackendError: NCCL error" in log, log[-4000:]
    assert (f"its device or network failed; starting the training again in this allocation without {failed_node}, "
            "on 1 node(s) (2 ranks, global batch 8), from its newest checkpoint") in log, log[-4000:]
    assert "resumed from ckpt-000000008.pt" in log, log[-4000:]
    assert log.count("Loading pickle") == 1 and log.count("Job completed successfully") == 1, log[-4000:]
    rows = rundir.read_rows(run / rundir.FAILURES)
    assert [(r["restart"], r["nodes"], r["retried"], r["lost_steps"]) for r in rows] == \
        [("0", failed_node, "yes", "1")]
    assert (run / "results.csv").read_text().count("\n") == 3  # header and 2 epochs
    assert {p.name for p in (run / rundir.LEDGER).glob("*.times")} == {f"{job_id}-0.times", f"{job_id}-0.1.times"}
    status = subprocess.run([str(VENV_BIN / "hpcyolo"), "status", str(run)], capture_output=True, text=True,
                            env=slurm_env)
    assert status.returncode == 0 and "(via submitit)" in status.stdout, status.stdout + status.stderr
    assert f"on {failed_node}: its device or network failed (retried without {failed_node}" in status.stdout, \
        status.stdout
    figures = json.loads(subprocess.run([str(VENV_BIN / "hpcyolo"), "status", "--json", str(run)],
                                        capture_output=True, text=True, env=slurm_env, check=True).stdout)
    assert figures["starts"] == 2 and figures["parts"]["training"] > 0
    assert abs(figures["booked"] - figures["wall"]) <= 0.02 * figures["wall"]
    assert leftovers(scratch_root) == []


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
