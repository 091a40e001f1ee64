"""Hostile values: nothing in a site config or job spec executes in the
rendered script, and no #SBATCH directive can be injected.

The script is run for real by bash, with srun/scontrol/module replaced by
stubs that record their arguments (the Slurm tier runs one on the testbed)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from conftest import write

from hpcyolo.login.config import load_job, load_site
from hpcyolo.login.plan import make_plan
from hpcyolo.login.render import render_sbatch
from hpcyolo_trainer.common.errors import ConfigError

STUB = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["show", "hostnames"]:
    print("node1\\nnode2")
if "begin" in sys.argv and "--run-dir" in sys.argv:  # `hpcyolo job begin` makes the run directory
    os.makedirs(sys.argv[sys.argv.index("--run-dir") + 1], exist_ok=True)
"""


def hostile(marker) -> str:
    """Spaces, both quotes, ;, $(...), backticks, a glob, and a #SBATCH line."""
    return f"a b'c\"d;touch {marker};$(touch {marker})`touch {marker}`*#SBATCH --uid=0"


@pytest.fixture
def hostile_files(tmp_path):
    marker = tmp_path / "PWNED"
    evil = hostile(marker)
    data = write(tmp_path / f"data {evil}" / "data.yaml", "path: .\ntrain: images\nval: images\nnames: [a]\n")
    runs = tmp_path / f"runs {evil}"
    site = write(tmp_path / "site.yaml", json.dumps({
        "name": "evil", "node": {"cpus": 4},
        "slurm": {"gpu_request": "none"},
        "storage": {"runs": str(runs), "scratch": f"{tmp_path}/scratch {evil}"},
        "environment": {"modules": [evil], "venv": f"{tmp_path}/venv {evil}", "env": {"EVIL": evil}},
        "network": {"nccl_env": {"NCCL_EVIL": evil}},
        "container": {"runtime": "apptainer", "image": f"{tmp_path}/img {evil}.sif", "mounts": [evil]},
    }))
    job = write(tmp_path / "job.yaml", json.dumps({
        "name": "evil-job", "resources": {"nodes": 2, "tasks_per_node": 1, "time": "10"},
        "data": {"yaml": str(data), "stage": True}, "train": {"batch": 2},
        "run": {"name": "run1"}, "entrypoint": ["python3", evil, f"--flag={evil}"],
    }))
    return marker, evil, site, job, runs


def run_with_stubs(tmp_path, script: str) -> list[list[str]]:
    bin_dir = tmp_path / "stubs"
    for name in ("srun", "scontrol", "module", "apptainer"):
        write(bin_dir / name, STUB).chmod(0o755)
    log = tmp_path / "stub.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_USER": "me"}
    path = write(tmp_path / "job.sh", script)
    r = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_hostile_values_are_passed_literally_and_never_run(tmp_path, hostile_files):
    marker, evil, site, job, runs = hostile_files
    plan = make_plan(load_site(site), load_job(job), site_file=str(site), job_file=str(job),
                     command=f"hpcyolo render {site} {job}\n#SBATCH --uid=0\ntouch {marker}")
    script = render_sbatch(plan)
    write(tmp_path / f"venv {evil}" / "bin" / "activate", "")  # sourced by the script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)

    # The only directives are the ones hpcyolo wrote, all in the header.
    directives = [line for line in script.splitlines() if line.lstrip().startswith("#SBATCH")]
    assert all(not re.search(r"uid", d) for d in directives)
    assert directives == [line for line in script.splitlines()[:20] if line.startswith("#SBATCH")]
    assert not any(line.startswith("touch") for line in script.splitlines())

    calls = run_with_stubs(tmp_path, script)
    assert not marker.exists()
    assert calls[0] == ["module", "load", evil]
    stage, train = [c for c in calls if c[0] == "srun"][:2]
    stage_dir = f"{tmp_path}/scratch {evil}/hpcyolo-me/run1/data"
    assert stage[stage.index("apptainer"):stage.index("hpcyolo")] == \
        ["apptainer", "exec", "--bind", evil, f"{tmp_path}/img {evil}.sif"]
    assert stage[stage.index("--data") + 1] == str(tmp_path / f"data {evil}" / "data.yaml")
    assert stage[stage.index("--dest") + 1] == stage_dir
    assert train[train.index("--run-dir") + 1] == f"{runs}/run1"
    assert train[train.index("--data") + 1] == f"{stage_dir}/data.yaml"
    assert train[train.index("--") + 1:] == ["python3", evil, f"--flag={evil}"]
    begin = next(c for c in calls if c[0] == "apptainer" and "begin" in c)
    assert begin[begin.index("--run-dir") + 1] == f"{runs}/run1"
    assert (runs / "run1" / "sbatch-4242.sh").is_file()  # the script's copy, in the literal directory


def test_environment_values_arrive_verbatim(tmp_path, hostile_files):
    marker, evil, site, job, _ = hostile_files
    plan = make_plan(load_site(site), load_job(job), site_file=str(site), job_file=str(job))
    script = render_sbatch(plan)
    write(tmp_path / f"venv {evil}" / "bin" / "activate", "")
    # Replace the training step by a dump of the exported variables.
    script = script.replace("set +e\n", 'printf "%s\\0" "$EVIL" "$NCCL_EVIL" > env.out\nset +e\n', 1)
    run_with_stubs(tmp_path, script)
    assert (tmp_path / "env.out").read_text().split("\0")[:2] == [evil, evil]
    assert not marker.exists()


@pytest.mark.parametrize("where, value", [
    ("name", "x\n#SBATCH --uid=0"), ("name", "a;b"), ("name", "#SBATCH"), ("run.name", "../escape"),
])
def test_names_that_could_inject_are_rejected(tmp_path, hostile_files, where, value):
    _, _, site, job, _ = hostile_files
    spec = json.loads(job.read_text())
    if where == "name":
        spec["name"] = value
    else:
        spec["run"]["name"] = value
    write(job, json.dumps(spec))
    with pytest.raises(ConfigError, match=re.escape(f"job.yaml: {where}: ")):
        load_job(job)


@pytest.mark.parametrize("key, value", [
    ("partition", "gpu --uid=0"), ("account", "a'b"), ("extra_sbatch", ["--hint=x y"]),
    ("extra_sbatch", ["--comment=$(id)"]), ("qos", "q\n#SBATCH --uid=0"),
])
def test_directive_values_are_rejected(tmp_path, hostile_files, key, value):
    _, _, site, _, _ = hostile_files
    spec = json.loads(site.read_text())
    spec["slurm"][key] = value
    write(site, json.dumps(spec))
    with pytest.raises(ConfigError, match=re.escape(f"site.yaml: slurm.{key}")):
        load_site(site)


@pytest.mark.parametrize("value, expected_with_home_x", [
    ("/plain/path", "/plain/path"),
    ("$HOME/runs", "/x/runs"),
    ("${HOME}suffix/$HOME", "/xsuffix//x"),
    ("/a b/$HOME/it's \"q\" $(touch PWNED) `id` $", "/a b//x/it's \"q\" $(touch PWNED) `id` $"),
    ("$1/$(x)", "$1/$(x)"),
])
def test_quote_path_expands_only_variables(tmp_path, value, expected_with_home_x):
    from hpcyolo.login.shell import quote_path

    out = subprocess.run(["bash", "-c", f"printf %s {quote_path(value)}"], env={"HOME": "/x", "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out == expected_with_home_x
    assert not (tmp_path / "PWNED").exists()
