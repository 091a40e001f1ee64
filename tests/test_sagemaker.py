"""A two-host SageMaker training job, started as SageMaker starts it, on this machine.

SageMaker runs the entry point once per host (algo-1, algo-2), each host
seeing its own resource config and its own host name, the names resolving
through DNS. Here each host is a process tree in its own UTS and mount
namespace (`unshare`): its own host name, and a private /etc/hosts bind-mounted
over the real one mapping algo-1/algo-2 to 127.0.0.21/22. The network stays
the machine's (loopback only). Each host process starts HPCYOLO_NPROC=2
trainers; the four ranks train to completion and rank 0's log says where
each rank ran.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcyolo.node.local import free_port

pytest.importorskip("torch")
HOSTS = {"algo-1": "127.0.0.21", "algo-2": "127.0.0.22"}


def _namespaces_work() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True)
    return r.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="needs root and unshare --uts --mount")


def host_command(name: str, hosts_file: Path, argv: list[str]) -> list[str]:
    """argv run as host `name`: its host name, and /etc/hosts from hosts_file."""
    script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
    return ["unshare", "--uts", "--mount", "sh", "-c", script, "sh", name, str(hosts_file), *argv]


def test_two_hosts_train_to_completion(tmp_path):
    data = tmp_path / "shapes"
    subprocess.run([sys.executable, "-m", "hpcyolo.cli", "make-dataset", "shapes", str(data), "--train", "8",
                    "--val", "4", "--imgsz", "64"], check=True, capture_output=True)
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in HOSTS.items()))
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "hpcyolo.cli", "train", "--run-dir", str(run), "--data", str(data / "data.yaml"),
            "--imgsz", "64", "--epochs", "1", "--batch", "4", "--workers", "0", "--warmup-epochs", "0",
            "--close-mosaic", "0", "--dist-timeout", "120"]
    # What SageMaker sets (a CPU instance: no GPUs), plus the processes per host
    # and a free port instead of the one derived from the job name.
    env = {**os.environ, "TRAINING_JOB_NAME": "hpcyolo-e2e", "SM_NUM_GPUS": "0", "HPCYOLO_NPROC": "2",
           "HPCYOLO_MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = {}
    for name in HOSTS:
        config = tmp_path / name / "resourceconfig.json"
        config.parent.mkdir()
        config.write_text(json.dumps({"current_host": name, "hosts": list(HOSTS), "network_interface_name": "lo"}))
        procs[name] = subprocess.Popen(host_command(name, hosts_file, argv), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True,
                                       env={**env, "HPCYOLO_SM_RESOURCE_CONFIG": str(config)})
    logs = {}
    try:
        for name, p in procs.items():
            logs[name] = p.communicate(timeout=300)[0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    for name, p in procs.items():
        assert p.returncode == 0, f"{name}:\n{logs[name][-3000:]}"
    ranks = sorted(re.findall(r"^rank (\d+): local rank (\d+) of (\d+) on host (\S+), world size (\d+), device cpu$",
                              logs["algo-1"], re.M))
    assert ranks == [("0", "0", "2", "algo-1", "4"), ("1", "1", "2", "algo-1", "4"), ("2", "0", "2", "algo-2", "4"),
                     ("3", "1", "2", "algo-2", "4")], logs["algo-1"][-3000:]
    assert (run / "weights" / "last.pt").is_file() and len((run / "results.csv").read_text().splitlines()) == 2
