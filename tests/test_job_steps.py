"""The job's steps around training (hpcyolo.node.job), as each path takes
them: the rules of `begin` and `end`, and `hpcyolo job begin` / `hpcyolo job
end` as the batch script runs them. The three paths on one job, side by
side, are in tests/test_job_paths.py (Slurm testbed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpcyolo.node import job
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.preemption import EXIT_CODE, PEER_LOST_EXIT_CODE

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")


def slurm_env(job_id: str = "77", restart: str = "0", **more: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": job_id, "SLURM_RESTART_COUNT": restart, **more}


def test_begin_records_a_first_start_and_refuses_a_second_job(tmp_path):
    run = tmp_path / "run"
    job.begin(run, via="sbatch", resume=False, request=None, log="/logs/my log.out", env=slurm_env())
    assert rundir.starts(run) == [rundir.Start("77", "0", socket.gethostname(), "/logs/my log.out")]
    # Another task of the same start (its rank 0 recorded already): it goes ahead, writing nothing.
    job.begin(run, via="submitit", resume=False, request=None, record=False, env=slurm_env())
    # The requeue of the same job continues its run.
    job.begin(run, via="sbatch", resume=False, request=None, env=slurm_env(restart="1"))
    assert [(s.job, s.restart) for s in rundir.starts(run)] == [("77", "0"), ("77", "1")]
    # Another job: refused unless it asks to continue, and nothing is written either way.
    before = (run / rundir.RECORD).read_text()
    with pytest.raises(HpcyoloError, match="already holds a run; set run.resume: true"):
        job.begin(run, via="sbatch", resume=False, request=None, env=slurm_env("78"))
    with pytest.raises(HpcyoloError, match="add --resume"):
        job.begin(run, via="local", resume=False, request=None, resume_how="add --resume", env={})
    assert (run / rundir.RECORD).read_text() == before
    job.begin(run, via="local", resume=True, request=None, env={})
    assert (run / rundir.RECORD).read_text().splitlines()[-1] == rundir.local_start_line(socket.gethostname(), os.getpid())


def test_begin_counts_starts_not_submissions(tmp_path):
    # `hpcyolo submit` writes its journal before the job starts: the job's own first start is not refused by it.
    run = tmp_path / "run"
    rundir.record_job(run, {"job": "5_1", "via": "submitit"})
    assert rundir.holds_run(run) and not rundir.started_before(run, "5_1", "0")
    job.begin(run, via="submitit", resume=False, request=None, env=slurm_env("6", SLURM_ARRAY_JOB_ID="5",
                                                                             SLURM_ARRAY_TASK_ID="1"))
    assert [(s.job, s.restart) for s in rundir.starts(run)] == [("5_1", "0")]


def test_begin_continues_only_the_same_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    saved = {"data": "/d/a.yaml", "model": "yolov8n", "seed": 0, "epochs": 3}
    (run / rundir.CONFIG).write_text("data: /d/a.yaml\nmodel: yolov8n\nseed: 0\nepochs: 3\n")
    with pytest.raises(HpcyoloError, match=r"differs in train.seed \(0 -> 1\)"):
        job.begin(run, via="sbatch", resume=True, request={**saved, "seed": 1}, env=slurm_env())
    assert not (run / rundir.RECORD).exists()
    job.begin(run, via="sbatch", resume=True, request={**saved, "epochs": 9}, env=slurm_env())
    assert rundir.start_count(run) == 1


def test_end_says_what_the_exit_means(tmp_path):
    marker = str(tmp_path / ".preempted-77-0")
    done = job.end(0, marker, job="77", restart=0, max_requeues=3)
    assert done == job.Ending(0, False, None)
    failed = job.end(1, marker, job="77", restart=0, max_requeues=3,
                     failed_first="rank 1 on node2 failed first (Killed)")
    assert failed == job.Ending(1, False, "rank 1 on node2 failed first (Killed); the training step ended with exit 1")
    requeue = job.end(EXIT_CODE, marker, job="77", restart=1, max_requeues=3)
    assert requeue.requeue and requeue.code == 0
    assert requeue.message == "checkpointed (exit 75); requeueing job 77 (2 of 3)"
    # srun reported another rank's kill, but the trainer's marker says it checkpointed.
    Path(marker).write_text("SIGUSR2 at epoch 2 batch 3\n")
    last = job.end(137, marker, job="77", restart=3, max_requeues=3)
    assert last == job.Ending(EXIT_CODE, False, "checkpointed (SIGUSR2 at epoch 2 batch 3), but stopped "
                                                "after 3 requeues; resubmit with run.resume: true to go on")
    local = job.end(EXIT_CODE, None, job="local", restart=0, max_requeues=0, how_to_continue="add --resume")
    assert local == job.Ending(EXIT_CODE, False, "checkpointed (exit 75); add --resume")


def test_failed_first_skips_the_ranks_that_only_lost_their_peers():
    errors = (f"srun: error: node1: task 0: Exited with exit code {PEER_LOST_EXIT_CODE}\n"
              "some training output\n"
              "srun: error: node2: tasks 2-3: Killed\n"
              "srun: error: node1: task 1: Exited with exit code 1\n")
    assert job.failed_first(errors) == "rank 2-3 on node2 failed first (Killed)"
    assert job.failed_first(errors, torchrun=True) == "the torchrun (task 2-3) on node2 failed first (Killed)"
    assert job.failed_first(f"srun: error: node1: task 0: Exited with exit code {PEER_LOST_EXIT_CODE}\n") is None
    assert job.failed_first("") is None


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([HPCYOLO, "job", *args], capture_output=True, text=True, env={**clean, **env})


def test_the_scripts_commands_print_the_decision(tmp_path):
    run = tmp_path / "run"
    begun = run_cli("begin", "--run-dir", str(run), "--log", "", env=slurm_env("90", "0"))
    assert begun.returncode == 0 and begun.stdout == "", begun.stderr
    assert rundir.starts(run) == [rundir.Start("90", "0", socket.gethostname(), None)]
    refused = run_cli("begin", "--run-dir", str(run), env=slurm_env("91", "0"))
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "already holds a run" in refused.stderr

    errors = tmp_path / "srun-errors"
    errors.write_text("srun: error: node2: task 3: Killed\n")
    marker = str(run / ".preempted-90-0")
    failed = run_cli("end", "--status", "137", "--marker", marker, "--max-requeues", "3", "--srun-errors",
                     str(errors), env=slurm_env("90", "0"))
    assert (failed.returncode, failed.stdout) == (0, "137\n")
    assert failed.stderr == "hpcyolo: rank 3 on node2 failed first (Killed); the training step ended with exit 137\n"
    requeued = run_cli("end", "--status", "75", "--marker", marker, "--max-requeues", "3", env=slurm_env("90", "0"))
    assert requeued.stdout == "requeue\n" and "requeueing job 90 (1 of 3)" in requeued.stderr
    ok = run_cli("end", "--status", "0", "--srun-errors", str(tmp_path / "missing"), env=slurm_env("90", "0"))
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "0\n", "")
