"""`hpcyolo doctor` against the real Slurm testbed: the testbed site passes
every check; each broken setting fails the check that names it, with a fix."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, VENV_BIN, write

from hpcyolo.login.shapes import make_shapes

pytestmark = pytest.mark.slurm
TESTBED = REPO / "site_configs" / "testbed.yaml"


def doctor(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "hpcyolo"), "doctor", *map(str, args)], env=env, capture_output=True,
                          text=True)


def broken_site(tmp_path: Path, section: str, **values) -> Path:
    spec = yaml.safe_load(TESTBED.read_text())
    spec.setdefault(section, {}).update(values)
    return write(tmp_path / "site.yaml", yaml.safe_dump(spec))


def test_testbed_passes_every_check(slurm_env, tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=8, n_val=4, imgsz=64, classes=2, seed=0)
    job = write(tmp_path / "job.yaml", json.dumps({"name": "d", "resources": {"nodes": 2, "time": "00:05:00"},
                                                   "data": {"yaml": str(data), "stage": True}}))
    r = doctor(TESTBED, job, env=slurm_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "all passed" in r.stdout
    for name in ("slurm", "partition", "gpus", "storage.runs", "network.interface", "storage.scratch"):
        assert f"PASS  {name}" in r.stdout, r.stdout


@pytest.mark.parametrize("section, values, check, fix", [
    ("network", {"interface": "ib7"}, "network.interface", "list a compute node's interfaces"),
    ("slurm", {"partition": "gpu-large"}, "partition", "set slurm.partition to one of: debug"),
    ("node", {"gpus": 64}, "gpus", "set node.gpus to 8 or less"),
], ids=["interface", "partition", "gpus"])
def test_a_broken_setting_fails_its_check(slurm_env, tmp_path, section, values, check, fix):
    if section == "node":  # a GPU site asks for GPUs in some style
        site = broken_site(tmp_path, "node", **values)
        spec = yaml.safe_load(site.read_text())
        spec["slurm"]["gpu_request"] = "gres"
        write(site, yaml.safe_dump(spec))
    else:
        site = broken_site(tmp_path, section, **values)
    r = doctor(site, env=slurm_env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"FAIL  {check}" in r.stdout and f"fix: {fix}" in r.stdout, r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_scratch_without_room_fails(slurm_env, tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=4, imgsz=64, classes=2, seed=0)
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(small)], check=True)
    try:
        site = broken_site(tmp_path, "storage", scratch=str(small))
        job = write(tmp_path / "job.yaml", json.dumps({"name": "d", "resources": {"nodes": 1, "time": "00:05:00"},
                                                       "data": {"yaml": str(data), "stage": True}}))
        r = doctor(site, job, env=slurm_env)
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL  storage.scratch" in r.stdout and "fix: choose a larger node-local storage.scratch" in r.stdout


def preflight_job(tmp_path: Path, data: Path) -> Path:
    return write(tmp_path / "pre.yaml", json.dumps({
        "name": "pre", "resources": {"nodes": 2, "tasks_per_node": 2, "time": "00:05:00"},
        "data": {"yaml": str(data), "stage": True}, "train": {"batch": 4}, "preflight": True,
        "run": {"resume": True}, "entrypoint": "true"}))


def test_render_with_preflight_passes_shellcheck(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=4, n_val=2, imgsz=64, classes=2, seed=0)
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "render", str(TESTBED), str(preflight_job(tmp_path, data))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "hpcyolo doctor --in-job --interface lo --scratch \"$SCRATCH_DIR\" --data \"$DATA\"" in r.stdout
    script = write(tmp_path / "pre.sh", r.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    check = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_preflight_prints_the_bus_bandwidth_on_two_nodes(slurm_env, tmp_path):
    from conftest import job_log, submit

    from hpcyolo import slurm

    data = make_shapes(tmp_path / "shapes", n_train=8, n_val=4, imgsz=64, classes=2, seed=0)
    site = broken_site(tmp_path, "storage", runs=str(tmp_path / "runs"), scratch=str(tmp_path / "scratch"))
    job_id = submit(site, preflight_job(tmp_path, data), slurm_env, tmp_path)
    info = slurm.wait(job_id, timeout=300, env=slurm_env)
    log = job_log(tmp_path, "pre", job_id)
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert "preflight rank 0 (node1): PASS  master port" in log and "reached by all 3 other rank(s)" in log
    assert "preflight: all_reduce bus bandwidth" in log and "(gloo, 4 ranks, 64 MiB)" in log
    assert "preflight: gemm 512x512: median" in log and "preflight: all checks passed on every task" in log


def test_preflight_names_an_unreachable_master_port(slurm_env, tmp_path):
    import socket

    from conftest import job_log, submit

    from hpcyolo import slurm

    data = make_shapes(tmp_path / "shapes", n_train=8, n_val=4, imgsz=64, classes=2, seed=0)
    site = broken_site(tmp_path, "storage", runs=str(tmp_path / "runs"), scratch=str(tmp_path / "scratch"))
    blocker = socket.socket()  # holds the port and never accepts: nothing there answers
    blocker.bind(("", 0))
    port = blocker.getsockname()[1]
    try:
        env = {**slurm_env, "HPCYOLO_MASTER_PORT": str(port)}
        job_id = submit(site, preflight_job(tmp_path, data), env, tmp_path)
        info = slurm.wait(job_id, timeout=300, env=slurm_env)
    finally:
        blocker.close()
    log = job_log(tmp_path, "pre", job_id)
    assert info["JobState"] == "FAILED", log[-3000:]
    assert "FAIL  master port" in log and f"rank 0 on node1 cannot listen on port {port}" in log, log[-3000:]
    assert "fix: another process holds it: set HPCYOLO_MASTER_PORT to a free port" in log


def test_signal_self_test_passes_on_the_testbed(slurm_env, tmp_path):
    site = broken_site(tmp_path, "storage", runs=str(tmp_path / "runs"))
    r = doctor("--signal-test", site, env=slurm_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS  signal             SIGUSR2 reached the task through srun" in r.stdout
    assert "PASS  requeue            scontrol requeue worked" in r.stdout
    assert not any((tmp_path / "runs").iterdir())  # nothing left behind after a pass


@pytest.mark.parametrize("cuda", [True, False])
def test_a_slow_gemm_is_named_and_fails_only_on_gpus(cuda):
    from hpcyolo.node.preflight import slow_ranks

    times = [("node1", 0, 0.005), ("node1", 1, 0.006), ("node2", 2, 0.0055), ("node2", 3, 0.0136)]
    line, ok = slow_ranks(times, cuda)
    assert "median 6.0 ms per rank; SLOW rank 3 on node2: 13.6 ms" in line
    assert ok is (not cuda)
    assert ("not counted as a failure" in line) is (not cuda)
    line, ok = slow_ranks(times[:3], cuda)
    assert ok and "SLOW" not in line


def test_the_preemption_path_of_the_live_cluster(slurm_env, tmp_path):
    """The testbed's preemptible partition: preempt/partition_prio in REQUEUE
    mode with a 30 s GraceTime, no preempt_send_user_signal; its default
    partition is never preempted."""
    from testbed.slurm_testbed import GRACE_TIME, PREEMPTIBLE

    spec = yaml.safe_load(TESTBED.read_text())
    spec["storage"]["runs"] = str(tmp_path / "runs")
    spec["slurm"]["partition"] = PREEMPTIBLE
    job = write(tmp_path / "job.yaml", json.dumps({"name": "d", "resources": {"nodes": 1, "time": "00:05:00"},
                                                   "data": {"yaml": str(tmp_path / "none.yaml")},
                                                   "train": {"model": "yolo11s", "optimizer": "sgd"}}))
    write(tmp_path / "none.yaml", "path: .\ntrain: images\nval: images\nnames: {0: a}\n")
    r = doctor(write(tmp_path / "site.yaml", yaml.safe_dump(spec)), job, env=slurm_env)
    line = next((x for x in r.stdout.splitlines() if x[6:].startswith("preemption")), "")
    assert line.startswith("PASS  preemption         "), r.stdout + r.stderr
    assert (f"{PREEMPTIBLE}: PreemptMode REQUEUE (preempt/partition_prio); at preemption SIGTERM only (no "
            f"preempt_send_user_signal in PreemptParameters), SIGKILL {GRACE_TIME} s later (GraceTime)") in line
    assert "yolo11s, 9.5 M parameters x 12 B" in line and f"fsynced in {tmp_path / 'runs'}" in line
    r = doctor(TESTBED, env=slurm_env)
    assert "PASS  preemption         jobs of debug are not preempted" in r.stdout, r.stdout
