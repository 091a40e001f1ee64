"""The three paths of a job, on the real Slurm testbed, side by side: the
sbatch script (`hpcyolo submit --via sbatch`), a submitit job (`hpcyolo
submit`, whose job runs the rendered script) and `hpcyolo run` on this
machine take the job's steps (hpcyolo.node.job) from the same job spec. Each
is stopped once by the preemption drill after a checkpoint and continued (a
requeue by the script, in the two Slurm jobs; `hpcyolo run --resume`); what
each did is compared:
the start records, the staged copy it trained from, what it left in
node-local scratch, its exit codes and lines, and the trained state."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import VENV_BIN, max_abs_diff, write
from test_slurm_train import EPOCHS, STOP_STEP, final_state, leftovers, site_file

from hpcyolo import slurm
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE

pytestmark = pytest.mark.slurm
PATHS = ("sbatch", "submitit", "local")


def job_file(tmp_path: Path, name: str, data: Path) -> Path:
    """One node x 2 tasks, staged, 2 loader workers each: the same spec for every path but its run's name."""
    spec = {"name": name, "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:10:00"},
            "data": {"yaml": str(data), "stage": True},
            "train": {"model": "n", "epochs": EPOCHS, "batch": 8, "nbs": 8, "imgsz": 64, "workers": 2,
                      "close_mosaic": 1, "seed": 0},
            "checkpoint": {"keep": 20, "every_steps": 4}}
    return write(tmp_path / f"{name}.yaml", json.dumps(spec))


def hpcyolo(*args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "hpcyolo"), *map(str, args)], env=env, cwd=cwd, capture_output=True,
                          text=True)


def test_the_three_paths_take_the_same_steps(tmp_path, shapes, slurm_env):
    scratch = Path("/dev/shm") / f"hpcyolo-test-{uuid.uuid4().hex[:8]}"
    try:
        _three_paths(tmp_path, shapes, slurm_env, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _three_paths(tmp_path, shapes, slurm_env, scratch):
    site = site_file(tmp_path, scratch)
    env = {**slurm_env, DRILL_ENV: str(STOP_STEP)}  # each path's first start stops after this step
    runs = {path: tmp_path / "runs" / f"paths-{path}" for path in PATHS}
    jobs = {path: job_file(tmp_path, f"paths-{path}", shapes) for path in PATHS}

    # The two Slurm paths side by side (one node each), then `hpcyolo run`.
    ids = {}
    for path in ("sbatch", "submitit"):
        r = hpcyolo("submit", site, jobs[path], "--via", path, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        ids[path] = r.stdout.strip()
    for path, job_id in ids.items():
        info = slurm.wait(job_id, timeout=900, env=env, settled=lambda i: i.get("Restarts") == "1")
        assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), (path, info)
    local_env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    stopped = hpcyolo("run", site, jobs["local"], env=local_env, cwd=tmp_path)
    assert stopped.returncode == EXIT_CODE, stopped.stderr[-3000:]
    left_after_stop = leftovers(scratch)
    resumed = hpcyolo("run", site, jobs["local"], "--resume", env={**local_env, DRILL_ENV: ""}, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    # The lines each path said at its stop.
    logs = {"sbatch": (tmp_path / f"paths-sbatch-{ids['sbatch']}.out").read_text(),
            "submitit": (runs["submitit"] / "submitit" / f"{ids['submitit']}_0_log.out").read_text(),
            "local": stopped.stderr}
    reason = f"checkpointed (drill at step {STOP_STEP})"
    assert f"hpcyolo: {reason}" in logs["sbatch"] and f"requeueing job {ids['sbatch']} (1 of 3)" in logs["sbatch"]
    assert f"hpcyolo: {reason}" in logs["submitit"] and \
        f"requeueing job {ids['submitit']} (1 of 3)" in logs["submitit"]
    # submitit ran its function once a start, and reported it done once: after the last.
    assert logs["submitit"].count("Loading pickle") == 2 and logs["submitit"].count("completed successfully") == 1
    assert f"hpcyolo run: {reason}" in logs["local"] and "add --resume to the same command" in logs["local"]

    # The records: a start per start, each path's own words; the job's starts 0 and 1.
    for path in ("sbatch", "submitit"):
        starts = rundir.starts(runs[path])
        assert [(s.job, s.restart) for s in starts] == [(ids[path], "0"), (ids[path], "1")], path
        assert {s.host for s in starts} <= {"node1", "node2"}, (path, starts)
    assert (runs["submitit"] / rundir.RECORD).read_text().count(" via submitit") == 2
    assert (runs["sbatch"] / rundir.RECORD).read_text().count(" via ") == 0
    local_lines = (runs["local"] / rundir.RECORD).read_text().splitlines()
    assert len(local_lines) == 2 and all(line.startswith("local run on ") for line in local_lines)

    # Each trained from its staged copy in node-local scratch, and left nothing there.
    for path in PATHS:
        config = (runs[path] / rundir.CONFIG).read_text()
        staged = scratch / f"hpcyolo-{getpass.getuser()}" / f"paths-{path}" / "data" / "data.yaml"
        assert f"data: {staged}\n" in config, (path, config)
        assert not rundir.preempt_markers(runs[path]), path
    assert left_after_stop == [] and leftovers(scratch) == []

    # And the same training: every tensor of model, EMA and optimizer state equal.
    states = {path: final_state(runs[path]) for path in PATHS}
    for path in ("submitit", "local"):
        assert states[path]["global_step"] == states["sbatch"]["global_step"]
        for part in ("model", "ema", "optimizer"):
            assert max_abs_diff(states[path][part], states["sbatch"][part], part) == 0.0, (path, part)
    assert all(os.path.exists(runs[path] / "results.csv") for path in PATHS)
