"""Training end to end on the real Slurm testbed, in the configuration users
run: `hpcyolo render | sbatch` on 2 nodes x 2 tasks with 2 loader workers each
and staging into /dev/shm. A preemption stop and a `scontrol requeue` end
bit-identical to an uninterrupted run (model, EMA and optimizer state); a
cancel stops without a requeue; a killed rank ends the job with one line that
names it; an array task and the plain job after it (once one port) both
train; nothing is left in /dev/shm after any of these; a time limit that
runs out; a checkpoint write killed half-way."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import REPO, VENV_BIN, job_log, max_abs_diff, submit, write

from hpcyolo import slurm
from hpcyolo.node.distenv import default_port
from hpcyolo_trainer.run import checkpoint as ckpt
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.preemption import HOLD_ENV

pytestmark = pytest.mark.slurm
EPOCHS = 2
# 48 images, a global batch of 8 over 4 ranks: 6 steps per epoch, a
# checkpoint every 4 steps; the drill stops after step 7 (epoch 2, batch 1):
# neither an epoch boundary nor a checkpoint interval.
STOP_STEP = 7
# Tests that stop a job with a real signal hold it after this step (epoch 2,
# batch 3) until the signal arrives: the job cannot end first.
HOLD_STEP = 9
# Jobs that must still be training when a test stops them: far more epochs
# than any machine runs in their 2-minute or 10-minute limits (50 once seemed
# enough, until the loader got faster and a job finished before its signal).
LONG = 1000


@pytest.fixture
def scratch_root():
    """Node-local scratch of this test's jobs, in /dev/shm as on the testbed's site."""
    root = Path("/dev/shm") / f"hpcyolo-test-{uuid.uuid4().hex[:8]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def leftovers(root: Path) -> list[str]:
    """Whatever a job left in its scratch: staged data, caches, locks."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def site_file(tmp_path: Path, scratch: Path | None = None, env: dict | None = None, partition: str | None = None,
              **preemption) -> Path:
    spec = yaml.safe_load((REPO / "site_configs" / "testbed.yaml").read_text())
    if partition:
        spec["slurm"]["partition"] = partition
    spec["storage"]["runs"] = str(tmp_path / "runs")
    spec["storage"]["scratch"] = str(scratch or tmp_path / "scratch")
    # One CPU per task (4 tasks, OMP_NUM_THREADS=1): the testbed's nodes share
    # this machine's 2 cores, and more threads than cores make a step take
    # seconds, longer than the KillWait (30 s) a SIGTERM-ed step has to stop.
    spec["node"]["cpus"] = 2
    spec["preemption"].update(preemption)
    if env:
        spec.setdefault("environment", {})["env"] = env
    return write(tmp_path / "site.yaml", yaml.safe_dump(spec))


def job_file(tmp_path: Path, name: str, data: Path, epochs: int = EPOCHS, time_limit: str = "00:10:00",
             every_steps: int = 4, task: str = "detect") -> Path:
    spec = {"name": name, "resources": {"nodes": 2, "tasks_per_node": 2, "time": time_limit},
            "data": {"yaml": str(data), "stage": True},
            "train": {"task": task, "model": "n", "epochs": epochs, "batch": 8, "nbs": 8, "imgsz": 64, "workers": 2,
                      "close_mosaic": 1, "seed": 0},
            "checkpoint": {"keep": 20, "every_steps": every_steps}}
    return write(tmp_path / f"{name}.yaml", json.dumps(spec))


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def wait_for_log(tmp_path: Path, name: str, job_id: int, env, seen, timeout: float, what: str) -> None:
    """Wait until `seen(log)` holds for the job's log; fail at once, with the
    log's end, when the job has ended without it (no wait for the timeout)."""
    def ready() -> bool:
        state = slurm.show_job(job_id, env=env).get("JobState")  # before the log: its last lines are in
        log = job_log(tmp_path, name, job_id)
        assert seen(log) or state not in slurm.FINAL_STATES, f"job {job_id} ended {state} before {what}:\n{log[-3000:]}"
        return seen(log)

    wait_for(ready, timeout, what)


def final_state(run: Path) -> dict:
    return ckpt.load_latest(run / "checkpoints", warn=print)


def assert_identical(run_a: Path, run_b: Path) -> None:
    """Every tensor of model, EMA and optimizer state equal, and results.csv
    equal but for the time column."""
    a, b = final_state(run_a), final_state(run_b)
    assert a["global_step"] == b["global_step"]
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part
    rows = [[{k: v for k, v in r.items() if k not in rundir.TIMING_COLUMNS}
             for r in csv.DictReader((run / "results.csv").open())] for run in (run_a, run_b)]
    assert rows[0] == rows[1] and len(rows[0]) == EPOCHS


def test_a_trains_on_two_nodes_with_staging(uninterrupted):
    tmp, job_id, info, left = uninterrupted
    log = job_log(tmp, "train-a", job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    run = tmp / "runs" / "train-a"
    assert (run / "results.csv").read_text().count("\n") == EPOCHS + 1
    for name in ("results.png", "weights/best.pt", "weights/last.pt", "config.yaml", f"sbatch-{job_id}.sh"):
        assert (run / name).is_file(), name
        assert (run / name).stat().st_mode & 0o777 == 0o644, name  # the umask's mode (022 here), not 0700
    assert final_state(run)["epoch"] == EPOCHS
    # One stage task per node; the testbed's "nodes" share one machine and so
    # one scratch folder: one copies, the other finds the copy complete.
    assert log.count("hpcyolo stage:") >= 2 and "node1" in log and "node2" in log
    assert "4 rank(s)" in log
    assert left == []  # scratch removed after success
    assert f"job {job_id} restart 0 on node1 log {tmp / f'train-a-{job_id}.out'}" in (run / "hpcyolo-run").read_text()


def test_b_preempted_mid_epoch_requeues_resumes_exactly(uninterrupted, tmp_path, shapes, slurm_env, scratch_root):
    a_tmp, a_job, a_info, _ = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    # A copy that a job killed outright left behind: job a's (ended) owns it.
    stale = scratch_root / "hpcyolo-root" / "old-run"
    write(stale / "data" / "data.yaml", "x")
    write(stale / ".hpcyolo-job", f"{a_job}\n")
    site = site_file(tmp_path, scratch_root, env={"HPCYOLO_DRILL_PREEMPT_STEP": str(STOP_STEP)})
    job_id = submit(site, job_file(tmp_path, "train-b", shapes), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=900, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
    log = job_log(tmp_path, "train-b", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert f"stopping for preemption (drill at step {STOP_STEP}) at epoch 2, batch 1" in log
    assert f"checkpointed (drill at step {STOP_STEP}); requeueing job" in log
    assert f"resumed from ckpt-{STOP_STEP:09d}.pt: epoch 2, batch 1" in log
    assert f"removed {stale}, node-local scratch of job {a_job}, which has ended (" in log  # completed, or forgotten
    run = tmp_path / "runs" / "train-b"
    assert "restart 1" in (run / "hpcyolo-run").read_text()  # same run directory after the requeue
    assert_identical(a_tmp / "runs" / "train-a", run)
    assert not list(run.glob(".preempted-*"))  # the run completed: its marker went
    assert leftovers(scratch_root) == []


def test_c_scontrol_requeue_checkpoints_on_sigterm_and_resumes_exactly(uninterrupted, tmp_path, shapes, slurm_env,
                                                                       scratch_root):
    a_tmp, _, a_info, _ = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    # The ranks wait after step HOLD_STEP (epoch 2, batch 3) until the requeue's SIGTERM reaches them.
    site = site_file(tmp_path, scratch_root, env={HOLD_ENV: str(HOLD_STEP)})
    job_id = submit(site, job_file(tmp_path, "train-c", shapes), slurm_env, tmp_path)
    wait_for_log(tmp_path, "train-c", job_id, slurm_env, lambda log: f"holding after step {HOLD_STEP}" in log, 600,
                 "the ranks to hold mid-epoch")
    slurm.requeue(job_id, env=slurm_env)
    info = slurm.wait(job_id, timeout=900, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
    log = job_log(tmp_path, "train-c", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert "stopping for preemption (SIGTERM: Slurm is requeueing the job) at epoch 2, batch 3" in log
    assert f"resumed from ckpt-{HOLD_STEP:09d}.pt: epoch 2, batch 3" in log
    assert_identical(a_tmp / "runs" / "train-a", tmp_path / "runs" / "train-c")
    assert leftovers(scratch_root) == []


def test_d_cancel_stops_without_requeue_and_cleans_scratch(tmp_path, shapes, slurm_env, scratch_root):
    job_id = submit(site_file(tmp_path, scratch_root), job_file(tmp_path, "train-d", shapes, epochs=LONG), slurm_env,
                    tmp_path)
    wait_for_log(tmp_path, "train-d", job_id, slurm_env, lambda log: f"epoch 1/{LONG}: loss" in log, 600,
                 "the first epoch")
    assert leftovers(scratch_root)  # the staged copy is there while it trains
    run = tmp_path / "runs" / "train-d"
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "cancel", str(run)], env=slurm_env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = slurm.wait(job_id, timeout=120, env=slurm_env, poll=0.5)
    time.sleep(2)  # the job's own last lines
    log = job_log(tmp_path, "train-d", job_id)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), log[-3000:]
    assert "hpcyolo: job cancelled: stopping at epoch" in log
    assert "stopping for preemption" not in log and "requeueing" not in log
    assert not list(run.glob(".preempted-*"))
    assert leftovers(scratch_root) == []


def task_pid(job_id: int, rank: int) -> int:
    """The PID of the training process of `rank` in job `job_id`: the one
    whose parent is not itself a training process (that would be a
    data-loader worker, forked with the same environment), and not srun."""
    matches = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        argv = cmdline.split(b"\0")
        if (f"SLURM_JOB_ID={job_id}".encode() in environ and f"SLURM_PROCID={rank}".encode() in environ
                and not argv[0].endswith(b"srun")  # the batch script's srun is "task 0" of the batch step
                and b"hpcyolo" in cmdline and b"train" in argv):
            matches[int(proc.name)] = ppid
    mains = [pid for pid, ppid in matches.items() if ppid not in matches]
    if len(mains) != 1:
        raise LookupError(f"expected one training process of rank {rank} in job {job_id}, found {mains}")
    return mains[0]


def test_e_killed_rank_ends_the_job_named_in_one_line(tmp_path, shapes, slurm_env, scratch_root):
    """With preemption.max_failures 0 a killed rank is not retried (test_slurm_health retries one)."""
    job_id = submit(site_file(tmp_path, scratch_root, max_failures=0),
                    job_file(tmp_path, "train-e", shapes, epochs=LONG), slurm_env, tmp_path)
    wait_for_log(tmp_path, "train-e", job_id, slurm_env, lambda log: f"epoch 1/{LONG}: loss" in log, 600,
                 "the first epoch")
    os.kill(task_pid(job_id, 1), signal.SIGKILL)  # rank 1: node1's second task
    killed = time.monotonic()
    info = slurm.wait(job_id, timeout=120, env=slurm_env, poll=0.5)
    assert time.monotonic() - killed < 60
    log = job_log(tmp_path, "train-e", job_id)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", log[-3000:]
    assert "hpcyolo: rank 1 on node1: Killed; not retried: preemption.max_failures is 0" in log, log[-3000:]
    assert "Traceback" not in log and "stopping for preemption" not in log and "requeueing" not in log
    run = tmp_path / "runs" / "train-e"
    assert [(r["nodes"], r["retried"]) for r in rundir.read_rows(run / rundir.FAILURES)] == [("node1", "no")]
    assert leftovers(scratch_root) == []


def test_f_array_task_and_the_next_plain_job_both_train(tmp_path, shapes, slurm_env, scratch_root):
    """`sbatch --array=1` (job N, task 1) and a plain job submitted right
    after (N+1) once derived the same port and met in one rendezvous. The
    array task trains a segmenter (its polygons staged, 2 nodes x 2 ranks)."""
    from hpcyolo.login.shapes import make_shapes

    polygons = make_shapes(tmp_path / "seg", n_train=48, n_val=16, imgsz=64, classes=3, seed=0, task="segment")
    site = site_file(tmp_path, scratch_root)
    render = f"{VENV_BIN / 'hpcyolo'} render {site} "
    jobs = []
    for name, extra, data, task in (("arr", "--array=1", polygons, "segment"), ("plain", "", shapes, "detect")):
        job = job_file(tmp_path, name, data, epochs=1, task=task)
        r = subprocess.run(f"{render} {job} | sbatch --parsable {extra}", shell=True, env=slurm_env, cwd=tmp_path,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        jobs.append(int(r.stdout.strip().split(";")[0]))
    array_id, plain_id = jobs
    assert plain_id == array_id + 1  # the pair that collided: (array id + task id) == plain id
    assert default_port(array_id) != default_port(plain_id)
    for name, job_id in zip(("arr", "plain"), jobs):
        info = slurm.wait(job_id, timeout=900, env=slurm_env)
        log = job_log(tmp_path, name, job_id)
        assert info["JobState"] == "COMPLETED", log[-3000:]
        results = (tmp_path / "runs" / name / "results.csv").read_text()
        assert results.count("\n") == 2 and ("metrics/mAP50-95(M)" in results) == (name == "arr")
        assert "refuse" not in log and "already in use" not in log
    assert leftovers(scratch_root) == []


def test_g_time_limit_with_and_without_a_warning_signal_checkpoints_requeues_and_resumes_exactly(
        uninterrupted, tmp_path, shapes, slurm_env):
    """Two jobs with --time=2 min, side by side on the testbed's nodes (both
    wait on the clock, idle: their ranks hold after step HOLD_STEP until they
    are stopped). "term": a site that sends no warning signal (preemption.grace
    0): the time limit's SIGTERM reaches the tasks and the batch shell KillWait
    seconds before SIGKILL. "signal": the site's USR2 30 s before the end (Slurm
    may send it up to a minute earlier), submitted once the first holds. Each
    requeues, resumes and ends identical to the uninterrupted run, its scratch
    cleaned."""
    a_tmp, _, a_info, _ = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    scratch = {name: Path("/dev/shm") / f"hpcyolo-test-{uuid.uuid4().hex[:8]}" for name in ("term", "signal")}
    runs = {name: tmp_path / name for name in scratch}
    try:
        jobs = {}
        for name, grace in (("term", 0), ("signal", 30)):
            site = site_file(runs[name], scratch[name], env={HOLD_ENV: str(HOLD_STEP)}, grace=grace, max_requeues=10)
            jobs[name] = submit(site, job_file(runs[name], f"train-g-{name}", shapes, time_limit="2"), slurm_env,
                                runs[name])
            if name == "term":  # the SIGTERM comes at the limit: the job must hold by then
                wait_for_log(runs[name], "train-g-term", jobs[name], slurm_env,
                             lambda log: f"holding after step {HOLD_STEP}" in log, 600, "the ranks to hold")

        info = slurm.wait(jobs["term"], timeout=600, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
        log = job_log(runs["term"], "train-g-term", jobs["term"])
        assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
        assert "#SBATCH --signal" not in next((runs["term"] / "runs" / "train-g-term").glob("sbatch-*.sh")).read_text()
        assert "DUE TO TIME LIMIT" in log
        assert "stopping for preemption (SIGTERM: the job reached its time limit) at epoch 2, batch 3" in log
        assert "checkpointed (SIGTERM: the job reached its time limit); requeueing job" in log
        assert f"resumed from ckpt-{HOLD_STEP:09d}.pt: epoch 2, batch 3" in log

        # A signal sent before the hold (a slow start) stops the first job earlier, and the resumed
        # one then holds until its own signal: one restart or two, the same end.
        info = slurm.wait(jobs["signal"], timeout=600, env=slurm_env,
                          settled=lambda i: int(i.get("Restarts") or 0) >= 1)
        log = job_log(runs["signal"], "train-g-signal", jobs["signal"])
        assert info["JobState"] == "COMPLETED" and info["Restarts"] in ("1", "2"), log[-3000:]
        # Sent before the time limit, the site's signal (not the limit's SIGTERM) stops the ranks.
        assert "stopping for preemption (SIGUSR2)" in log and "checkpointed (SIGUSR2); requeueing job" in log, \
            log[-3000:]
        assert "DUE TO TIME LIMIT" not in log and "resumed from ckpt-" in log
        assert "restart 1" in (runs["signal"] / "runs" / "train-g-signal" / "hpcyolo-run").read_text()

        for name, run in runs.items():
            assert_identical(a_tmp / "runs" / "train-a", run / "runs" / f"train-g-{name}")
            assert leftovers(scratch[name]) == [], name
    finally:
        for root in scratch.values():
            shutil.rmtree(root, ignore_errors=True)


def test_g3_preempted_by_a_higher_priority_partition_requeues_and_resumes_exactly(
        uninterrupted, tmp_path, shapes, slurm_env, scratch_root):
    """Preemption as Slurm delivers it (the testbed's preempt/partition_prio,
    PreemptMode=REQUEUE, GraceTime): a job of the urgent partition needs both
    nodes, Slurm picks the training job, its tasks get SIGTERM at the start
    of the grace; the trainer checkpoints, the batch script requeues, the
    urgent job runs, and the training job resumes when the nodes are free."""
    from testbed.slurm_testbed import GRACE_TIME, PREEMPTIBLE, URGENT

    a_tmp, _, a_info, _ = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    site = site_file(tmp_path, scratch_root, env={HOLD_ENV: str(HOLD_STEP)}, partition=PREEMPTIBLE)
    job_id = submit(site, job_file(tmp_path, "train-g3", shapes), slurm_env, tmp_path)
    wait_for_log(tmp_path, "train-g3", job_id, slurm_env, lambda log: f"holding after step {HOLD_STEP}" in log, 600,
                 "the ranks to hold mid-epoch")
    urgent = subprocess.run(["sbatch", "--parsable", "--partition", URGENT, "--nodes=2", "--exclusive",
                             f"--output={tmp_path}/urgent-%j.out", "--wrap", "echo urgent job on $SLURM_JOB_NODELIST"],
                            env=slurm_env, cwd=tmp_path, capture_output=True, text=True)
    assert urgent.returncode == 0, urgent.stderr
    urgent_id = int(urgent.stdout.strip())
    stopped = time.monotonic()
    wait_for_log(tmp_path, "train-g3", job_id, slurm_env, lambda log: "requeueing job" in log, GRACE_TIME + 30,
                 "the checkpoint and the requeue, within the grace")
    assert time.monotonic() - stopped < GRACE_TIME
    urgent_info = slurm.wait(urgent_id, timeout=300, env=slurm_env)
    info = slurm.wait(job_id, timeout=600, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
    log = job_log(tmp_path, "train-g3", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert urgent_info["JobState"] == "COMPLETED"
    assert urgent_info["StartTime"] <= info["StartTime"]  # the resumed start waited for the urgent job's nodes
    assert "stopping for preemption (SIGTERM: Slurm is preempting the job) at epoch 2, batch 3" in log
    assert "checkpointed (SIGTERM: Slurm is preempting the job); requeueing job" in log
    assert f"resumed from ckpt-{HOLD_STEP:09d}.pt: epoch 2, batch 3" in log
    assert_identical(a_tmp / "runs" / "train-a", tmp_path / "runs" / "train-g3")
    assert leftovers(scratch_root) == []


def test_h_checkpoint_write_killed_half_way_resumes_from_the_previous(uninterrupted, tmp_path, shapes, slurm_env,
                                                                      scratch_root):
    a_tmp, _, a_info, _ = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    # 6 steps per epoch, a checkpoint after each epoch only. The drill stops
    # the write of step 12's half-way; rank 0 (the writer) is killed there,
    # then the job is requeued by hand (max_failures 0: a retry without node1 would wait for
    # a second node the testbed does not have; test_slurm_health retries a one-node job).
    flag = write(tmp_path / "stall", "7")
    site = site_file(tmp_path, scratch_root, env={ckpt.STALL_DRILL_ENV: str(flag)}, max_failures=0)
    job_id = submit(site, job_file(tmp_path, "train-h", shapes, every_steps=0), slurm_env, tmp_path)
    wait_for(lambda: "drill: checkpoint write stalled" in job_log(tmp_path, "train-h", job_id), 600,
             "the stalled write")
    folder = tmp_path / "runs" / "train-h" / "checkpoints"
    partial = list(folder.glob(".ckpt-000000012.pt.*.tmp"))
    assert len(partial) == 1 and [p.name for p in ckpt.checkpoints(folder)] == ["ckpt-000000006.pt"]
    os.kill(task_pid(job_id, 0), signal.SIGKILL)
    info = slurm.wait(job_id, timeout=120, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, "train-h", job_id)
    assert info["JobState"] == "FAILED", log[-3000:]
    assert "hpcyolo: rank 0 on node1: Killed; not retried: preemption.max_failures is 0" in log, log[-3000:]
    assert ckpt.load_latest(folder, warn=print)["global_step"] == 6  # never the partial file

    flag.unlink()
    slurm.requeue(job_id, env=slurm_env)
    info = slurm.wait(job_id, timeout=900, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
    log = job_log(tmp_path, "train-h", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert f"removed {partial[0].name}, a checkpoint whose write never finished" in log
    assert "resumed from ckpt-000000006.pt" in log
    assert_identical(a_tmp / "runs" / "train-a", tmp_path / "runs" / "train-h")
    assert leftovers(scratch_root) == []


def test_i_resume_with_other_settings_stops_before_the_script_writes(uninterrupted, tmp_path, shapes, slurm_env,
                                                                      scratch_root):
    # run.resume: true lets a job continue a run, but only the same run: the
    # script asks the trainer's rule before it records a start or copies itself.
    a_tmp, _, a_info, _ = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    run = tmp_path / "runs" / "train-a"
    shutil.copytree(a_tmp / "runs" / "train-a", run)
    files = lambda: {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}  # noqa: E731
    before = files()
    spec = json.loads(job_file(tmp_path, "train-a", shapes).read_text())
    spec["run"], spec["train"]["seed"] = {"resume": True}, 1
    job = write(tmp_path / "train-a.yaml", json.dumps(spec))
    job_id = submit(site_file(tmp_path, scratch_root), job, slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=300, env=slurm_env)
    log = job_log(tmp_path, "train-a", job_id)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), log[-2000:]
    assert f"hpcyolo: error: {run} holds a run of yolov8n on " in log and "differs in train.seed (0 -> 1)" in log, log
    assert files() == before  # no start recorded, no script copied, nothing else touched
    assert leftovers(scratch_root) == []


RANK_LINE = re.compile(r"^rank (\d+): local rank (\d+) of (\d+) on host (\S+), world size (\d+), device (\S+)$", re.M)
STAGE_LINE = re.compile(r"^hpcyolo stage: (?:copying .* on|.* already staged on) (node\d+)\b", re.M)


def uneven_job(tmp_path: Path, name: str, data: Path, resources: dict) -> Path:
    spec = {"name": name, "resources": {**resources, "time": "00:10:00"},
            "data": {"yaml": str(data), "stage": True},
            "train": {"model": "n", "epochs": 1, "batch": 6, "nbs": 6, "imgsz": 64, "workers": 2,
                      "close_mosaic": 1, "seed": 0}}
    return write(tmp_path / f"{name}.yaml", json.dumps(spec))


def rank_layout(log: str) -> dict[int, tuple[int, int, str]]:
    """rank -> (local rank, local world size, host), from the trainer's own lines."""
    ranks = {}
    for rank, local, local_world, host, world, device in RANK_LINE.findall(log):
        assert (int(world), device) == (3, "cpu")
        ranks[int(rank)] = (int(local), int(local_world), host)
    return ranks


def assert_uneven_run(tmp_path: Path, name: str, job_id: int, info: dict, expected: dict | None = None) -> None:
    log = job_log(tmp_path, name, job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    ranks = rank_layout(log)
    assert sorted(ranks) == [0, 1, 2], log[-3000:]
    if expected is not None:
        assert ranks == expected, log[-3000:]
    by_host: dict[str, list[tuple[int, int]]] = {}
    for local, local_world, host in ranks.values():
        by_host.setdefault(host, []).append((local, local_world))
    # Uneven: one node runs 2 processes, the other 1; on each node the local
    # ranks are 0..n-1 and the local world size is n.
    assert sorted(len(v) for v in by_host.values()) == [1, 2] and set(by_host) == {"node1", "node2"}
    for pairs in by_host.values():
        assert sorted(pairs) == [(i, len(pairs)) for i in range(len(pairs))]
    # Staging: one stage task per node (they share this machine's /dev/shm:
    # one copies, the other finds the copy complete).
    assert sorted(STAGE_LINE.findall(log)) == ["node1", "node2"], log[-3000:]
    assert (tmp_path / "runs" / name / "results.csv").read_text().count("\n") == 2
    assert (tmp_path / "runs" / name / "weights" / "last.pt").is_file()


def test_j_uneven_cpu_layout_three_tasks_over_two_nodes(tmp_path, shapes, slurm_env, scratch_root):
    """A CPU site's `resources.tasks: 3` over 2 nodes: Slurm places 2 on one
    node and 1 on the other; every rank learns its place from Slurm."""
    job = uneven_job(tmp_path, "uneven-cpu", shapes, {"nodes": 2, "tasks": 3})
    site = site_file(tmp_path, scratch_root)
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "render", str(site), str(job)], env=slurm_env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=3\n" in r.stdout and "--ntasks-per-node" not in r.stdout.split(
        "set -euo")[0]
    job_id = submit(site, job, slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=900, env=slurm_env)
    assert_uneven_run(tmp_path, "uneven-cpu", job_id, info)
    assert leftovers(scratch_root) == []


def test_k_uneven_gpus_where_one_node_has_one_free(tmp_path, shapes, slurm_env, scratch_root):
    """`resources.gpus: 3` over 2 nodes of 8 GPUs, while another job holds 7
    of node1's: Slurm must give node1 one process and node2 two. The GPUs are
    the testbed's GRES (real scheduling, CUDA_VISIBLE_DEVICES per task, no
    CUDA), so the processes train on the CPU."""
    blocker = subprocess.run(["sbatch", "--parsable", "--nodelist=node1", "--nodes=1", "--gres=gpu:7",
                              "--time=00:20:00", "--output=/dev/null", "--wrap", "sleep 900"],
                             env=slurm_env, capture_output=True, text=True)
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = int(blocker.stdout.strip().split(";")[0])
    try:
        wait_for(lambda: slurm.show_job(blocker_id, env=slurm_env).get("JobState") == "RUNNING", 60,
                 "the job holding 7 GPUs of node1")
        site = site_file(tmp_path, scratch_root)
        spec = yaml.safe_load(site.read_text())
        spec["node"].update(gpus=8, cpus=8)
        spec["slurm"]["gpu_request"] = "gres"
        write(site, yaml.safe_dump(spec))
        job = uneven_job(tmp_path, "uneven-gpu", shapes, {"nodes": 2, "gpus": 3})
        job_id = submit(site, job, slurm_env, tmp_path)
        info = slurm.wait(job_id, timeout=900, env=slurm_env)
        # Block distribution: rank 0 on the first node, where the batch script runs.
        assert_uneven_run(tmp_path, "uneven-gpu", job_id, info,
                          {0: (0, 1, "node1"), 1: (0, 2, "node2"), 2: (1, 2, "node2")})
        log = job_log(tmp_path, "uneven-gpu", job_id)
        assert "--gpus-per-task=1" in (tmp_path / "runs" / "uneven-gpu" / f"sbatch-{job_id}.sh").read_text()
        assert "Traceback" not in log
    finally:
        subprocess.run(["scancel", str(blocker_id)], env=slurm_env, capture_output=True)
    assert leftovers(scratch_root) == []
