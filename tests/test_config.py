"""Site/job loading and validation: every mistake is one line naming the file
and the dotted key, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import COCO8, REPO, write

from hpcyolo.login.config import load_job, load_site
from hpcyolo.login.plan import make_plan
from hpcyolo.slurm import format_time, parse_time
from hpcyolo_trainer.common.errors import ConfigError

GPU_SITE = """\
name: gpusite
slurm: {partition: gpu, max_time: "2-00:00:00", gpu_request: gres}
node: {gpus: 4, cpus: 48}
storage: {runs: /scratch/runs}
"""
JOB = f"""\
name: j
resources: {{nodes: 2, time: "04:00:00"}}
data: {{yaml: {COCO8}}}
train: {{batch: 64}}
"""


def plan_of(tmp_path, site=GPU_SITE, job=JOB):
    s, j = write(tmp_path / "site.yaml", site), write(tmp_path / "job.yaml", job)
    return make_plan(load_site(s), load_job(j), site_file=str(s), job_file=str(j))


def error_of(tmp_path, site=GPU_SITE, job=JOB) -> str:
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, site, job)
    return str(e.value)


def test_good_files_make_a_plan(tmp_path):
    plan = plan_of(tmp_path)
    assert (plan.world_size, plan.procs_per_node, plan.cpus_per_task, plan.omp_threads) == (8, 4, 12, 12)
    assert ("gres", "gpu:4") in plan.sbatch and ("time", "04:00:00") in plan.sbatch


def test_unknown_key_suggests_the_close_one(tmp_path):
    msg = error_of(tmp_path, job=JOB.replace("train: {batch: 64}", "train: {bacth: 64}"))
    assert msg.endswith("job.yaml: train.bacth: unknown key; did you mean 'batch'?")


def test_a_key_one_level_too_high_names_its_section(tmp_path):
    msg = error_of(tmp_path, job=JOB + "model: s\n")
    assert msg.endswith("job.yaml: model: unknown key; did you mean 'train.model'?")


@pytest.mark.parametrize("which, line, meant", [
    ("site", "partition: gpu", "slurm.partition"),  # not the look-alike 'preemption' at the top
    ("site", "account: proj", "slurm.account"),
    ("job", "gpus: 2", "resources.gpus"),
    ("job", "epochs: 3", "train.epochs"),
])
def test_a_key_at_the_wrong_level_suggests_its_section_before_a_look_alike(tmp_path, which, line, meant):
    msg = error_of(tmp_path, **{which: (GPU_SITE if which == "site" else JOB) + line + "\n"})
    assert msg.endswith(f"{which}.yaml: {line.split(':')[0]}: unknown key; did you mean '{meant}'?"), msg


@pytest.mark.parametrize("site_edit, key, words", [
    (("gpus: 4", "gpus: four"), "node.gpus", "must be an integer"),
    (("gpu_request: gres", "gpu_request: gpus"), "slurm.gpu_request", "must be one of"),
    (("partition: gpu", "partition: 'gpu; rm -rf /'"), "slurm.partition", "characters Slurm does not take"),
    (("runs: /scratch/runs", "runs: ~/runs"), "storage.runs", "absolute path"),
    (("max_time: \"2-00:00:00\"", "max_time: two days"), "slurm.max_time", "not a Slurm time"),
    (("gpu_request: gres", "gpu_request: none"), "slurm.gpu_request", "is none, but node.gpus is 4"),
    (("storage: {runs: /scratch/runs}", "storage: {}"), "storage.runs", "required key is missing"),
])
def test_site_errors_name_file_and_key(tmp_path, site_edit, key, words):
    msg = error_of(tmp_path, site=GPU_SITE.replace(*site_edit))
    assert f"site.yaml: {key}: " in msg and words in msg


@pytest.mark.parametrize("job_edit, key, words", [
    (("nodes: 2", "nodes: 0"), "resources.nodes", "at least 1"),
    (("batch: 64", "batch: 60"), "train.batch", "multiple of the world size (8)"),
    (("time: \"04:00:00\"", "time: \"3-00:00:00\""), "resources.time", "longer than site"),
    (("nodes: 2,", "nodes: 2, gpus_per_node: 8,"), "resources.gpus_per_node", "nodes have 4"),
    (("nodes: 2,", "nodes: 2, tasks_per_node: 2,"), "resources.tasks_per_node", "for CPU sites"),
    (("name: j", "name: 'x\n#SBATCH --uid=0'"), "name", "not a valid name"),
    (("train: {batch: 64}", "train: {batch: 64, imgsz: 100}"), "train.imgsz", "multiple of 32 (the models' largest "
                                                                              "stride), got 100: use 96 or 128"),
    (("train: {batch: 64}", "train: {batch: 64, imgsz: 16}"), "train.imgsz", "must be at least 32 (got 16)"),
    (("train: {batch: 64}", "train: {batch: 64, imgsz: 16384}"), "train.imgsz", "must be at most 8192"),
])
def test_job_errors_name_file_and_key(tmp_path, job_edit, key, words):
    msg = error_of(tmp_path, job=JOB.replace(*job_edit))
    assert f"job.yaml: {key}: " in msg and words in msg


def test_gpus_asked_of_a_cpu_site(tmp_path):
    cpu_site = GPU_SITE.replace("gpu_request: gres", "gpu_request: none").replace("gpus: 4", "gpus: 0")
    msg = error_of(tmp_path, site=cpu_site, job=JOB.replace("nodes: 2,", "nodes: 2, gpus_per_node: 1,"))
    assert "job.yaml: resources.gpus_per_node: asks for 1 GPUs, but site 'gpusite' has none" in msg


def test_missing_data_yaml(tmp_path):
    msg = error_of(tmp_path, job=JOB.replace(str(COCO8), "nowhere/data.yaml"))
    assert "job.yaml: data.yaml: file not found: " in msg and str(tmp_path / "nowhere" / "data.yaml") in msg


def test_newline_in_a_value_is_rejected(tmp_path):
    msg = error_of(tmp_path, job=JOB.replace(str(COCO8), '"/data/x\\n#SBATCH --uid=0"'))
    assert "job.yaml: data.yaml: must not contain control characters" in msg


def test_yaml_problems(tmp_path):
    assert "duplicate key" in error_of(tmp_path, job=JOB + "name: again\n")
    assert "not valid YAML: line 2, column 1" in error_of(tmp_path, job="name: [unclosed\n")
    assert error_of(tmp_path, job="- a list\n").endswith("job.yaml: (top level): must be a mapping, got a list")


def test_times_stay_strings_and_parse_like_slurm(tmp_path):
    # YAML 1.1 would read an unquoted 04:00:00 as the base-60 integer 14400.
    plan = plan_of(tmp_path, job=JOB.replace('time: "04:00:00"', "time: 04:00:00"))
    assert plan.time == "04:00:00"
    assert [parse_time(t) for t in ("90", "1:30", "2:00:00", "1-0", "1-2:3", "1-02:03:04")] == \
        [5400, 90, 7200, 86400, 93780, 93784]
    assert format_time(93784) == "1-02:03:04"


def cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "hpcyolo.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)


def test_cli_validate_typo_exits_2_with_one_line(tmp_path):
    s = write(tmp_path / "site.yaml", GPU_SITE)
    j = write(tmp_path / "job.yaml", JOB.replace("train: {batch: 64}", "train: {epocs: 3}"))
    r = cli("validate", s, j)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"hpcyolo: error: {j}: train.epocs: unknown key; did you mean 'epochs'?"]


def test_cli_validate_ok(tmp_path):
    s, j = write(tmp_path / "site.yaml", GPU_SITE), write(tmp_path / "job.yaml", JOB)
    r = cli("validate", s, j)
    assert r.returncode == 0, r.stderr
    assert "world size 8" in r.stdout and "8 images per rank" in r.stdout


@pytest.mark.parametrize("spelling", ["INFINITE", "infinite", "UNLIMITED"])
def test_max_time_of_a_partition_without_a_limit(tmp_path, spelling):
    # sinfo prints a partition without a time limit as "infinite".
    site = GPU_SITE.replace('max_time: "2-00:00:00"', f"max_time: {spelling}")
    plan = plan_of(tmp_path, site=site, job=JOB.replace('time: "04:00:00"', 'time: "30-00:00:00"'))
    assert plan.time == "30-00:00:00"
    msg = error_of(tmp_path, site=GPU_SITE.replace('max_time: "2-00:00:00"', "max_time: forever"))
    assert msg.endswith("site.yaml: slurm.max_time: 'forever' is not a Slurm time such as 90 (minutes), 04:00:00 or "
                        "2-00:00:00, or INFINITE for a partition without a limit")


CPU_SITE = GPU_SITE.replace("gpu_request: gres", "gpu_request: none").replace("gpus: 4", "gpus: 0")


def test_a_job_may_ask_for_part_of_a_node(tmp_path):
    job = JOB.replace("nodes: 2,", "nodes: 2, tasks_per_node: 2, cpus_per_task: 4,")
    plan = plan_of(tmp_path, site=CPU_SITE, job=job)
    assert (plan.tasks_per_node, plan.cpus_per_task, plan.omp_threads) == (2, 4, 4)
    assert ("cpus_per_task", 4) in plan.sbatch and "--cpus-per-task=4" in plan.train_srun
    assert "--cpus-per-task=8" in plan.stage_srun  # the job's CPUs on the node
    plan = plan_of(tmp_path, job=JOB.replace("nodes: 2,", "nodes: 2, gpus_per_node: 1, cpus_per_task: 6,"))
    assert (plan.cpus_per_task, plan.omp_threads) == (6, 6)


@pytest.mark.parametrize("site, resources, words", [
    (CPU_SITE, "tasks_per_node: 2, cpus_per_task: 25", "25 x 2 task(s) per node is more than site 'gpusite' nodes "
                                                        "have (48)"),
    (GPU_SITE, "cpus_per_task: 13", "13 x 4 task(s) per node is more than site 'gpusite' nodes have (48)"),
    (GPU_SITE, "launcher: torchrun, cpus_per_task: 3", "3 is fewer than the 4 training processes of each task"),
], ids=["cpu-site", "gpu-site", "torchrun"])
def test_cpus_per_task_is_checked_against_the_node(tmp_path, site, resources, words):
    msg = error_of(tmp_path, site=site, job=JOB.replace("nodes: 2,", f"nodes: 2, {resources},"))
    assert msg.endswith(f"job.yaml: resources.cpus_per_task: {words}")


def _argv_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("model", ["yolov8l", "yolo11x", "n", "m"])
def test_every_model_name_is_accepted(tmp_path, model):
    plan = plan_of(tmp_path, job=JOB.replace("train: {batch: 64}", f"train: {{batch: 64, model: {model}}}"))
    assert _argv_value(plan.train_argv, "--model") == model


def test_an_unknown_model_lists_the_choices(tmp_path):
    msg = error_of(tmp_path, job=JOB.replace("train: {batch: 64}", "train: {batch: 64, model: yolo12n}"))
    assert "job.yaml: train.model: must be one of yolov8n, yolov8s, yolov8m, yolov8l, yolov8x, yolo11n" in msg
    assert "(got 'yolo12n')" in msg


def test_the_default_model_is_n(tmp_path):
    from hpcyolo.login.runcheck import planned_settings

    plan = plan_of(tmp_path)
    assert "--model" not in plan.train_argv  # the trainer's default: n (yolov8n) without weights
    assert planned_settings(plan, tmp_path / "run")["model"] is None


def test_weights_relative_to_the_job_file(tmp_path):
    write(tmp_path / "w" / "yolo11n.pt", "x")
    plan = plan_of(tmp_path, job=JOB.replace("train: {batch: 64}", "train: {batch: 64, weights: w/yolo11n.pt}"))
    assert _argv_value(plan.train_argv, "--weights") == str(tmp_path / "w" / "yolo11n.pt")
    assert "--model" not in plan.train_argv  # the weights bring their architecture
    plan = plan_of(tmp_path, job=JOB.replace("train: {batch: 64}",
                                             f"train: {{batch: 64, model: yolo11n, weights: {tmp_path}/w/yolo11n.pt}}"))
    assert _argv_value(plan.train_argv, "--model") == "yolo11n"
    assert _argv_value(plan.train_argv, "--weights") == str(tmp_path / "w" / "yolo11n.pt")


@pytest.mark.parametrize("where, words", [("nowhere.pt", "file not found"), (".", "is not a file")])
def test_weights_must_be_a_file(tmp_path, where, words):
    msg = error_of(tmp_path, job=JOB.replace("train: {batch: 64}", f"train: {{batch: 64, weights: {where}}}"))
    assert msg.endswith(f"job.yaml: train.weights: {words}: {(tmp_path / where).resolve()}")


def test_cli_validate_missing_weights_is_one_line(tmp_path):
    s = write(tmp_path / "site.yaml", GPU_SITE)
    j = write(tmp_path / "job.yaml", JOB.replace("train: {batch: 64}", "train: {batch: 64, weights: gone.pt}"))
    r = cli("validate", s, j)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"hpcyolo: error: {j}: train.weights: file not found: {tmp_path / 'gone.pt'}"]


def test_multi_scale_and_rect_reach_the_trainer_only_when_set(tmp_path):
    assert not {"--multi-scale", "--rect"} & set(plan_of(tmp_path).train_argv)  # defaults: the old command line
    plan = plan_of(tmp_path, job=JOB.replace("train: {batch: 64}", "train: {batch: 64, multi_scale: 0.5, rect: true}"))
    assert _argv_value(plan.train_argv, "--multi-scale") == "0.5" and "--rect" in plan.train_argv


@pytest.mark.parametrize("value", ["1.0", "-0.1", "1.5"])
def test_multi_scale_is_a_fraction_below_one(tmp_path, value):
    msg = error_of(tmp_path, job=JOB.replace("train: {batch: 64}", f"train: {{batch: 64, multi_scale: {value}}}"))
    assert "job.yaml: train.multi_scale: must be a fraction in [0, 1)" in msg, msg
