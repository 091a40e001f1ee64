"""Training end to end on the real Slurm testbed: `hpcyolo render | sbatch` on
2 nodes with staging, preemption and requeue ending bit-identical to an
uninterrupted run, a killed rank ending the job, a time limit that runs
out, and a checkpoint write killed half-way."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, VENV_BIN, job_log, submit, write

from hpcyolo import slurm
from hpcyolo.shapes import make_shapes
from hpcyolo_trainer import checkpoint as ckpt

pytestmark = pytest.mark.slurm
EPOCHS = 3


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("data") / "shapes", n_train=48, n_val=16, imgsz=64, classes=3, seed=0)


def site_file(tmp_path: Path, env: dict | None = None, **preemption) -> Path:
    spec = yaml.safe_load((REPO / "site_configs" / "testbed.yaml").read_text())
    spec["storage"]["runs"] = str(tmp_path / "runs")
    spec["storage"]["scratch"] = str(tmp_path / "scratch")
    spec["preemption"].update(preemption)
    if env:
        spec.setdefault("environment", {})["env"] = env
    return write(tmp_path / "site.yaml", yaml.safe_dump(spec))


def job_file(tmp_path: Path, name: str, data: Path, epochs: int = EPOCHS, time_limit: str = "00:10:00") -> Path:
    spec = {"name": name, "resources": {"nodes": 2, "tasks_per_node": 1, "time": time_limit},
            "data": {"yaml": str(data), "stage": True},
            "train": {"model": "n", "epochs": epochs, "batch": 4, "nbs": 4, "imgsz": 64, "workers": 1,
                      "close_mosaic": 1, "seed": 0},
            "checkpoint": {"keep": 20}}
    return write(tmp_path / f"{name}.yaml", json.dumps(spec))


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def final_weights(run: Path) -> dict:
    return ckpt.load_latest(run / "checkpoints", warn=print)


def assert_identical(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), f"model.{name} differs"
    for name, tensor in a["ema"]["module"].items():
        assert torch.equal(tensor, b["ema"]["module"][name]), f"ema.{name} differs"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, shapes, testbed):
    """(a): the job as a user submits it, run to the end."""
    tmp = tmp_path_factory.mktemp("a")
    testbed.revive()
    env = {**os.environ, **testbed.env, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    job_id = submit(site_file(tmp), job_file(tmp, "train-a", shapes), env, tmp)
    info = slurm.wait(job_id, timeout=600, env=env)
    return tmp, job_id, info


def test_a_trains_on_two_nodes_with_staging(uninterrupted):
    tmp, job_id, info = uninterrupted
    log = job_log(tmp, "train-a", job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    run = tmp / "runs" / "train-a"
    assert (run / "results.csv").read_text().count("\n") == EPOCHS + 1
    for name in ("results.png", "weights/best.pt", "weights/last.pt", "config.yaml", f"sbatch-{job_id}.sh"):
        assert (run / name).is_file(), name
    assert final_weights(run)["epoch"] == EPOCHS
    # One stage task per node; the testbed's "nodes" share one machine and so
    # one scratch folder: one copies, the other finds the copy complete.
    assert log.count("hpcyolo stage:") >= 2 and "node1" in log and "node2" in log
    assert "2 rank(s)" in log
    assert not any((tmp / "scratch").rglob("data.yaml"))  # scratch cleaned after success


def test_b_preempted_job_requeues_resumes_and_matches(uninterrupted, tmp_path, shapes, slurm_env):
    a_tmp, _, a_info = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    job_id = submit(site_file(tmp_path), job_file(tmp_path, "train-b", shapes), slurm_env, tmp_path)
    wait_for(lambda: "epoch 1/3: loss" in job_log(tmp_path, "train-b", job_id), 300, "the first epoch")
    slurm.cancel(job_id, "--signal=USR2", env=slurm_env)  # to the job steps, as --signal=USR2@T does
    info = slurm.wait(job_id, timeout=600, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
    log = job_log(tmp_path, "train-b", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert "stopping for preemption (SIGUSR2)" in log and "requeueing job" in log
    assert "resumed from ckpt-" in log
    run = tmp_path / "runs" / "train-b"
    assert "restart 1" in (run / "hpcyolo-run").read_text()  # same run directory after the requeue
    assert_identical(final_weights(a_tmp / "runs" / "train-a"), final_weights(run))


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


def test_c_killed_rank_ends_the_job(tmp_path, shapes, slurm_env):
    job_id = submit(site_file(tmp_path), job_file(tmp_path, "train-c", shapes, epochs=50), slurm_env, tmp_path)
    wait_for(lambda: "epoch 1/50: loss" in job_log(tmp_path, "train-c", job_id), 300, "the first epoch")
    os.kill(task_pid(job_id, 1), signal.SIGKILL)
    killed = time.monotonic()
    info = slurm.wait(job_id, timeout=120, env=slurm_env, poll=0.5)
    assert time.monotonic() - killed < 60
    log = job_log(tmp_path, "train-c", job_id)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", log[-3000:]
    assert "task 1" in log  # srun names the dead rank (task id = rank) and its node


def test_d_time_limit_checkpoints_requeues_and_completes(tmp_path, shapes, slurm_env):
    # --time=2 min with the signal 30 s before the end (Slurm may send it up
    # to a minute earlier); 5 epochs take longer than that here.
    site = site_file(tmp_path, grace=30, max_requeues=10)
    job_id = submit(site, job_file(tmp_path, "train-d", shapes, epochs=5, time_limit="2"), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=2400, env=slurm_env, settled=lambda i: int(i.get("Restarts", 0)) >= 1)
    log = job_log(tmp_path, "train-d", job_id)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, log[-3000:]
    assert "stopping for preemption (SIGUSR2)" in log and "resumed from ckpt-" in log
    assert final_weights(tmp_path / "runs" / "train-d")["epoch"] == 5


def test_e_checkpoint_write_killed_half_way_resumes_from_the_previous(uninterrupted, tmp_path, shapes, slurm_env):
    a_tmp, _, a_info = uninterrupted
    assert a_info["JobState"] == "COMPLETED"
    # 48 images, 2 ranks x 2: 12 steps per epoch, a checkpoint after each
    # epoch. The drill stops the write of step 24's half-way; rank 0 (the
    # writer) is killed there, then the job is requeued as after a node failure.
    flag = write(tmp_path / "stall", "13")
    site = site_file(tmp_path, env={ckpt.STALL_DRILL_ENV: str(flag)})
    job_id = submit(site, job_file(tmp_path, "train-e", shapes), slurm_env, tmp_path)
    wait_for(lambda: "drill: checkpoint write stalled" in job_log(tmp_path, "train-e", job_id), 300, "the stalled write")
    folder = tmp_path / "runs" / "train-e" / "checkpoints"
    partial = list(folder.glob(".ckpt-000000024.pt.*.tmp"))
    assert len(partial) == 1 and [p.name for p in ckpt.checkpoints(folder)] == ["ckpt-000000012.pt"]
    os.kill(task_pid(job_id, 0), signal.SIGKILL)
    info = slurm.wait(job_id, timeout=120, env=slurm_env, poll=0.5)
    assert info["JobState"] == "FAILED", job_log(tmp_path, "train-e", job_id)[-3000:]
    assert ckpt.load_latest(folder, warn=print)["global_step"] == 12  # never the partial file

    flag.unlink()
    slurm.requeue(job_id, env=slurm_env)
    info = slurm.wait(job_id, timeout=600, env=slurm_env, settled=lambda i: i.get("Restarts") == "1")
    log = job_log(tmp_path, "train-e", job_id)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    assert f"removed {partial[0].name}, a checkpoint whose write never finished" in log
    assert "resumed from ckpt-000000012.pt" in log
    assert_identical(final_weights(a_tmp / "runs" / "train-a"), final_weights(tmp_path / "runs" / "train-e"))
