"""`hpcyolo train --task pose` end to end on CPU: YOLO11 (v8PoseLoss) and
YOLO26 (E2ELoss of PoseLoss26) train on a make-dataset pose set and
validate the boxes by IoU and the keypoints by OKS; results.csv's columns
ultralytics' pose trainer's (its loss names, PoseLoss26's with l1 and rle,
the (B) and (P) metrics, the val/ losses; as its own training of yolo11n-pose
and yolo26n-pose wrote them, the reference script's trained-pose); every figure finite, the plots
drawn (keypoints on the batches, Pose*_curve.png), the weights read back as
a keypoint model of the data's kpt_shape and measured again by `hpcyolo
val`; a bad pose row or a data YAML without kpt_shape stops the run in one
line before anything is written."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from shared_runs import stopped_and_resumed_like, two_ranks
from test_obb_train import refused_in_one_line
from test_yolo26_train import argv, env

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.model.weights import read_weights

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "ultralytics" / "trained"
METRICS = [f"metrics/{m}({k})" for k in "BP" for m in ("precision", "recall", "mAP50", "mAP50-95")]


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory) -> Path:
    return make_shapes(tmp_path_factory.mktemp("pose") / "shapes", n_train=16, n_val=8, imgsz=96, task="pose", seed=0)


def train(data: Path, run: Path, model: str, epochs: int, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([HPCYOLO, "train", "--task", "pose", "--model", model, "--data", str(data), "--epochs",
                           str(epochs), "--imgsz", "96", "--batch", "8", "--workers", "0", "--run-dir", str(run),
                           *more], capture_output=True, text=True, env=env())


# The resume test's runs: 16 images, 2 ranks x 2: 4 steps an epoch; two loader workers a rank; mosaic, a rotating
# warp, flips by flip_idx, mixup and CutMix move the keypoints.
RESUME_ARGS = ["--task", "pose", "--model", "yolo11n", "--epochs", "2", "--close-mosaic", "1", "--workers", "2",
               "--degrees", "10", "--mixup", "0.5", "--cutmix", "0.5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> types.SimpleNamespace:
    """The resume test's uninterrupted run (RESUME_ARGS, 2 ranks): data, run
    (its directory), out (its output). Also the yolo11n run of
    test_a_pose_run_trains_and_logs_ultralytics_columns, which trained one
    of its own (one rank, 96 px) for the same columns, plots and reads."""
    tmp = tmp_path_factory.mktemp("pose-run")
    data = make_shapes(tmp / "shapes", n_train=16, n_val=4, imgsz=64, task="pose", seed=1)
    r = two_ranks(argv(tmp / "a", data, *RESUME_ARGS))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return types.SimpleNamespace(data=data, run=tmp / "a", out=r.stdout)


@pytest.mark.parametrize("model, epochs, losses", [
    ("yolo11n", 2, ["box_loss", "pose_loss", "kobj_loss", "cls_loss", "dfl_loss"]),
    ("yolo26n", 1, ["box_loss", "pose_loss", "kobj_loss", "cls_loss", "l1_loss", "rle_loss"])])
def test_a_pose_run_trains_and_logs_ultralytics_columns(request, tiny_set, tmp_path, model, epochs, losses):
    """yolo11n: the resume test's uninterrupted run (2 ranks, 2 epochs, 64 px);
    yolo26n: a run of its own (1 rank, 1 epoch, 96 px)."""
    if model == "yolo11n":
        shared = request.getfixturevalue("uninterrupted")
        run, data, stdout = shared.run, shared.data, shared.out
    else:
        run, data = tmp_path / "run", tiny_set
        r = train(data, run, model, epochs)
        assert r.returncode == 0, r.stderr
        stdout = r.stdout
    header, *rows = list(csv.reader((run / "results.csv").open()))
    want = ["epoch", "time", *(f"train/{k}" for k in losses), *METRICS, *(f"val/{k}" for k in losses),
            "lr/pg0", "lr/pg1", "lr/pg2"]
    assert header[:len(want)] == want
    theirs = json.loads((REFERENCE / f"{model}-pose" / "val.json").read_text())["columns"]
    assert header[:len(theirs)] == theirs  # ultralytics' own training of the model wrote these; our speed columns after
    assert len(rows) == epochs
    for row in rows:
        figures = dict(zip(header, row))
        assert all(math.isfinite(float(figures[c])) for c in want[1:])
        assert all(float(figures[f"train/{k}"]) > 0 for k in losses)
        assert all(0 <= float(figures[c]) <= 1 for c in METRICS)
    line = next(text for text in stdout.splitlines() if text.startswith(f"epoch {epochs}/{epochs}: loss"))
    assert "; pose P " in line and " kobj " in line
    assert "\nkeypoints\n" in stdout  # the per-class tables: the boxes', then the keypoints'
    drawn = {p.name for p in run.iterdir()}
    assert {"train_batch0.jpg", "labels.jpg", "val_batch0_labels.jpg", "val_batch0_pred.jpg", "val_pred_0.jpg",
            "BoxPR_curve.png", "PosePR_curve.png", "confusion_matrix.png", "results.png"} <= drawn
    weights = read_weights(run / "weights" / "last.pt")
    assert (weights.task, weights.arch, weights.nc, weights.kpt_shape) == ("pose", model, 4, (4, 3))
    # hpcyolo val of last.pt: results.csv's last row (the EMA weights it holds, validated alike)
    v = subprocess.run([HPCYOLO, "val", str(run / "weights" / "last.pt"), "--data", str(data), "--json",
                        "--batch", "16"], capture_output=True, text=True, env=env())
    assert v.returncode == 0, v.stderr
    result, last = json.loads(v.stdout), dict(zip(header, rows[-1]))
    for key, column in (("map50_95", "metrics/mAP50-95(B)"), ("precision", "metrics/precision(B)")):
        assert result[key] == pytest.approx(float(last[column]), abs=2e-5)
    assert result["pose"]["map50_95"] == pytest.approx(float(last["metrics/mAP50-95(P)"]), abs=2e-5)
    assert result["pose"]["instances"] == result["instances"] > 0
    # hpcyolo compare ranks it by ultralytics' fitness of a keypoint model: the boxes' mAP50-95 plus the keypoints'
    c = subprocess.run([HPCYOLO, "compare", str(run), "-o", str(tmp_path / "cmp.png"), "--json"], capture_output=True,
                       text=True, env=env())
    assert c.returncode == 0, c.stderr
    (ranked,) = json.loads(c.stdout)
    fitness = [float(x["metrics/mAP50-95(B)"]) + float(x["metrics/mAP50-95(P)"]) for x in map(dict, (zip(header, r)
                                                                                                for r in rows))]
    assert ranked["fitness"] == pytest.approx(max(fitness), abs=1e-9)
    assert f"{ranked['map50_95_pose']:.5f}" == rows[ranked["epoch"] - 1][header.index("metrics/mAP50-95(P)")]
    # hpcyolo export of the trained weights: ultralytics' pose layout, the data's kpt_shape in the metadata
    import onnx

    e = subprocess.run([HPCYOLO, "export", str(run / "weights" / "last.pt"), "-o", str(tmp_path / "pose.onnx")],
                       capture_output=True, text=True, env=env())
    assert e.returncode == 0, e.stderr
    proto = onnx.load(str(tmp_path / "pose.onnx"))
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["task"] == "pose" and meta["kpt_shape"] == "[4, 3]"
    dims = [d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim]
    assert dims[:2] == [1, 4 + 4 + 4 * 3]  # boxes, class scores, K x D keypoint values per anchor


@pytest.mark.parametrize("row, said", [
    ("1 0.5 0.5 0.2 0.2 0.4 0.5 2 0.5 0.4 2", "malformed pose row (11 numbers (kpt_shape [4, 3]: 5 + 12))"),
    ("2 0.5 0.5 0.2 0.2 0.4 0.5 2 0.5 0.4 2 0.6 0.5 3 0.5 0.6 2",
     "malformed pose row (keypoint visibility 3 is not 0, 1 or 2)")])
def test_a_bad_pose_row_stops_the_run_in_one_line_before_anything_is_written(tiny_set, tmp_path, row, said):
    refused_in_one_line(tiny_set, tmp_path, "val", row, said, train)


@pytest.mark.parametrize("edit, said", [
    (lambda text: text.replace("flip_idx: [2, 1, 0, 3]", "flip_idx: [2, 1, 0, 2]"),
     "flip_idx: flip_idx [2, 1, 0, 2] is not a permutation of 0..3"),
    (lambda text: text.replace("kpt_shape: [4, 3]\n", "").replace("flip_idx: [2, 1, 0, 3]\n", ""),
     "kpt_shape: missing: train.task pose needs the keypoints' shape")])
def test_a_bad_data_yaml_stops_the_run_in_one_line_naming_its_key(tiny_set, tmp_path, edit, said):
    shutil.copytree(tiny_set.parent, tmp_path / "set")
    data = tmp_path / "set" / "data.yaml"
    data.write_text(edit(data.read_text()))
    r = train(data, tmp_path / "run", "yolo11n", 1)
    assert r.returncode != 0 and not (tmp_path / "run").exists(), r.stderr
    errors = [text for text in r.stderr.splitlines() if text.startswith("hpcyolo: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{data}: {said}" in errors[0]


def test_a_pose_run_stopped_by_a_signal_on_two_ranks_resumes_bit_identical(uninterrupted, tmp_path):
    """16 images, 2 ranks x 2: 4 steps an epoch; held after step 5 (epoch 2,
    the last: close_mosaic's), stopped by SIGUSR2, resumed; two loader
    workers a rank; mosaic, a rotating warp, flips by flip_idx, mixup and
    CutMix move the keypoints: model, EMA, optimizer and results.csv the
    same as the uninterrupted run's."""
    # epoch, losses, box and keypoint figures, val losses, lrs
    rows = stopped_and_resumed_like(uninterrupted.run, uninterrupted.data, RESUME_ARGS, tmp_path / "b", 21)
    assert rows[0][1:6] == ["train/box_loss", "train/pose_loss", "train/kobj_loss", "train/cls_loss",
                            "train/dfl_loss"]
    assert rows[0][6:14] == METRICS
    assert all(float(v) > 0 for row in rows[1:] for v in row[14:19])  # validated every epoch: a loss


def test_weights_of_another_kpt_shape_fine_tune_with_new_keypoint_branches(tiny_set, tmp_path):
    """Ultralytics' yolo26n-pose checkpoint of kpt_shape [3, 2] (the
    reference script's pose-checkpoint) onto the [4, 3] set: every tensor
    but the keypoint branches' (and the class convs') comes from the file,
    as ultralytics transfers those whose shapes match; the run trains."""
    import torch

    start = REFERENCE.parent / "checkpoints" / "yolo26n-pose" / "model.pt"
    r = train(tiny_set, tmp_path / "run", "yolo26n", 1, "--weights", str(start), "--lr0", "0", "--optimizer", "sgd",
              "--warmup-epochs", "0")
    assert r.returncode == 0, r.stderr
    assert "keypoint branches new for kpt_shape [4, 3] (the weights': [3, 2])" in r.stdout, r.stdout
    read = read_weights(start)
    last = torch.load(tmp_path / "run" / "weights" / "last.pt", weights_only=True)["model"]
    kept = [k for k in last if k.startswith("backbone.") and "running" not in k and "num_batches" not in k]
    assert kept and all(torch.equal(last[k].float(), read.state[k].float()) for k in kept)
    assert last["head.kpt_out.0.weight"].shape[0] == 4 * 3 != read.state["head.kpt_out.0.weight"].shape[0]


def test_a_run_whose_data_changed_its_kpt_shape_is_not_resumed_and_says_so_in_one_line(tiny_set, tmp_path):
    """A run trained on kpt_shape [4, 3], then asked to go on after its
    data.yaml says [6, 2] (the label rows still parse: 12 values): one
    line naming the checkpoint and both shapes, exit 1, nothing written."""
    shutil.copytree(tiny_set.parent, tmp_path / "set")
    data, run = tmp_path / "set" / "data.yaml", tmp_path / "run"
    assert train(data, run, "yolo11n", 1).returncode == 0
    data.write_text(data.read_text().replace("kpt_shape: [4, 3]", "kpt_shape: [6, 2]")
                    .replace("flip_idx: [2, 1, 0, 3]", "flip_idx: [1, 0, 3, 2, 5, 4]"))
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    r = train(data, run, "yolo11n", 2)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("hpcyolo: error:")]
    assert len(errors) == 1 and "holds a keypoint model for kpt_shape [4, 3], but the data's kpt_shape is [6, 2]" \
        in errors[0], r.stderr
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("arch", ["yolo11n", "yolo26n"])
def test_the_pose_kobj_and_rle_settings_are_the_losss_gains(tiny_set, arch):
    """train.pose, train.kobj and train.rle (ultralytics' pose, kobj, rle) reach the keypoint loss."""
    from hpcyolo_trainer.common.datayaml import load_data_spec
    from hpcyolo_trainer.common.settings import TrainConfig
    from hpcyolo_trainer.tasks.task import load

    task = load("pose").with_data(load_data_spec(tiny_set))
    cfg = TrainConfig(run_dir="unused", data=str(tiny_set), task="pose", pose=3.0, kobj=0.25, rle=0.5)
    loss = task.loss(task.build_model(arch, 4), 4, 1, cfg)
    heads = [loss.one2many, loss.one2one] if arch == "yolo26n" else [loss]
    assert all(h.pose_gains == (3.0, 0.25, 0.5) and h.kpt_shape == (4, 3) for h in heads)
    assert ("rle_loss" in loss.names) == (arch == "yolo26n")


def test_an_ultralytics_recipe_sets_the_keypoint_gains(tmp_path):
    from hpcyolo_trainer.common.recipe import read_recipe

    recipe = tmp_path / "hyp.yaml"
    recipe.write_text("pose: 20.0\nkobj: 2.0\nrle: 0.5\n")
    settings, ignored = read_recipe(recipe)
    assert (settings["pose"], settings["kobj"], settings["rle"]) == (20.0, 2.0, 0.5) and not ignored
