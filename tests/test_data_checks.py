"""Data that cannot be trained on, and image sizes the models cannot take, are
refused in one line by every command that meets them, before any work."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import COCO8, REPO, SHARED

from hpcyolo.login import doctor
from hpcyolo.node.local import free_port

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


# == labels ====================================================================

def test_no_labels_folder_stops_train_before_anything_is_written(tmp_path, shapes):
    (shapes.parent / "labels").rename(shapes.parent / "label")  # misnamed
    lines = error_lines(hpcyolo("train", "--run-dir", tmp_path / "run", "--data", shapes, "--imgsz", "64",
                                "--epochs", "1", "--batch", "4", "--workers", "0"))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"hpcyolo: error: {shapes}: train: none of its 8 images has a label file (the first "
                               f"would be {shapes.parent / 'labels' / 'train' / '000000.txt'})")
    assert not (tmp_path / "run").exists()


def test_no_labels_folder_is_refused_by_validate_val_and_doctor(tmp_path, shapes):
    shutil.rmtree(shapes.parent / "labels" / "val")
    r = hpcyolo("validate", SITE, job_file(tmp_path, shapes), cwd=tmp_path)
    assert r.returncode == 2 and error_lines(r) == [
        f"hpcyolo: error: {shapes}: val: none of its 4 images has a label file (the first would be "
        f"{shapes.parent / 'labels' / 'val' / '000000.txt'}): labels go in a labels/ folder beside images/, "
        ".../images/a.jpg -> .../labels/a.txt; an empty .txt marks a background image"]
    if WEIGHTS.is_file():
        lines = error_lines(hpcyolo("val", WEIGHTS, "--data", shapes, "--imgsz", "64"))
        assert len(lines) == 1 and f"{shapes}: val: none of its 4 images has a label file" in lines[0]
    check = doctor.check_dataset(str(shapes))
    assert check.status == "FAIL" and "val: none of its 4 images has a label file" in check.detail


def test_submit_refuses_data_without_labels_before_the_queue(tmp_path, shapes):
    shutil.rmtree(shapes.parent / "labels")
    lines = error_lines(hpcyolo("submit", SITE, job_file(tmp_path, shapes), "--dry-run", cwd=tmp_path))
    assert len(lines) == 1 and f"{shapes}: train: none of its 8 images has a label file" in lines[0]


def test_validate_and_submit_refuse_a_pose_job_on_data_without_kpt_shape(tmp_path, shapes):
    """train.task pose reads its labels by the data YAML's kpt_shape: data without one is refused on the login
    node, in one line naming the file and the key; a bad flip_idx likewise, for any task."""
    job = job_file(tmp_path, shapes, task="pose")
    said = f"hpcyolo: error: {shapes}: kpt_shape: missing: train.task pose needs the keypoints' shape"
    for command in (("validate", SITE, job), ("submit", SITE, job, "--dry-run")):
        lines = error_lines(hpcyolo(*command, cwd=tmp_path))
        assert len(lines) == 1 and lines[0].startswith(said), lines
    assert hpcyolo("validate", SITE, job_file(tmp_path, shapes), cwd=tmp_path).returncode == 0  # detect: no keypoints
    shapes.write_text(shapes.read_text() + "kpt_shape: [4, 3]\nflip_idx: [0, 0, 1, 2]\n")
    lines = error_lines(hpcyolo("validate", SITE, job_file(tmp_path, shapes), cwd=tmp_path))
    assert lines == [f"hpcyolo: error: {shapes}: flip_idx: flip_idx [0, 0, 1, 2] is not a permutation of 0..3 (one "
                     "index per keypoint of kpt_shape)"]


def test_doctor_checks_the_data_for_the_jobs_task(tmp_path, shapes):
    """`hpcyolo doctor SITE JOB` checks the data as the job's train.task reads it: a data YAML given to a
    classifier, or a pose job's data without kpt_shape, is the data check's FAIL (validate refuses both)."""
    site = write_local_site(tmp_path)
    for task, said in (("classify", f"{shapes}: train.task classify takes a dataset folder in ultralytics' layout"),
                       ("pose", f"{shapes}: kpt_shape: missing: train.task pose needs the keypoints' shape")):
        job = job_file(tmp_path, shapes, task=task)
        r = hpcyolo("doctor", site, job, cwd=tmp_path)
        data = [line for line in r.stdout.splitlines() if line.split()[1:2] == ["data"]]
        assert r.returncode != 0 and len(data) == 1 and data[0].startswith("FAIL") and said in data[0], r.stdout
        assert len(error_lines(hpcyolo("validate", site, job, cwd=tmp_path))) == 1
    r = hpcyolo("doctor", site, job_file(tmp_path, shapes, task="segment"), cwd=tmp_path)
    assert [line.split()[0] for line in r.stdout.splitlines() if line.split()[1:2] == ["data"]] == ["PASS"], r.stdout


def write_local_site(tmp_path: Path) -> Path:
    """The local site, its runs under tmp_path (doctor checks they are writable)."""
    site = yaml.safe_load(SITE.read_text())
    site.setdefault("storage", {})["runs"] = str(tmp_path / "runs")
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def test_a_majority_unlabelled_is_one_warning_with_the_count(tmp_path, shapes):
    labels = shapes.parent / "labels" / "train"
    for name in ("000000", "000001", "000002", "000003", "000004"):
        (labels / f"{name}.txt").unlink()
    (labels / "000005.txt").write_text("")  # a background image on purpose: labelled
    warning = (f"warning: {shapes}: train: 5 of 8 images have no label file and count as background images "
               "(check the labels/ folder; an empty .txt marks a background image on purpose)")
    r = hpcyolo("validate", SITE, job_file(tmp_path, shapes), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.splitlines() == [warning], r.stderr
    assert doctor.check_dataset(str(shapes)).status == "WARN"
    r = hpcyolo("train", "--run-dir", tmp_path / "run", "--data", shapes, "--imgsz", "64", "--epochs", "1",
                "--batch", "4", "--workers", "0")
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if "label" in line] == [warning]


def test_empty_label_files_are_background_images_not_missing_ones(tmp_path, shapes):
    for label in (shapes.parent / "labels").rglob("*.txt"):
        label.write_text("")
    r = hpcyolo("validate", SITE, job_file(tmp_path, shapes), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert doctor.check_dataset(str(shapes)).status == "PASS"


def test_labels_with_no_usable_line_stop_train_after_a_bounded_list_of_warnings(tmp_path, shapes):
    # Class ids counted from 1 (or a `names` too short): every line is out of
    # range and dropped, which used to train a detector of background only.
    labels = sorted((shapes.parent / "labels" / "train").glob("*.txt"))
    for label in labels:
        label.write_text("4 0.5 0.5 0.2 0.2\n" * 3)
    r = hpcyolo("train", "--run-dir", tmp_path / "run", "--data", shapes, "--imgsz", "64", "--epochs", "1",
                "--batch", "4", "--workers", "0")
    lines = error_lines(r)
    malformed = [line for line in lines if "malformed label line skipped (class 4 is not one of 0..3)" in line]
    assert len(malformed) == 20 and len(lines) == 23, r.stderr
    assert lines[-3:] == [
        "warning: ... and 4 more problems like these (counted below)",
        "warning: skipped 0 corrupt images, 24 malformed label lines",
        f"hpcyolo: error: {shapes}: train: no label line is usable (skipped 0 corrupt images, 24 malformed label "
        "lines; see the warnings above): class ids run 0..3 for the 4 names, coordinates are fractions of the "
        "image in [0, 1]"]
    assert not (tmp_path / "run").exists()


def test_every_rank_of_a_refused_start_exits_with_the_refusals_code(tmp_path, shapes):
    # Two gloo ranks refuse the data together, right after rank 0's index is broadcast. A gloo thread
    # releasing that broadcast while the interpreter finalized used to abort a rank (SIGABRT: srun's
    # exit 134, read as a crash and retried) in about 3 of 10 starts; each rank now ends with code 1.
    for label in (shapes.parent / "labels" / "train").glob("*.txt"):
        label.write_text("4 0.5 0.5 0.2 0.2\n")
    for trial in range(8):
        port = free_port()
        ranks = [subprocess.Popen([HPCYOLO, "train", "--run-dir", str(tmp_path / f"run{trial}"), "--data", str(shapes),
                                   "--imgsz", "64", "--epochs", "1", "--batch", "4", "--workers", "0"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**ENV, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                 for r in range(2)]
        ended = [(p.communicate(timeout=120)[1], p.returncode) for p in ranks]
        for rank, (err, code) in enumerate(ended):
            assert code == 1 and "no label line is usable" in err.splitlines()[-1], (trial, rank, code, err[-1500:])


def test_coco8_passes_the_data_check():
    assert doctor.check_dataset(str(COCO8)).status == "PASS"


# == predict ===================================================================

@pytest.fixture
def weights() -> Path:
    if not WEIGHTS.is_file():
        pytest.skip(f"no reference weights {WEIGHTS}")
    return WEIGHTS


def test_predict_skips_a_corrupt_image_with_one_warning(tmp_path, weights):
    images = tmp_path / "images"
    shutil.copytree(COCO8.parent / "images" / "val", images)
    good = sorted(p.stem for p in images.iterdir())
    (images / "broken.jpg").write_bytes((images / f"{good[0]}.jpg").read_bytes()[:2000])  # cut-off download
    r = hpcyolo("predict", weights, images, "--out", tmp_path / "out", "--imgsz", "64")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert [line for line in lines if "warning" in line] == [
        f"warning: {images / 'broken.jpg'}: corrupt image skipped (ValueError: truncated JPEG (no end-of-image "
        "marker))"]
    assert lines[-1].endswith(f"detections in {len(good)} images; written to {tmp_path / 'out'}")
    assert sorted(p.stem for p in (tmp_path / "out" / "labels").iterdir()) == good


def test_predict_over_a_folder_without_images_is_one_line(tmp_path, weights):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    assert error_lines(hpcyolo("predict", weights, tmp_path / "empty", cwd=tmp_path)) == [
        f"hpcyolo: error: no images (.bmp, .jpeg, .jpg, .png, .tif, .tiff, .webp) in {tmp_path / 'empty'}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no predictions/ folder left behind
