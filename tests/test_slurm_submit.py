"""`hpcyolo submit` on the real Slurm testbed: through submitit a job trains,
is signalled, checkpoints, is requeued by its script and resumes to
completion in the same run directory; a sweep is one job array; status and
logs follow a running and a finished run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import VENV_BIN, write
from test_slurm_train import EPOCHS, HOLD_STEP, LONG, assert_identical
from test_slurm_train import job_file as train_job_file
from test_slurm_train import site_file, wait_for
from test_submit import resources

from hpcyolo import slurm
from hpcyolo.login.config import load_job, load_site
from hpcyolo.login.plan import make_plan
from hpcyolo.login.render import render_sbatch
from hpcyolo_trainer.common.preemption import HOLD_ENV

pytestmark = pytest.mark.slurm


def job_file(tmp_path: Path, name: str, data: Path, nodes: int = 2, epochs: int = EPOCHS) -> Path:
    spec = {"name": name, "resources": {"nodes": nodes, "tasks_per_node": 1, "time": "00:10:00"},
            "data": {"yaml": str(data), "stage": True},
            "train": {"model": "n", "epochs": epochs, "batch": 4, "nbs": 4, "imgsz": 64, "workers": 1,
                      "close_mosaic": 1, "seed": 0}}
    return write(tmp_path / f"{name}.yaml", json.dumps(spec))


def hpcyolo(*args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def log_so_far(run: Path, env: dict, cwd: Path) -> str:
    """`hpcyolo logs RUN`, or "" while it says the job's log is not there yet."""
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "logs", str(run)], env=env, cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0 or "no log yet" in r.stderr, r.stderr
    return r.stdout


def test_submit_trains_is_requeued_and_resumes_exactly(uninterrupted, tmp_path, shapes, slurm_env):
    # The same job spec as the sbatch tests' (2 nodes x 2 tasks, 2 loader workers).
    # The ranks wait after step HOLD_STEP (epoch 2, batch 3) until the signal reaches them.
    site, job = site_file(tmp_path, env={HOLD_ENV: str(HOLD_STEP)}), train_job_file(tmp_path, "sub-a", shapes)
    submitted = hpcyolo("submit", site, job, env=slurm_env, cwd=tmp_path)
    job_id = submitted.stdout.strip()
    run = tmp_path / "runs" / "sub-a"
    assert f"job {job_id}, run directory {run}" in submitted.stderr
    log0 = run / "submitit" / f"{job_id}_0_log.out"
    wait_for(lambda: log0.exists() and f"holding after step {HOLD_STEP}" in log0.read_text(), 600,
             "the ranks to hold mid-epoch")

    running = hpcyolo("status", run, env=slurm_env, cwd=tmp_path).stdout
    assert f"job       {job_id} (via submitit)" in running and "RUNNING" in running, running
    assert "hpcyolo stage:" in hpcyolo("logs", run, env=slurm_env, cwd=tmp_path).stdout

    slurm.cancel(int(job_id), "--signal=USR2", env=slurm_env)
    info = slurm.wait(int(job_id), timeout=600, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
    log = log0.read_text()
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert "stopping for preemption (SIGUSR2) at epoch 2, batch 3" in log and \
        f"checkpointed (SIGUSR2); requeueing job {job_id} (1 of 3)" in log
    # submitit's function ran at each start and wrote one result: success, after the second.
    assert log.count("Loading pickle") == 2 and log.count("Job completed successfully") == 1, log[-3000:]
    assert f"resumed from ckpt-{HOLD_STEP:09d}.pt: epoch 2, batch 3" in log
    assert (run / "results.csv").read_text().count("\n") == EPOCHS + 1
    assert_identical(uninterrupted[0] / "runs" / "train-a", run)
    assert [line.split()[3] for line in (run / "hpcyolo-run").read_text().splitlines()] == ["0", "1"]

    finished = hpcyolo("status", run, env=slurm_env, cwd=tmp_path).stdout
    assert "COMPLETED" in finished and f"epoch {EPOCHS} done" in finished, finished
    assert "done: results in" in hpcyolo("logs", run, env=slurm_env, cwd=tmp_path).stdout
    # The script submitit wrote asks for what `hpcyolo render` asks for.
    plan = make_plan(load_site(site), load_job(job), site_file=str(site), job_file=str(job))
    submitted = (run / "submitit" / f"{job_id}_submission.sh").read_text()
    assert resources(submitted) == resources(render_sbatch(plan))


def test_sweep_runs_as_one_array_with_a_run_each(tmp_path, shapes, slurm_env):
    site, job = site_file(tmp_path), job_file(tmp_path, "sub-s", shapes, nodes=1, epochs=1)
    # --parallel 1 (--array=0-1%1): one element at a time. Two elements
    # launched in the same instant on one testbed node have made Debian's
    # slurmd 22.05.8 abort (see Testbed.revive); a real cluster runs them side by side.
    ids = hpcyolo("submit", site, job, "--sweep", "train.lr0=0.01,0.02", "--parallel", "1", env=slurm_env,
                  cwd=tmp_path).stdout.split()
    assert len(ids) == 2 and ids[0].split("_")[0] == ids[1].split("_")[0] and \
        sorted(i.split("_")[1] for i in ids) == ["0", "1"]
    submitted = tmp_path / "runs" / ".sweep-sub-s" / "submitit" / f"{ids[0].split('_')[0]}_submission.sh"
    assert "#SBATCH --array=0-1%1" in submitted.read_text()
    for job_id in ids:
        info = slurm.wait(job_id, timeout=600, env=slurm_env)
        assert info["JobState"] == "COMPLETED", info
    for lr in ("0.01", "0.02"):
        run = tmp_path / "runs" / f"sub-s-lr0_{lr}"
        assert (run / "results.csv").read_text().count("\n") == 2
        assert f"lr0: {lr}" in (run / "config.yaml").read_text()


def test_submit_via_sbatch_then_status_and_cancel(tmp_path, shapes, slurm_env):
    site, job = site_file(tmp_path), job_file(tmp_path, "sub-c", shapes, epochs=LONG)
    job_id = hpcyolo("submit", site, job, "--via", "sbatch", env=slurm_env, cwd=tmp_path).stdout.strip()
    run = tmp_path / "runs" / "sub-c"
    wait_for(lambda: "RUNNING" in hpcyolo("status", run, env=slurm_env, cwd=tmp_path).stdout, 120, "the job to run")
    # Slurm shows a job RUNNING a moment before its batch step has created the log file.
    wait_for(lambda: "training yolov8n on" in log_so_far(run, env=slurm_env, cwd=tmp_path), 300, "training to start")
    assert "via sbatch" in hpcyolo("status", run, env=slurm_env, cwd=tmp_path).stdout
    assert "cancelled job" in hpcyolo("cancel", run, env=slurm_env, cwd=tmp_path).stderr
    info = slurm.wait(int(job_id), timeout=120, env=slurm_env)
    assert info["JobState"] == "CANCELLED"
    assert "CANCELLED" in hpcyolo("status", run, env=slurm_env, cwd=tmp_path).stdout
