"""Uneven layouts (resources.gpus / resources.tasks): a total of processes
that Slurm spreads over the nodes, as many on each as it finds free. What
the plan asks of Slurm, every refusal as one line, what validate and doctor
say, and the rank layer's view of such a step. The jobs themselves run on
the testbed: tests/test_slurm_train.py, test_j and test_k."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO, VENV_BIN, write
from test_config import CPU_SITE, GPU_SITE, JOB, error_of, plan_of

from hpcyolo.login.doctor import check_gpu_binding, check_layout
from hpcyolo.login.render import render_sbatch as render
from hpcyolo.login.submit import submitit_parameters
from hpcyolo.node import distenv
from hpcyolo_trainer.common.devices import device_for

UNEVEN = JOB.replace("nodes: 2,", "nodes: 3, gpus: 10,").replace("batch: 64", "batch: 60")


def test_a_total_of_gpus_asks_a_task_per_gpu_over_the_nodes(tmp_path):
    plan = plan_of(tmp_path, job=UNEVEN)
    assert plan.uneven and (plan.world_size, plan.procs_per_node, plan.batch_per_rank) == (10, None, 6)
    assert ("nodes", 3) in plan.sbatch and ("ntasks", 10) in plan.sbatch and ("gpus_per_task", 1) in plan.sbatch
    assert ("cpus_per_task", 12) in plan.sbatch  # a GPU's share of 48 CPUs
    assert not any(name in ("ntasks_per_node", "gres", "gpus_per_node") for name, _ in plan.sbatch)
    script = render(plan)
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks=10\n#SBATCH --cpus-per-task=12\n#SBATCH --gpus-per-task=1\n" in script
    assert 'srun --kill-on-bad-exit=1 --nodes="$SLURM_JOB_NUM_NODES" --ntasks=10 --cpus-per-task=12 ' \
           '--gpus-per-task=1 \\' in script
    assert "10 process(es) over 3 node(s), as many on each as Slurm finds free GPUs = world size 10" in script


def test_a_node_range_and_staging_on_every_node_slurm_gave(tmp_path):
    job = UNEVEN.replace("gpus: 10,", "gpus: 10, max_nodes: 5,").replace("data: {", "data: {stage: true, ")
    plan = plan_of(tmp_path, job=job)
    assert ("nodes", "3-5") in plan.sbatch and plan.node_count == "3-5"
    script = render(plan)
    assert "#SBATCH --nodes=3-5\n" in script
    assert 'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 ' \
           '--cpus-per-task=12 \\\n    hpcyolo stage' in script


def test_cpu_sites_spread_tasks(tmp_path):
    job = JOB.replace("nodes: 2,", "nodes: 2, tasks: 3,").replace("batch: 64", "batch: 63")
    plan = plan_of(tmp_path, site=CPU_SITE, job=job)
    assert (plan.world_size, plan.gpus_per_node, plan.cpus_per_task) == (3, 0, 24)  # 48 CPUs over 2 tasks at most
    assert ("ntasks", 3) in plan.sbatch and not any(n.startswith("gpus") for n, _ in plan.sbatch)
    assert "room for" in plan.layout


@pytest.mark.parametrize("site, resources, key, message", [
    (GPU_SITE, "gpus: 10, gpus_per_node: 4", "resources.gpus", "not both"),
    (GPU_SITE, "tasks: 3", "resources.tasks", "is for CPU sites"),
    (CPU_SITE, "gpus: 3", "resources.gpus", "has no GPUs; on a CPU site use resources.tasks"),
    (CPU_SITE, "tasks: 3, tasks_per_node: 2", "resources.tasks", "not both"),
    (GPU_SITE, "gpus: 2", "resources.gpus", "2 process(es) cannot cover 3 nodes"),
    (GPU_SITE, "gpus: 13", "resources.gpus", "13 GPUs do not fit on 3 node(s)"),
    (GPU_SITE, "gpus: 10, max_nodes: 2", "resources.max_nodes", "2 is below resources.nodes (3)"),
    (GPU_SITE, "max_nodes: 4", "resources.max_nodes", "only goes with resources.gpus or resources.tasks"),
    (GPU_SITE, "gpus: 10, launcher: torchrun", "resources.gpus", "needs resources.launcher: srun"),
    (GPU_SITE, "gpus: 10, cpus_per_task: 64", "resources.cpus_per_task", "64 is more than"),
])
def test_refusals_name_the_key(tmp_path, site, resources, key, message):
    job = JOB.replace("nodes: 2,", f"nodes: 3, {resources},").replace("batch: 64", "batch: 60")
    msg = error_of(tmp_path, site=site, job=job)
    assert f"job.yaml: {key}: " in msg and message in msg, msg


def test_a_batch_no_world_size_divides_is_one_line(tmp_path):
    msg = error_of(tmp_path, job=UNEVEN.replace("batch: 60", "batch: 64"))
    assert msg.endswith("job.yaml: train.batch: must be a multiple of the world size (10), got 64")


def test_validate_explains_the_layout(tmp_path):
    site, job = write(tmp_path / "site.yaml", GPU_SITE), write(tmp_path / "job.yaml", UNEVEN)
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "validate", str(site), str(job)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: 10 process(es) over 3 node(s), as many on each as Slurm finds free GPUs = "
                               "world size 10, 6 images per rank")


def test_doctor_explains_the_layout_and_the_slurm_it_needs(tmp_path):
    plan = plan_of(tmp_path, job=UNEVEN)
    check = check_layout(plan, (22, 5))
    assert check.status == "PASS" and "(--nodes=3 --ntasks=10 --gpus-per-task=1)" in check.detail
    assert "SLURM_STEP_TASKS_PER_NODE" in check.detail
    old = check_layout(plan, (18, 8))
    assert old.status == "FAIL" and "does not know --gpus-per-task" in old.detail
    even = check_layout(plan_of(tmp_path), (18, 8))
    assert even.status == "PASS" and even.detail.startswith("2 node(s) x 4 process(es) = world size 8")


def test_doctor_warns_where_a_gpu_per_task_hides_the_nodes_other_gpus_from_nccl(tmp_path):
    uneven = check_gpu_binding(plan_of(tmp_path, job=UNEVEN))
    assert uneven.status == "WARN" and "--gpus-per-task=1" in uneven.detail and "nccl#1066" in uneven.detail
    assert "even layout" in uneven.fix
    per_task = plan_of(tmp_path, site=GPU_SITE.replace("gpu_request: gres", "gpu_request: gpus-per-task"))
    assert ("gpus_per_task", 1) in per_task.sbatch and per_task.procs_per_node == 4
    check = check_gpu_binding(per_task)
    assert check.status == "WARN" and "gres or gpus-per-node" in check.fix
    assert check_gpu_binding(plan_of(tmp_path)) is None  # --gres: the node's GPUs, every task sees them
    one = plan_of(tmp_path, site=GPU_SITE.replace("gpu_request: gres", "gpu_request: gpus-per-task")
                  .replace("gpus: 4", "gpus: 1"))
    assert one.procs_per_node == 1 and check_gpu_binding(one) is None  # one task a node: no peer to hide


def test_submitit_refuses_an_uneven_layout_in_one_line(tmp_path):
    site = write(tmp_path / "site.yaml", GPU_SITE.replace("/scratch/runs", str(tmp_path / "runs")))
    job = write(tmp_path / "job.yaml", UNEVEN)
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", "--dry-run", str(site), str(job)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "an uneven layout is submitted with --via sbatch" in r.stderr, r.stderr


def test_the_rank_layer_reads_each_nodes_count_from_slurm():
    """A step of 10 tasks that Slurm placed 2, 4 and 4 (what srun sets in
    each task): every task gets its rank, local rank and local world size."""
    seen = []
    for rank, (node, local, per_node) in enumerate([(0, 0, 2), (0, 1, 2)] + [(n, i, 4) for n in (1, 2)
                                                                            for i in range(4)]):
        env = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
               "SLURM_STEP_NUM_TASKS": "10", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_TASKS_PER_NODE": "2,4(x2)",
               "SLURM_STEP_NODELIST": "gpu[07,11-12]", "SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": str(local)}
        d = distenv.from_environ(env, sagemaker_config="/nonexistent")
        seen.append((d.rank, d.local_rank, d.local_world_size, d.node_rank, d.world_size, d.master_addr))
        assert device_for(d.local_rank, env, gpus=1) == "cuda:0"  # one GPU per task
    assert [s[2] for s in seen] == [2, 2, 4, 4, 4, 4, 4, 4, 4, 4]
    assert {s[4] for s in seen} == {10} and {s[5] for s in seen} == {"gpu07"}
    assert [s[:2] for s in seen[2:6]] == [(2, 0), (3, 1), (4, 2), (5, 3)]


def test_spare_nodes_are_allocated_staged_and_left_idle_by_the_training_step(tmp_path):
    spare = JOB.replace("nodes: 2,", "nodes: 2, spare_nodes: 1,")
    plan = plan_of(tmp_path, job=spare)
    assert ("nodes", 3) in plan.sbatch and plan.world_size == 8 and "1 spare node(s)" in plan.layout
    assert "--nodes=3" in plan.stage_srun and "--ntasks=3" in plan.stage_srun  # the spare gets the data too
    assert {"--nodes=2", "--ntasks=8"} <= set(map(str, plan.train_srun)) and plan.restarts_in_place
    assert "--in-place" in list(map(str, plan.end_argv))
    script = render(plan)
    assert '"${in_place[@]}"' in script and 'in_place=(--nodes="$nodes_left"' in script
    assert "spare_nodes" in error_of(tmp_path, job=UNEVEN.replace("nodes: 3,", "nodes: 3, spare_nodes: 1,"))
    assert "the torchrun launcher" in error_of(tmp_path, job=spare.replace("nodes: 2,", "nodes: 2, launcher: "
                                                                                      "torchrun,"))
    assert ("no_kill", True) in plan.sbatch and "#SBATCH --no-kill\n" in script  # a node Slurm fails: not the job
    one = plan_of(tmp_path)  # one node, nothing to spare: no in-place restart
    single = plan_of(tmp_path, job=JOB.replace("nodes: 2,", "nodes: 1,"))
    assert single.restarts_in_place is False and "no_kill" not in dict(single.sbatch)
    assert one.restarts_in_place and ("nodes", 2) in one.sbatch
    assert submitit_parameters(one)["additional_parameters"]["no_kill"] is True  # submitit's job runs the script


def test_submitit_asks_for_spare_nodes_as_the_script_does_and_the_local_site_refuses_them(tmp_path):
    site = write(tmp_path / "site.yaml", GPU_SITE.replace("/scratch/runs", str(tmp_path / "runs")))
    job = write(tmp_path / "job.yaml", JOB.replace("nodes: 2,", "nodes: 2, spare_nodes: 1,"))
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", "--dry-run", str(site), str(job)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=3\n" in r.stdout and "#SBATCH --no-kill\n" in r.stdout, r.stdout
    local = subprocess.run([str(VENV_BIN / "hpcyolo"), "submit", "--dry-run", str(REPO / "site_configs" / "local.yaml"),
                            str(job)], capture_output=True, text=True)
    assert local.returncode != 0 and "Traceback" not in local.stderr
    assert local.stderr.strip().endswith("resources.spare_nodes: the local site has no nodes to spare"), local.stderr
