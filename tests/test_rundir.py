"""A run directory is never silently rewritten: a second request on it
continues the run only when it asks for the same run (hpcyolo_trainer.common.rundir), and
anything else stops in one line before a file is written."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from hpcyolo.login.config import load_job
from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.settings import SETTINGS, TrainConfig

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
LAUNCH = "import json, sys; from hpcyolo.node.local import launch; sys.exit(launch(json.loads(sys.argv[1]), 2))"
TINY = ("--imgsz", "64", "--batch", "4", "--nbs", "4", "--close-mosaic", "0", "--workers", "0")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def train(run: Path, data: Path, *args: str):
    return subprocess.run([HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), *TINY, *args],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def begin(run: Path, *args: str):
    """`hpcyolo job begin` at a job's first start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([HPCYOLO, "job", "begin", "--run-dir", str(run), *args], capture_output=True, text=True,
                          env=env)


def assert_refused(r, run: Path, before: dict[str, bytes], *names: str) -> None:
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1, r.stderr
    assert line.startswith("hpcyolo: error: ") and "use a new run directory" in line, line
    for name in names:
        assert name in line, line
    assert snapshot(run) == before  # config.yaml byte-identical, no new file


def test_every_trainer_setting_is_decided_with_a_reason():
    assert [s.name for s in SETTINGS] == [f.name for f in dataclasses.fields(TrainConfig)]
    job = load_job(REPO / "examples" / "coco8.yaml")  # messages about a job name its keys
    for s in SETTINGS:
        assert isinstance(s.same_run, bool) and s.why, s.name
        if s.same_run and s.key:
            section, key = s.key.split(".")
            assert hasattr(getattr(job, section), key), s.key


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return (make_shapes(root / "a", n_train=8, n_val=4, imgsz=64, classes=2, seed=0),
            make_shapes(root / "b", n_train=8, n_val=4, imgsz=64, classes=2, seed=1))


def test_train_refuses_another_run_and_resumes_the_same(tmp_path, datasets):
    a, b = datasets
    run = tmp_path / "runs" / "exp1"
    first = train(run, a, "--epochs", "1")
    assert first.returncode == 0, first.stderr
    before = snapshot(run)

    other_data = train(run, b, "--epochs", "1")
    assert_refused(other_data, run, before, f"holds a run of yolov8n on {a}", f"data ({a} -> {b})")
    other_model = train(run, a, "--epochs", "1", "--model", "s")
    assert_refused(other_model, run, before, "model (yolov8n -> yolov8s)")
    other_seed = train(run, a, "--epochs", "1", "--seed", "1", "--imgsz", "96")
    assert_refused(other_seed, run, before, "seed (0 -> 1)", "imgsz (64 -> 96)")

    # A job's first step (`hpcyolo job begin`, which the batch script runs
    # with the training options after --): the same rule, said in the job
    # spec's keys, and nothing written when refused; else the start recorded.
    check = begin(run, "--resume", "--", "--run-dir", str(run), "--data", str(a), *TINY, "--epochs", "1", "--seed", "1")
    assert_refused(check, run, before, "train.seed (0 -> 1)", "(run.name, or another job name)")
    unasked = begin(run)
    assert unasked.returncode == 1 and "already holds a run; set run.resume: true" in unasked.stderr, unasked.stderr
    assert snapshot(run) == before
    same = begin(run, "--resume", "--", "--run-dir", str(run), "--data", str(a), *TINY, "--epochs", "5")
    assert same.returncode == 0, same.stderr
    assert {k for k, v in snapshot(run).items() if before.get(k) != v} == {rundir.RECORD}
    assert [(s.job, s.restart) for s in rundir.starts(run)][-1] == ("local", "0")
    assert begin(tmp_path / "runs" / "new").returncode == 0 and rundir.starts(tmp_path / "runs" / "new")
    before = snapshot(run)

    # The same run, asked for more epochs from another folder (a relative --data), where only the hardware's
    # settings differ (two ranks instead of one, loader workers): a requeued job may land on other nodes. It
    # resumes. (One start for both: either difference refused would fail it.)
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", os.path.relpath(a, tmp_path), *TINY, "--workers", "1",
            "--epochs", "2"]
    same = subprocess.run([sys.executable, "-c", LAUNCH, json.dumps(argv)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert same.returncode == 0, same.stdout[-2000:] + same.stderr[-2000:]
    assert "resumed from ckpt-" in same.stdout + same.stderr and "epoch 2/2" in same.stdout
    rows = (run / "results.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["epochs"], saved["workers"], saved["dataset"]) == (2, 1, str(a))


def test_checkpoints_of_another_run_are_one_line(tmp_path, datasets):
    a, _ = datasets
    data = tmp_path / "data.yaml"  # a's dataset, through a YAML of this test's own
    data.write_text(yaml.safe_dump({**yaml.safe_load(a.read_text()), "path": str(a.parent)}))
    run = tmp_path / "run"
    assert train(run, data, "--epochs", "1").returncode == 0

    # config.yaml gone: the checkpoint's own settings speak for the run.
    (run / "config.yaml").unlink()
    before = snapshot(run)
    assert_refused(train(run, data, "--epochs", "1", "--model", "s"), run, before, "model (yolov8n -> yolov8s)")

    # The data YAML edited in place to a third class: the same settings, other shapes.
    data.write_text(yaml.safe_dump({**yaml.safe_load(data.read_text()), "names": {0: "x", 1: "y", 2: "z"}}))
    assert_refused(train(run, data, "--epochs", "1"), run, before, "holds yolov8n weights for 2 classes",
                   "trains yolov8n on 3 classes")


# == a job's run directory: run, validate, render, submit --dry-run ==========

def job_files(tmp_path: Path, data: Path, **train) -> tuple[Path, Path]:
    site = yaml.safe_load((REPO / "site_configs" / "local.yaml").read_text())
    site["storage"].update(runs=str(tmp_path / "runs"), scratch=str(tmp_path / "scratch"))
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    job = {"name": "tiny", "resources": {"nodes": 1, "tasks_per_node": train.pop("ranks", 1), "time": "00:10:00"},
           "data": {"yaml": str(data), "stage": True}, "run": {"resume": train.pop("resume", False)},
           "train": {"epochs": 1, "batch": 4, "nbs": 4, "imgsz": 64, "workers": 0, "close_mosaic": 0, **train}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    return tmp_path / "site.yaml", tmp_path / "job.yaml"


def hpcyolo(*args):
    return subprocess.run([HPCYOLO, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_job_on_a_run_is_told_beforehand_refused_or_continued(tmp_path, datasets):
    a, b = datasets
    site, job = job_files(tmp_path, a)
    run = tmp_path / "runs" / "tiny"
    for command in ("validate", "render"):  # nothing there yet: nothing to say
        assert hpcyolo(command, site, job).stderr == ""
    first = hpcyolo("run", site, job)
    assert first.returncode == 0, first.stderr
    # The ranks trained on a staged copy; the run records the dataset it stands for.
    assert yaml.safe_load((run / "config.yaml").read_text())["dataset"] == str(a)

    def warning(*args) -> str:
        r = hpcyolo(*args)
        assert r.returncode == 0, r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpcyolo: warning: "), r.stderr
        return lines[0]

    for args in (("validate", site, job), ("render", site, job), ("submit", site, job, "--dry-run")):
        assert f"the job would be refused: {run} already holds a run; set run.resume: true" in warning(*args)
    render = hpcyolo("render", site, job)
    assert render.stdout.startswith("#!/bin/bash") and "warning" not in render.stdout

    site, job = job_files(tmp_path, b, resume=True)
    for args in (("validate", site, job), ("render", site, job), ("submit", site, job, "--dry-run")):
        assert (f"the job would be refused: {run} holds a run of yolov8n on {a}; this request differs in "
                f"data.yaml ({a} -> {b}): use a new run directory (run.name, or another job name)") in warning(*args)
    before = snapshot(run)
    refused = hpcyolo("run", site, job)
    assert refused.returncode != 0 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "data.yaml (" in refused.stderr and snapshot(run) == before

    # The same job on two ranks, for one more epoch: told it continues, and it does.
    site, job = job_files(tmp_path, a, resume=True, ranks=2, epochs=2)
    assert warning("validate", site, job).endswith(f"{run} holds a run of yolov8n on {a}: the job continues it")
    resumed = hpcyolo("run", site, job)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from ckpt-" in resumed.stdout and "hpcyolo run: epoch 2: mAP50" in resumed.stderr


def test_an_unreadable_config_is_one_line(tmp_path, datasets):
    a, _ = datasets
    site, job = job_files(tmp_path, a, resume=True)
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("{not: yaml")
    before = snapshot(run)
    told = hpcyolo("validate", site, job)
    assert told.returncode == 0
    assert told.stderr == (f"hpcyolo: warning: the job would be refused: {run / 'config.yaml'}: cannot read the "
                           "run's settings (ParserError); use a new run directory to start a new run\n")
    assert_refused(train(run, a, "--epochs", "1"), run, before, "cannot read the run's settings")


def test_a_results_csv_of_the_names_before_ultralytics_reads_and_resumes_under_its_names(tmp_path):
    """results.csv took ultralytics' column names ((B) for the boxes); a run
    written before reads the same (status, compare), and its next epoch
    rewrites the file whole under the new header, the old rows kept."""
    from hpcyolo_trainer.common import rundir

    old = ("epoch,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision,metrics/recall,metrics/mAP50,"
           "metrics/mAP50-95,lr,time,speed/images_per_s,speed/data_wait,speed/gpu_mem_GiB\n"
           "1,1.5,2.5,1.25,0.5,0.25,0.375,0.125,0.01,3.0,9.0,0.1,n/a\n")
    (tmp_path / rundir.RESULTS).write_text(old)
    rows = rundir.read_results(tmp_path)
    assert rows[0][rundir.MAP50_95] == "0.125" and rows[0][rundir.PRECISION] == "0.5"
    assert rundir.scores(rows[0]) == "mAP50 0.375, mAP50-95 0.125"
    assert rows[0]["lr/pg0"] == "0.01"  # `lr` was the first group's
    rundir.write_result(tmp_path, (2, 3.0, 1.0, 2.0, 1.0, 0.75, 0.5, 0.5, 0.25, 1.5, 2.5, 1.0, 0.01, 0.02, 0.03, 9.0,
                                   0.1, "n/a"))
    text = (tmp_path / rundir.RESULTS).read_text().splitlines()
    assert text[0].split(",")[:2] == ["epoch", "time"]  # ultralytics' order
    assert text[0].split(",")[5:15] == ["metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)",
                                       "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss", "val/dfl_loss",
                                       "lr/pg0", "lr/pg1", "lr/pg2"]
    # the old row under the new header: its values where the columns are the same, empty where new
    assert text[1] == "1,3.0,1.5,2.5,1.25,0.5,0.25,0.375,0.125,,,,0.01,,,9.0,0.1,n/a"
    assert text[2].startswith("2,3.0,1.0,2.0")
