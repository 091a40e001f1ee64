"""`hpcyolo site init` on the real Slurm testbed: the site config it writes
(its one choice made) passes validate and doctor, and the demo job trains
through it; its facts against site_configs/testbed.yaml, written by hand."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml
from conftest import REPO, VENV_BIN, job_log, submit, write

from hpcyolo import slurm
from hpcyolo.login.shapes import make_shapes

pytestmark = pytest.mark.slurm
HPCYOLO = str(VENV_BIN / "hpcyolo")


def test_site_init_writes_a_site_that_validates_passes_doctor_and_trains(slurm_env, tmp_path):
    out = tmp_path / "site.yaml"
    r = subprocess.run([HPCYOLO, "site", "init", "--partition", "debug", "-o", str(out)], env=slurm_env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    print(out.read_text())
    print(r.stderr)
    text = out.read_text()
    assert "# from: scontrol show partition debug" in text and "# from: the probe on node" in text
    # The testbed's nodes claim 8 GPUs (Gres, for --test-only of GPU sites) that the probe does not find: said
    # in one line, and a CPU site is written.
    warnings = [line for line in r.stderr.splitlines() if line.startswith("hpcyolo: warning:")]
    assert len(warnings) == 1 and "found no GPU" in warnings[0], r.stderr
    # Until the run storage is chosen, validate refuses it by its key.
    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=8, imgsz=64, classes=2, seed=0)
    spec = yaml.safe_load((REPO / "examples" / "shapes.yaml").read_text())
    spec["data"]["yaml"] = str(data)
    spec["train"].update(epochs=1, batch=8, nbs=8, imgsz=64, close_mosaic=0)  # the demo's settings, one small epoch
    job = write(tmp_path / "shapes.yaml", yaml.safe_dump(spec))
    refused = subprocess.run([HPCYOLO, "validate", str(out), str(job)], env=slurm_env, capture_output=True, text=True)
    assert refused.returncode == 2 and "storage.runs: is a choice hpcyolo site init left to you" in refused.stderr
    site = yaml.safe_load(text)
    site["storage"]["runs"] = str(tmp_path / "runs")
    chosen = write(tmp_path / "chosen.yaml", yaml.safe_dump(site))

    facts = {key: site[section].get(name) for key, (section, name) in {
        "partition": ("slurm", "partition"), "gpu_request": ("slurm", "gpu_request"), "gpus": ("node", "gpus"),
        "interface": ("network", "interface"), "scratch": ("storage", "scratch"),
        "signal": ("preemption", "signal")}.items()}
    by_hand = yaml.safe_load((REPO / "site_configs" / "testbed.yaml").read_text())
    assert facts == {"partition": by_hand["slurm"]["partition"], "gpu_request": by_hand["slurm"]["gpu_request"],
                     "gpus": by_hand["node"]["gpus"], "interface": by_hand["network"]["interface"],
                     "scratch": by_hand["storage"]["scratch"], "signal": by_hand["preemption"]["signal"]}, facts

    ok = subprocess.run([HPCYOLO, "validate", str(chosen), str(job)], env=slurm_env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    doctor = subprocess.run([HPCYOLO, "doctor", str(chosen), str(job)], env=slurm_env, capture_output=True, text=True,
                            timeout=600)
    assert doctor.returncode == 0 and "FAIL" not in doctor.stdout, doctor.stdout + doctor.stderr
    job_id = submit(chosen, job, slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=600, env=slurm_env, poll=0.5)
    log = job_log(tmp_path, spec["name"], job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert (tmp_path / "runs" / spec["name"] / "results.csv").read_text().count("\n") == 2, log[-3000:]


def test_site_init_says_in_one_line_what_the_cluster_did_not_answer(slurm_env, tmp_path):
    def init(*args, env=slurm_env):
        r = subprocess.run([HPCYOLO, "site", "init", *args], env=env, capture_output=True, text=True, timeout=300)
        lines = [line for line in r.stderr.splitlines() if line.startswith("hpcyolo: error:")]
        assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        return lines[0]

    assert "partition 'gpu-large' does not exist (partitions: debug" in init("--partition", "gpu-large", "-o",
                                                                             str(tmp_path / "a.yaml"))
    no_slurm = {**slurm_env, "PATH": f"{VENV_BIN}:/nonexistent"}
    assert "no Slurm here (scontrol: command not found)" in init("-o", str(tmp_path / "b.yaml"), env=no_slurm)
    existing = write(tmp_path / "c.yaml", "kept\n")
    assert "exists: give another -o, or --force" in init("--no-probe", "-o", str(existing))
    assert existing.read_text() == "kept\n"
    # No probe allowed: what the login node can tell, and what stays unchecked said.
    r = subprocess.run([HPCYOLO, "site", "init", "--no-probe", "-o", str(tmp_path / "login.yaml")], env=slurm_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--no-probe: unchecked" in r.stderr, r.stderr
    assert "partition: debug" in (tmp_path / "login.yaml").read_text()
    # Both nodes taken by another job: the probe step gets no node within its wait.
    busy = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--exclusive", f"--output={tmp_path}/busy-%j.out",
                           "--wrap", "sleep 120"], env=slurm_env, cwd=tmp_path, capture_output=True, text=True)
    assert busy.returncode == 0, busy.stderr
    deadline = time.monotonic() + 60
    while slurm.show_job(int(busy.stdout.strip()), env=slurm_env).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, "the busy job did not start"
        time.sleep(0.5)
    line = init("-o", str(tmp_path / "d.yaml"), env={**slurm_env, "HPCYOLO_PROBE_WAIT": "3"})
    assert "the probe step on partition debug" in line and "nothing written" in line, line
    assert not any((tmp_path / name).exists() for name in ("a.yaml", "b.yaml", "d.yaml"))
