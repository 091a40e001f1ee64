"""`hpcyolo train --weights`: a run starts from an ultralytics checkpoint (or
hpcyolo weights) on every rank; a run's own checkpoint wins on resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHARED
from test_resume import max_abs_diff

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.run import checkpoint as ckpt
from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE
from hpcyolo_trainer.model.weights import read_weights

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
V8 = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"
pytestmark = pytest.mark.skipif(not V8.is_file(), reason=f"no reference fixture {V8}")


def argv(run: Path, data: Path, *extra: str) -> list[str]:
    return ["nice", "-n", "19", HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--epochs", "1",
            "--batch", "4", "--nbs", "4", "--imgsz", "64", "--workers", "0", "--warmup-epochs", "0", *extra]


def run1(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def shapes4(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("d") / "shapes", n_train=8, n_val=4, imgsz=64, classes=4, seed=0)


def test_two_ranks_start_from_ultralytics_weights_and_resume_wins(tmp_path, shapes4, capfd):
    # lr0 0: the optimizer never moves a weight, so the run's weights must be the file's.
    code = launch(argv(tmp_path / "run", shapes4, "--weights", str(V8), "--optimizer", "sgd", "--lr0", "0")[3:], 2,
                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = capfd.readouterr().out
    assert code == 0, out
    assert out.count("weights: 354/354 tensors from model.pt (ultralytics yolov8n, 4 classes)") == 1
    assert "training yolov8n on 8 images" in out
    saved = torch.load(tmp_path / "run" / "weights" / "last.pt", weights_only=True)
    assert saved["scale"] == "yolov8n"
    source = read_weights(V8).state
    convs = [k for k in source if k.endswith(".weight") and source[k].dim() == 4]
    worst = max((saved["model"][k] - source[k].float()).abs().max().item() for k in convs)
    assert worst < 1e-5, worst

    # A second start of the same run resumes its checkpoint; the weights file is not read.
    r = run1(argv(tmp_path / "run", shapes4, "--weights", str(V8), "--optimizer", "sgd", "--lr0", "0", "--epochs", "2"))
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "weights:" not in r.stdout


@pytest.fixture(scope="module")
def shapes3(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("d3") / "shapes", n_train=8, n_val=4, imgsz=64, classes=3, seed=7)


def class_conv(key: str) -> bool:
    return key.startswith("head.cls.") and key.split(".")[3] == "2"


def test_two_ranks_fine_tune_ultralytics_weights_to_other_classes(tmp_path, shapes3, capfd):
    # lr0 0: nothing moves, so last.pt shows what every run started from.
    code = launch(argv(tmp_path / "run", shapes3, "--weights", str(V8), "--optimizer", "sgd", "--lr0", "0")[3:], 2,
                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = capfd.readouterr().out
    assert code == 0, out
    assert out.count("weights: 348/354 tensors from model.pt (ultralytics yolov8n, 4 classes); class convs new for "
                     "3 classes") == 1
    assert "training yolov8n on 8 images (3 classes)" in out
    saved = torch.load(tmp_path / "run" / "weights" / "last.pt", weights_only=True)
    assert saved["names"] == ["circle", "square", "triangle"]
    source = read_weights(V8).state
    convs = [k for k in source if k.endswith(".weight") and source[k].dim() == 4 and not class_conv(k)]
    worst = max((saved["model"][k] - source[k].float()).abs().max().item() for k in convs)
    assert worst < 1e-5, worst
    for i in range(3):
        assert saved["model"][f"head.cls.{i}.2.weight"].shape[0] == 3
        assert saved["model"][f"head.cls.{i}.2.bias"].shape == (3,)


FRESH_INIT = """
import hashlib, json, sys, torch
from hpcyolo_trainer.run.setup import initial_model
from hpcyolo_trainer.model.weights import read_weights
weights = read_weights(sys.argv[2])
for rank, seed in json.loads(sys.argv[1]):
    torch.manual_seed(seed + rank)  # as the trainer seeds each rank's data RNG: different per rank
    torch.rand(100 + rank)
    model, line = initial_model("yolov8n", 3, seed, weights)
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode()); h.update(v.numpy().tobytes())
    print(h.hexdigest())
"""


def test_new_class_convs_are_the_same_on_every_rank_without_a_broadcast():
    """initial_model is what each rank runs before DDP exists (DDP's initial
    broadcast would hide a difference): per-rank RNG state must not matter.
    The three starts (rank 0 and 1 of seed 0, rank 0 of seed 1) one after
    the other in one process, each after its own RNG state: one torch import
    instead of three (each start set the global RNG as its rank would)."""
    starts = [(0, 0), (1, 0), (0, 1)]
    r = subprocess.run(["nice", "-n", "19", sys.executable, "-c", FRESH_INIT, json.dumps(starts), str(V8)],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    digest = dict(zip(starts, r.stdout.split()))
    assert len(digest) == 3 and all(len(d) == 64 for d in digest.values()), r.stdout
    assert digest[0, 0] == digest[1, 0]
    assert digest[0, 1] != digest[0, 0]  # the seed does set the new convs


def test_preempted_fine_tuning_resumes_from_its_checkpoint_bit_identical(tmp_path, shapes3, capfd):
    """Fine-tuning stopped mid-epoch by the preemption path and resumed: the
    run continues from its checkpoint (the weights file is not read again)
    and ends exactly where an uninterrupted fine-tuning run ends."""
    env = {k: v for k, v in os.environ.items() if k != DRILL_ENV}
    env["OMP_NUM_THREADS"] = "1"
    args = ["--weights", str(V8), "--epochs", "2", "--batch", "4", "--nbs", "4", "--close-mosaic", "1"]
    assert launch(argv(tmp_path / "a", shapes3, *args)[3:], 2, env=env) == 0
    # 8 images, 2 ranks x 2: 2 steps per epoch; the drill stops after step 3, inside epoch 2.
    assert launch(argv(tmp_path / "b", shapes3, *args)[3:], 2, env={**env, DRILL_ENV: "3"}) == EXIT_CODE
    stopped = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert (stopped["epoch"], stopped["global_step"]) == (1, 3)
    capfd.readouterr()
    assert launch(argv(tmp_path / "b", shapes3, *args)[3:], 2, env=env) == 0
    out = capfd.readouterr().out
    assert "resumed from" in out and "weights:" not in out
    a = ckpt.load_latest(tmp_path / "a" / "checkpoints", warn=print)
    b = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert a["global_step"] == b["global_step"] == 4
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part
    # And the run did move away from the pretrained file.
    source = read_weights(V8).state
    assert not torch.equal(b["model"]["backbone.stem.0.0.weight"], source["backbone.stem.0.0.weight"].float())


def test_model_that_contradicts_the_weights_is_one_line(tmp_path, shapes4):
    r = run1(argv(tmp_path / "run", shapes4, "--weights", str(V8), "--model", "yolo11n"))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"hpcyolo: error: {V8}: holds yolov8n, but --model asks for yolo11n "
                                             "(leave --model out to train the weights' own architecture)"]
