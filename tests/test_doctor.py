"""`hpcyolo doctor` without a cluster: Slurm's commands are tiny fakes on
PATH that print recorded answers (the real-cluster checks are in
test_slurm_doctor.py)."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
import yaml
from conftest import VENV_BIN, write

from hpcyolo.login import doctor
from hpcyolo.login.config import load_site

GPU_SITE = {
    "name": "gpusite",
    "slurm": {"partition": "gpu", "account": "proj1", "gpu_request": "gres", "max_time": "2-00:00:00"},
    "node": {"gpus": 4, "cpus": 64},
    "network": {"interface": "ib0"},
    "storage": {"runs": "/tmp/hpcyolo-doctor-test-runs"},
}


def site_of(tmp_path, **sections):
    spec = {**GPU_SITE, **{k: {**GPU_SITE.get(k, {}), **v} for k, v in sections.items()}}
    return load_site(write(tmp_path / "site.yaml", yaml.safe_dump(spec)))


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A folder first on PATH; fake(name, script) puts an executable there."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    def fake(name: str, body: str):
        path = write(folder / name, "#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path

    return fake


def test_the_interface_is_looked_up_on_a_compute_node(tmp_path, fake_bin):
    fake_bin("srun", f'echo "$@" > {tmp_path}/srun-args\nprintf "host gpu017\\nif lo loopback unknown '
                     f'127.0.0.1/8\\nif ib0 infiniband up 10.1.0.17/16\\nif hsn0 ether up 10.2.0.17/16\\n"\n')
    check = doctor.check_interface(site_of(tmp_path))
    assert (check.status, check.detail) == ("PASS", "ib0 exists on compute node gpu017")
    args = (tmp_path / "srun-args").read_text().split()
    for arg in ("--nodes=1", "--ntasks=1", "--partition=gpu", "--account=proj1", "--gres=gpu:1"):
        assert arg in args
    assert f"--immediate={doctor.PROBE_WAIT_S}" in args  # never queues for long

    check = doctor.check_interface(site_of(tmp_path, network={"interface": "ib0,ib1"}))
    assert check.status == "FAIL"
    assert check.detail == "ib1 does not exist on compute node gpu017 (interfaces: lo, ib0, hsn0)"
    assert check.fix.startswith("list a compute node's interfaces (srun -N1 ip -brief addr)")


def test_without_a_compute_node_the_interface_check_says_it_looked_here_only(tmp_path, fake_bin):
    fake_bin("srun", 'echo "srun: error: Unable to allocate resources: Invalid account" >&2\nexit 1\n')
    check = doctor.check_interface(site_of(tmp_path, network={"interface": "lo"}))
    assert check.status == "PASS"
    assert check.detail == (f"lo exists on {socket.gethostname()} (checked on this node only: srun could not run a "
                            "task on a compute node (srun: error: Unable to allocate resources: Invalid account))")
    check = doctor.check_interface(site_of(tmp_path, network={"interface": "ib7"}), use_srun=False)
    assert check.status == "FAIL" and "(checked on this node only: no Slurm answers here)" in check.detail


def test_logs_folder_must_exist_and_be_writable(tmp_path):
    assert doctor.check_logs(site_of(tmp_path)).status == "SKIP"
    logs = tmp_path / "logs"
    check = doctor.check_logs(site_of(tmp_path, storage={"logs": str(logs)}))
    assert check.status == "FAIL" and check.detail.startswith(f"{logs} does not exist: Slurm opens")
    assert check.fix == f"create it (mkdir -p {logs}) or set storage.logs to an existing shared folder"
    logs.mkdir()
    assert doctor.check_logs(site_of(tmp_path, storage={"logs": str(logs)})).status == "PASS"
    if os.geteuid() != 0:  # root writes anywhere
        logs.chmod(0o500)
        try:
            check = doctor.check_logs(site_of(tmp_path, storage={"logs": str(logs)}))
        finally:
            logs.chmod(0o700)
        assert check.status == "FAIL" and check.detail == f"cannot write in {logs}: Permission denied"


def test_venv_must_exist_and_hold_hpcyolo(tmp_path):
    venv = tmp_path / "venv"
    check = doctor.check_venv(site_of(tmp_path, environment={"venv": str(venv)}))
    assert check.status == "FAIL" and check.detail == (f"{venv} does not exist; the script sources "
                                                       f"{venv}/bin/activate")
    assert check.fix.startswith(f"create it (python3 -m venv {venv} && {venv}/bin/pip install /path/to/hpcyolo)")
    write(venv / "bin" / "activate", "")
    check = doctor.check_venv(site_of(tmp_path, environment={"venv": str(venv)}))
    assert check.status == "FAIL" and check.detail == (f"{venv} holds no hpcyolo ({venv}/bin/hpcyolo), which "
                                                       "every step runs")
    # In a container the image's hpcyolo runs: the venv need only exist.
    in_container = site_of(tmp_path, environment={"venv": str(venv)},
                           container={"runtime": "apptainer", "image": "docker://x/y"})
    assert doctor.check_venv(in_container).status == "PASS"
    write(venv / "bin" / "hpcyolo", "").chmod(0o755)
    assert doctor.check_venv(site_of(tmp_path, environment={"venv": str(venv)})).status == "PASS"


@pytest.mark.parametrize("runtime, image, status", [
    ("apptainer", "{tmp}/hpcyolo.sif", "FAIL"),
    ("apptainer", "docker://ghcr.io/x/hpcyolo:1", "SKIP"),
    ("pyxis", "{tmp}/hpcyolo.sqsh", "FAIL"),
    ("pyxis", "nvcr.io#nvidia/pytorch:24.05-py3", "SKIP"),
])
def test_container_image_file_must_exist(tmp_path, runtime, image, status):
    image = image.format(tmp=tmp_path)
    site = site_of(tmp_path, container={"runtime": runtime, "image": image})
    check = doctor.check_container_image(site)
    assert check.status == status, check
    if status == "FAIL":
        assert check.detail == f"{image} does not exist ({runtime} would fail on every step)"
        write(tmp_path / image, "")
        assert doctor.check_container_image(site).status == "PASS"


def test_module_command_must_exist_where_the_site_loads_modules(tmp_path, monkeypatch):
    site = site_of(tmp_path, environment={"module_purge": True, "modules": ["cuda/12.4"]})
    monkeypatch.setattr(doctor, "MODULE_PROBE", ("sh", "-c", "exit 1"))
    check = doctor.check_modules(site)
    assert check.status == "FAIL" and check.detail.startswith("no `module` command here, but "
                                                              "environment.module_purge, environment.modules use it")
    assert "set module_purge: false" in check.fix
    monkeypatch.setattr(doctor, "MODULE_PROBE", ("sh", "-c", "echo function"))
    assert doctor.check_modules(site).status == "PASS"


def test_doctor_reports_what_would_kill_a_job_silently(tmp_path, fake_bin):
    fake_bin("scontrol", 'echo "slurm 23.11.4"\n')
    fake_bin("sinfo", 'echo "gpu*|2-00:00:00|4|64|480000|gpu:4(S:0-1)"\n')
    fake_bin("sacctmgr", 'echo "proj1|normal"\n')
    fake_bin("srun", 'printf "host gpu001\\nif lo loopback unknown 127.0.0.1/8\\nif ib0 infiniband up 10.1.0.1/16\\n"\n')
    spec = {**GPU_SITE, "storage": {"runs": str(tmp_path / "runs"), "logs": str(tmp_path / "logs")},
            "environment": {"venv": str(tmp_path / "venv")},
            "container": {"runtime": "apptainer", "image": str(tmp_path / "hpcyolo.sif")}}
    site = write(tmp_path / "site.yaml", yaml.safe_dump(spec))
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "doctor", str(site)], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    for line in ("PASS  network.interface  ib0 exists on compute node gpu001",
                 f"FAIL  storage.logs       {tmp_path / 'logs'} does not exist",
                 f"FAIL  environment.venv   {tmp_path / 'venv'} does not exist",
                 f"FAIL  container.image    {tmp_path / 'hpcyolo.sif'} does not exist"):
        assert line in r.stdout, r.stdout
    assert "3 failed" in r.stdout


def test_a_partition_without_a_time_limit(tmp_path, fake_bin):
    fake_bin("sinfo", 'echo "long*|infinite|2|64|480000|gpu:4"\n')
    checks = doctor.check_partition(site_of(tmp_path, slurm={"partition": "long", "max_time": "INFINITE"}), None)
    assert [c.status for c in checks] == ["PASS", "PASS"], checks
    fake_bin("sinfo", 'echo "long*|7-00:00:00|2|64|480000|gpu:4"\n')
    checks = doctor.check_partition(site_of(tmp_path, slurm={"partition": "long", "max_time": "INFINITE"}), None)
    assert checks[1].status == "FAIL" and checks[1].fix == "lower slurm.max_time to at most 7-00:00:00"
