"""`hpcyolo submit` asks Slurm for what `hpcyolo render` asks for; sweeps.

Without Slurm: the script submitit would write (its own sbatch writer, fed
by our parameters) against the rendered script, for every shipped site."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN

from hpcyolo.login.config import load_job, load_site
from hpcyolo.login.plan import make_plan
from hpcyolo.login.render import render_sbatch
from hpcyolo.login.submit import parse_sweeps, point_name, submitit_parameters, sweep_points
from hpcyolo.slurm import parse_time
from hpcyolo_trainer.common.errors import HpcyoloError

SITES = sorted((REPO / "site_configs").glob("*.yaml"))
JOB = REPO / "examples" / "coco8.yaml"
# What submitit picks itself (its log files, its wckey) or we choose per script.
NOT_RESOURCES = {"output", "error", "open-mode", "wckey", "job-name", "array"}


def directives(script: str) -> dict[str, str]:
    """#SBATCH --key=value lines as {key: value} (a switch: True)."""
    out = {}
    for line in script.splitlines():
        m = re.match(r"#SBATCH --([\w-]+)(?:[= ](.*))?$", line)
        if m:
            value = m[2].strip("'\"") if m[2] is not None else True
            out[m[1]] = value
    return out


def resources(script: str) -> dict[str, str]:
    d = {k: v for k, v in directives(script).items() if k not in NOT_RESOURCES}
    if "time" in d:  # D-HH:MM:SS or minutes: compare seconds
        d["time"] = parse_time(str(d["time"]))
    return d


def submitit_script(plan, folder: Path) -> str:
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command="python -m submitit.core._submit X", folder=folder,
                               **submitit_parameters(plan))


@pytest.mark.parametrize("site_path", SITES, ids=[p.stem for p in SITES])
def test_submitit_asks_for_the_same_resources(site_path, tmp_path):
    site = load_site(site_path)
    plan = make_plan(site, load_job(JOB), site_file=str(site_path), job_file=str(JOB))
    ours, theirs = resources(render_sbatch(plan)), resources(submitit_script(plan, tmp_path))
    assert ours == theirs
    assert {"nodes", "ntasks-per-node", "time", "requeue", "signal"} <= ours.keys()


def test_dry_run_prints_the_submitit_script(tmp_path):
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", str(REPO / "site_configs" / "testbed.yaml"), str(JOB),
                        "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=2" in r.stdout and "#SBATCH --no-kill" in r.stdout
    # The function runs in the batch shell (the script it runs starts the steps), not under submitit's srun.
    assert "srun" not in r.stdout and r.stdout.rstrip().endswith("<python -m submitit.core._submit FOLDER>")


def test_a_submitit_job_runs_the_rendered_script():
    """What `hpcyolo submit` pickles is `hpcyolo render`'s script but for
    the run record's path (`job begin --via submitit`); a script that fails
    fails the submitit job in one line."""
    from hpcyolo.login.submit import JobTask

    site_path = REPO / "site_configs" / "testbed.yaml"
    plan = make_plan(load_site(site_path), load_job(JOB), site_file=str(site_path), job_file=str(JOB))
    task = JobTask(render_sbatch(dataclasses.replace(plan, via="submitit")))
    rendered = render_sbatch(plan)
    assert task.script.count("--via submitit") == 1 and task.script.replace(" --via submitit", "") == rendered
    with pytest.raises(HpcyoloError, match=r"^the job's script ended with exit 3; its log above says why$"):
        JobTask("exit 3")()


def test_sweep_points_and_names():
    sweeps = parse_sweeps(("train.lr0=0.01,0.02", "train.model=n,s"))
    points = sweep_points(sweeps)
    assert points == [{"train.lr0": 0.01, "train.model": "n"}, {"train.lr0": 0.01, "train.model": "s"},
                      {"train.lr0": 0.02, "train.model": "n"}, {"train.lr0": 0.02, "train.model": "s"}]
    assert point_name("shapes", points[1]) == "shapes-lr0_0.01-model_s"
    assert len(point_name("x" * 60, points[0])) == 64
    for bad in ("train.lr0", "=1,2", "train.lr0=1,1"):
        with pytest.raises(HpcyoloError):
            parse_sweeps((bad,))


def test_sweep_of_an_unknown_key_names_it(tmp_path):
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", str(REPO / "site_configs" / "testbed.yaml"), str(JOB),
                        "--dry-run", "--sweep", "train.lr=0.1,0.2"], capture_output=True, text=True)
    assert r.returncode == 2 and "train.lr: unknown key; did you mean 'lr0' or 'lrf'?" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_sweep_dry_run_is_one_array(tmp_path):
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", str(REPO / "site_configs" / "testbed.yaml"), str(JOB),
                        "--dry-run", "--sweep", "train.lr0=0.01,0.02,0.03", "--parallel", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert directives(r.stdout)["array"] == "0-2%2"


def test_local_site_submits_in_the_background_and_status_follows(tmp_path, one_thread):
    import json
    import time

    import yaml

    from hpcyolo.login.shapes import make_shapes

    data = make_shapes(tmp_path / "shapes", n_train=8, n_val=4, imgsz=64, classes=2, seed=0)
    site = yaml.safe_load((REPO / "site_configs" / "local.yaml").read_text())
    site["storage"].update(runs=str(tmp_path / "runs"), scratch=str(tmp_path / "scratch"))
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    job = {"name": "loc", "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:10:00"},
           "data": {"yaml": str(data), "stage": True},
           "train": {"model": "n", "epochs": 1, "batch": 4, "nbs": 4, "imgsz": 64, "workers": 0, "close_mosaic": 1}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    hpcyolo = str(VENV_BIN / "hpcyolo")
    r = subprocess.run([hpcyolo, "submit", tmp_path / "site.yaml", tmp_path / "job.yaml"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "runs" / "loc"
    status = subprocess.run([hpcyolo, "status", run], capture_output=True, text=True).stdout
    assert f"job       {r.stdout.strip()} (via local)" in status and "RUNNING" in status, status
    assert f"hpcyolo submit: job {r.stdout.strip()}, run directory {run}\n" in r.stderr
    again = subprocess.run([hpcyolo, "submit", tmp_path / "site.yaml", tmp_path / "job.yaml"], capture_output=True,
                           text=True)
    assert again.returncode == 1 and "already holds a run" in again.stderr  # never two jobs on one run
    deadline = time.monotonic() + 300
    while "RUNNING" in status and time.monotonic() < deadline:
        time.sleep(1)
        status = subprocess.run([hpcyolo, "status", run], capture_output=True, text=True).stdout
    assert "COMPLETED" in status and "epoch 1 done" in status, status
    log = subprocess.run([hpcyolo, "logs", run], capture_output=True, text=True).stdout
    assert "done: results in" in log


def test_status_where_slurm_cannot_answer_says_so_in_seconds(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "hpcyolo-jobs").write_text('{"job": "999999", "via": "sbatch", "logs": null}\n')
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(tmp_path / "missing.conf")}
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "status", str(run)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    # Without its slurm.conf, scontrol retries for a minute: status stops asking sooner.
    said = "no answer after 15 s" if shutil.which("scontrol", path=env["PATH"]) else "command not found"
    assert "state     unknown: scontrol" in r.stdout and said in r.stdout, r.stdout
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "status", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and "no job recorded here" in r.stderr
