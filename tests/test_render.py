"""The rendered script: valid bash, clean under shellcheck, and saying what
each launcher and GPU style needs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess

import pytest
from conftest import COCO8, REPO, write

from hpcyolo.login.config import load_job, load_site
from hpcyolo.login.plan import make_plan
from hpcyolo.login.render import render_sbatch
from hpcyolo.node.distenv import default_port

SITES = sorted((REPO / "site_configs").glob("*.yaml"))
VARIANTS = {
    "train": {},
    "torchrun": {"resources": {"nodes": 2, "launcher": "torchrun"}},
    "entrypoint": {"entrypoint": "python3 my train.py --epochs '3 4'"},
    "resume-nostage": {"run": {"resume": True}, "data": {"yaml": str(COCO8), "stage": False}},
}


def job_file(tmp_path, **overrides):
    spec = {"name": "t", "resources": {"nodes": 2}, "data": {"yaml": str(COCO8), "stage": True},
            "train": {"batch": 64, "imgsz": 320}, **overrides}
    return write(tmp_path / "job.yaml", json.dumps(spec))


def render(site_path, job_path, **site_changes):
    site = load_site(site_path)
    for section, values in site_changes.items():
        site = dataclasses.replace(site, **{section: dataclasses.replace(getattr(site, section), **values)})
    return render_sbatch(make_plan(site, load_job(job_path), site_file=str(site_path), job_file=str(job_path)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("site_path", SITES, ids=[p.stem for p in SITES])
def test_bash_n_and_shellcheck_are_clean(tmp_path, site_path, variant):
    script = write(tmp_path / "job.sh", render(site_path, job_file(tmp_path, **VARIANTS[variant])))
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert shutil.which("shellcheck"), "shellcheck is part of the test setup (scripts/setup.sh)"
    r = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def sbatch_lines(script: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_gres_site(tmp_path):
    script = render(REPO / "site_configs" / "testbed.yaml", job_file(tmp_path),
                    node={"gpus": 4, "cpus": 48, "memory": "480G"}, slurm={"gpu_request": "gres"},
                    network={"interface": "ib0", "infiniband": True, "ib_hca": ("mlx5_0", "mlx5_1")})
    lines = sbatch_lines(script)
    for expected in ("--nodes=2", "--ntasks-per-node=4", "--cpus-per-task=12", "--gres=gpu:4", "--mem=480G",
                     "--requeue", "--open-mode=append", "--signal=USR2@30", "--output=%x-%j.out"):
        assert expected in lines
    for line in ("export NCCL_SOCKET_IFNAME=ib0", "export GLOO_SOCKET_IFNAME=ib0", "export NCCL_IB_HCA=mlx5_0,mlx5_1",
                 "export OMP_NUM_THREADS=12", "srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=4 --cpus-per-task=12 \"${in_place[@]}\" \\"):
        assert line in script.splitlines()
    assert "NCCL_IB_DISABLE" not in script


def test_gpus_per_task_site(tmp_path):
    script = render(REPO / "site_configs" / "testbed.yaml", job_file(tmp_path),
                    node={"gpus": 4, "cpus": 64}, slurm={"gpu_request": "gpus-per-task"})
    assert "--gpus-per-task=1" in sbatch_lines(script)
    assert "--ntasks-per-node=4 --cpus-per-task=16 --gpus-per-task=1 \"${in_place[@]}\" \\" in script
    assert "export NCCL_IB_DISABLE=1" in script  # infiniband: false on a GPU site


def test_torchrun_launcher(tmp_path):
    job = job_file(tmp_path, resources={"nodes": 2, "launcher": "torchrun"})
    script = render(REPO / "site_configs" / "testbed.yaml", job, node={"gpus": 4, "cpus": 48},
                    slurm={"gpu_request": "gpus-per-node"})
    lines = sbatch_lines(script)
    assert {"--ntasks-per-node=1", "--cpus-per-task=48", "--gpus-per-node=4", "--signal=TERM@30"} <= set(lines)
    assert "export OMP_NUM_THREADS=12" in script
    assert ('torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" '
            '--rdzv-id="$SLURM_JOB_ID" --no-python hpcyolo train') in script.replace(" \\\n    ", " ")


def test_requeue_block_uses_site_limits(tmp_path):
    script = render(REPO / "site_configs" / "testbed.yaml", job_file(tmp_path), preemption={"max_requeues": 5})
    assert 'hpcyolo job end --status "$status" --marker "$HPCYOLO_PREEMPT_MARKER" --max-requeues 5' in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script


def test_master_port_in_script_matches_python(tmp_path):
    script = render(REPO / "site_configs" / "testbed.yaml", job_file(tmp_path))
    lines = "\n".join(x for x in script.splitlines() if x.startswith(("port_key=", "MASTER_PORT=")))

    def port(env: str) -> int:
        return int(subprocess.run(["bash", "-c", f"{env}\n{lines}\necho $MASTER_PORT"],
                                  capture_output=True, text=True, check=True).stdout)

    for job_id in (1, 14999, 15000, 987654321):
        assert port(f"SLURM_JOB_ID={job_id}") == default_port(job_id)
    # Array tasks: from each task's own job id. `sbatch --array=1` (job N, task 1)
    # and the plain job N+1 after it used to get one port (N + 1 both).
    array = [port(f"SLURM_JOB_ID={100 + t}; SLURM_ARRAY_JOB_ID=100; SLURM_ARRAY_TASK_ID={t + 1}") for t in range(50)]
    plain = port("SLURM_JOB_ID=150")
    assert array == [default_port(100 + t) for t in range(50)] and len(set(array + [plain])) == 51
    assert port("HPCYOLO_MASTER_PORT=23456; SLURM_JOB_ID=7") == 23456
