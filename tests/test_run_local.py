"""`hpcyolo run`: the job on this machine without Slurm, two ranks, staging,
the no-clobber rule, and a stop by signal that a --resume continues."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, write

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common import rundir

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")


def job(tmp_path: Path, data: Path, epochs: int) -> Path:
    return write(tmp_path / "job.yaml", json.dumps({
        "name": "tiny", "resources": {"nodes": 1, "tasks_per_node": 2},
        "data": {"yaml": str(data), "stage": True},
        "train": {"epochs": epochs, "batch": 4, "nbs": 4, "imgsz": 64, "workers": 0, "close_mosaic": 0}}))


def run(args, home: Path, **kw):
    return subprocess.Popen([HPCYOLO, "run", *map(str, args)], env={**os.environ, "HOME": str(home)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_run_trains_refuses_to_clobber_and_resumes_after_a_stop(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=4, imgsz=64, classes=2, seed=0)
    site = REPO / "site_configs" / "local.yaml"
    spec = job(tmp_path, data, epochs=40)
    proc = run([site, spec], tmp_path)
    run_dir = tmp_path / "hpcyolo-runs" / "tiny"
    deadline = time.monotonic() + 300
    while not (run_dir / "results.csv").exists():  # one epoch done: stop it as Slurm would warn it
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGUSR2)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, out
    assert "stopping for preemption (SIGUSR2)" in out and "add --resume" in out

    again = run([site, spec], tmp_path)
    out = again.communicate(timeout=60)[0]
    assert again.returncode == 1 and "already holds a run" in out

    write(spec, json.dumps({**json.loads(spec.read_text()), "train": {
        **json.loads(spec.read_text())["train"], "epochs": 2}}))
    resumed = run(["--resume", site, spec], tmp_path)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out
    assert "resumed from ckpt-" in out and "hpcyolo run: epoch 2: mAP50" in out
    assert (run_dir / "results.png").is_file() and (run_dir / "weights" / "last.pt").is_file()


def rank_pids(parent: int) -> dict[int, int]:
    """rank -> pid of the training processes below `parent` (their RANK variable)."""
    found = {}
    for child in Path("/proc").glob("[0-9]*"):
        try:
            if int((child / "stat").read_text().rsplit(")", 1)[1].split()[1]) != parent:
                continue
            env = dict(x.split("=", 1) for x in (child / "environ").read_text().split("\0") if "=" in x)
        except (OSError, ValueError, IndexError):
            continue
        if "RANK" in env and "hpcyolo.cli" in (child / "cmdline").read_text():
            found[int(env["RANK"])] = int(child.name)
    return found


def test_a_rank_killed_mid_run_is_restarted_in_place_from_the_checkpoint_and_the_run_completes(tmp_path):
    """A real SIGKILL of rank 1 (as the OOM killer of another job or a lost GPU would end it) after the first
    epoch's checkpoint: `hpcyolo run` starts the training again on this machine, it resumes from that
    checkpoint and completes; failures.csv and `hpcyolo status` say what happened, each start has its ledger."""
    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=4, imgsz=64, classes=2, seed=0)
    spec = job(tmp_path, data, epochs=6)
    proc = run([REPO / "site_configs" / "local.yaml", spec], tmp_path)
    run_dir = tmp_path / "hpcyolo-runs" / "tiny"
    deadline = time.monotonic() + 300
    while not (run_dir / "results.csv").exists() or not list((run_dir / rundir.CHECKPOINTS).glob("ckpt-*.pt")):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    os.kill(rank_pids(proc.pid)[1], signal.SIGKILL)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert "rank 1 was killed by SIGKILL" in out and "starting the training again on this machine" in out, out
    assert "(failure 1 of preemption.max_failures 2)" in out and "resumed from ckpt-" in out, out
    assert [r["epoch"] for r in rundir.read_results(run_dir)] == ["1", "2", "3", "4", "5", "6"]
    rows = rundir.read_rows(run_dir / rundir.FAILURES)
    assert [(r["job"], r["restart"], r["ranks"], r["retried"]) for r in rows] == [("local", "0", "1", "yes")], rows
    assert rows[0]["reason"] == f"rank 1 on {socket.gethostname()}: Killed", rows
    assert {p.name for p in (run_dir / rundir.LEDGER).glob("local-*.json")} == {"local-0.json", "local-1.json"}
    status = subprocess.run([HPCYOLO, "status", str(run_dir)], capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert f"job       {proc.pid} (via local)" in status.stdout and "state     ENDED" in status.stdout, status.stdout
    assert "failure   job local start 0: rank 1 on" in status.stdout and "(restarted in place" in status.stdout
    assert "where the hours went (2 start(s) of the job)" in status.stdout, status.stdout
