"""Image sizes the models cannot take are refused in one line by every
command that meets them, before any work."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SHARED

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SITE = REPO / "site_configs" / "local.yaml"
WEIGHTS = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"
SIZE_LINE = "hpcyolo: error: --imgsz: must be a multiple of 32 (the models' largest stride), got 100: use 96 or 128"


def hpcyolo(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([HPCYOLO, *map(str, args)], capture_output=True, text=True, env=ENV, cwd=cwd)


@pytest.fixture(scope="module")
def shapes_source(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("source") / "shapes"
    r = hpcyolo("make-dataset", "shapes", folder, "--train", "8", "--val", "4", "--imgsz", "64")
    assert r.returncode == 0, r.stderr
    return folder


@pytest.fixture
def shapes(tmp_path, shapes_source) -> Path:
    """A fresh copy of the shapes dataset; returns its data YAML."""
    shutil.copytree(shapes_source, tmp_path / "shapes")
    return tmp_path / "shapes" / "data.yaml"


def job_file(tmp_path: Path, data: Path, **train) -> Path:
    spec = {"name": "checks", "data": {"yaml": str(data)},
            "train": {"epochs": 1, "batch": 4, "imgsz": 64, "workers": 0, **train}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip().splitlines()


# == --imgsz and train.imgsz ===================================================

@pytest.mark.parametrize("argv", [
    ["train", "--run-dir", "{tmp}/run", "--data", "{data}"],
    ["val", WEIGHTS, "--data", "{data}"],
    ["predict", WEIGHTS, "{data}"],
    ["export", WEIGHTS],
], ids=["train", "val", "predict", "export"])
def test_an_imgsz_off_the_stride_is_one_line_in_every_command(tmp_path, shapes, argv):
    # `train` used to get as far as the model and die in a RuntimeError traceback.
    argv = [str(a).format(tmp=tmp_path, data=shapes) for a in argv]
    assert error_lines(hpcyolo(*argv, "--imgsz", "100")) == [SIZE_LINE]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("size, words", [(0, "must be at least 32 (got 0)"), (100000, "must be at most 8192")])
def test_an_absurd_imgsz_is_one_line(tmp_path, shapes, size, words):
    lines = error_lines(hpcyolo("train", "--run-dir", tmp_path / "run", "--data", shapes, "--imgsz", size))
    assert len(lines) == 1 and words in lines[0]


@pytest.mark.parametrize("command", [["validate"], ["run"], ["submit", "--dry-run"]])
def test_a_job_spec_imgsz_off_the_stride_is_one_line(tmp_path, shapes, command):
    job = job_file(tmp_path, shapes, imgsz=100)
    lines = error_lines(hpcyolo(*command, SITE, job, cwd=tmp_path))
    assert lines == [f"hpcyolo: error: {job}: train.imgsz: must be a multiple of 32 (the models' largest stride), "
                     "got 100: use 96 or 128"]


def test_a_swept_imgsz_off_the_stride_is_one_line(tmp_path, shapes):
    job = job_file(tmp_path, shapes)
    lines = error_lines(hpcyolo("submit", SITE, job, "--dry-run", "--sweep", "train.imgsz=64,100", cwd=tmp_path))
    assert len(lines) == 1 and "train.imgsz: must be a multiple of 32" in lines[0] and "use 96 or 128" in lines[0]
