"""`hpcyolo run`: the job on this machine without Slurm, two ranks, staging,
the no-clobber rule, and a stop by signal that a --resume continues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, write

from hpcyolo.login.shapes import make_shapes

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
