"""Ultralytics' training settings as hpcyolo's: their names and defaults
(pinned against ultralytics 8.4.190's own cfg/default.yaml, the fixture
train-defaults.json), and each doing what it says: loss gains, the warm-up's
start values and cosine decay, patience decided on every rank at once, and
save_period's epochN.pt files."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHARED

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.common.settings import REQUIRED, SETTINGS, TrainConfig

DEFAULTS = SHARED / "fixtures" / "ultralytics" / "train-defaults.json"
V8 = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"
HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
# Settings whose name ultralytics uses for something else, or spells another way.
OTHER_MEANING = {
    "augment": "ultralytics' augment is test-time augmentation at predict; ours switches training augmentation",
    "cache": "ultralytics says False/True/'disk'; ours none/ram/disk",
    "lr0": "ours is empty: 0.01 for sgd and musgd (ultralytics' 0.01), 0.001 for adamw",
    "channels_last": "ultralytics' null means on for CUDA (but on Windows); ours True means on for CUDA",
}
# Defaults still ours, not ultralytics' (issue 27 is open on them).
def test_every_setting_that_ultralytics_has_defaults_to_ultralytics_value():
    theirs = json.loads(DEFAULTS.read_text())["defaults"]
    shared = [s for s in SETTINGS if s.name in theirs and s.default is not REQUIRED and s.name not in OTHER_MEANING]
    assert len(shared) >= 35
    differ = {s.name: (s.default, theirs[s.name]) for s in shared if s.default != theirs[s.name]}
    assert differ == {}
    # And each is the job spec's train.NAME where it is a train setting.
    for s in shared:
        if s.key and s.key.startswith("train."):
            assert s.key == f"train.{s.name}", s.name


def test_the_loss_gains_scale_each_term():
    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.model.detector import build_model
    from hpcyolo_trainer.tasks.detect.task import loss as detection_loss

    torch.manual_seed(0)
    model = build_model("yolov8n", 2)
    feats = model(torch.rand(2, 3, 64, 64))
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.4, 0.3], [1, 1, 0.3, 0.6, 0.2, 0.2]])
    d = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    cfg = TrainConfig(run_dir="r", data="d")
    _, base = detection_loss(model, 2, d.world_size, cfg)(feats, targets)
    gained = TrainConfig(run_dir="r", data="d", box=2 * 7.5, cls=3 * 0.5, dfl=0.0)
    _, items = detection_loss(model, 2, d.world_size, gained)(feats, targets)
    assert torch.allclose(items, base * torch.tensor([2.0, 3.0, 0.0]), rtol=1e-6)


def test_warmup_starts_and_cosine_decay_come_from_the_settings():
    from hpcyolo_trainer.model.detector import build_model
    from hpcyolo_trainer.run.setup import build_optimization

    model = build_model("yolov8n", 2)
    cfg = TrainConfig(run_dir="r", data="d", batch=16, nbs=16, epochs=10, warmup_bias_lr=0.05, warmup_momentum=0.6,
                      cos_lr=True, lrf=0.1, optimizer="sgd")
    optimizer, schedule, _ = build_optimization(cfg, model, batches=100)
    schedule.apply(optimizer, 0)
    lrs = {g["name"]: g["lr"] for g in optimizer.param_groups}
    assert lrs["bias"] == pytest.approx(0.05) and lrs["decay"] == 0.0
    assert all(g["momentum"] == pytest.approx(0.6) for g in optimizer.param_groups)
    assert schedule.warmup_batches == 300 and schedule.batches_per_epoch == 100
    schedule.apply(optimizer, 450)  # after the warm-up, epoch 5 of 10: cosine at 4/10 (linear would be 0.64 lr0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(0.4 * math.pi))))
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.937)


def test_cos_lr_keeps_the_old_spelling_of_its_option_and_of_old_runs():
    from click.testing import CliRunner

    from hpcyolo.cli import main
    from hpcyolo.cli.task import train
    from hpcyolo_trainer.common.settings import BY_NAME

    assert "--cos-lr, --cosine / --no-cos-lr, --linear" in " ".join(CliRunner().invoke(main, ["train", "--help"]).output
                                                                   .split())
    for words, expected in ((["--cosine"], True), (["--linear"], False), (["--cos-lr"], True), ([], False)):
        assert train.make_context("train", ["--run-dir", "r", "--data", "d", *words]).params["cos_lr"] is expected
    # A run directory written before the rename says `cosine`: the same-run rule reads it.
    assert BY_NAME["cos_lr"].of({"cosine": True}) is True and BY_NAME["cos_lr"].of({"cos_lr": False}) is False


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("d") / "shapes", n_train=8, n_val=8, imgsz=160, classes=4, seed=2)


def test_patience_stops_all_ranks_where_ultralytics_rule_says_and_save_period_keeps_its_epochs(tmp_path, shapes,
                                                                                             capfd):
    """Two ranks fine-tuning the yolov8n fixture (a fitness that moves, not
    an early zero), patience 2: the run ends (exit 0, weights written)
    exactly where ultralytics' rule on its own results.csv says, well before
    its 20 epochs; save_period 3 keeps epoch0.pt, epoch3.pt, ... as
    ultralytics names them."""
    run = tmp_path / "run"
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(shapes), "--epochs", "20", "--batch", "4",
            "--nbs", "4", "--imgsz", "160", "--weights", str(V8), "--workers", "0", "--optimizer", "sgd", "--lr0",
            "0.0005", "--patience", "2", "--save-period", "3", "--close-mosaic", "0"]
    assert launch(argv, 2, env={**os.environ, "OMP_NUM_THREADS": "1"}) == 0
    out = capfd.readouterr().out
    rows = [line.split(",") for line in (run / "results.csv").read_text().splitlines()[1:]]
    fitness = [float(r[8]) for r in rows]  # ultralytics 8.4's fitness: mAP50-95 (epoch, time, 3 losses, P, R, mAP50)
    best, best_epoch, stop = -1.0, 0, None
    for epoch, f in enumerate(fitness, start=1):  # ultralytics' EarlyStopping
        if f > best or best == 0:
            best_epoch = epoch
        best = max(best, f)
        if epoch - best_epoch >= 2:
            stop = epoch
            break
    assert stop is not None and stop == len(rows) < 20, (fitness, stop)
    assert out.count("stopping early: no better fitness in the 2 epochs after epoch") == 1
    assert (run / "weights" / "best.pt").is_file() and (run / "weights" / "last.pt").is_file()
    kept = sorted(p.name for p in (run / "weights").glob("epoch*.pt"))
    assert kept == sorted(f"epoch{e}.pt" for e in range(0, len(rows), 3))
    # Started again, the same run stops at once: the checkpoint holds where patience stood.
    capfd.readouterr()
    assert launch(argv, 2, env={**os.environ, "OMP_NUM_THREADS": "1"}) == 0
    again = capfd.readouterr().out
    assert "stopping early" in again and len((run / "results.csv").read_text().splitlines()) == len(rows) + 1


def test_fraction_trains_on_the_first_share_of_the_images_in_name_order():
    from hpcyolo_trainer.common.datayaml import training_files

    files = [Path(f"img{k:02d}.jpg") for k in (5, 3, 9, 1, 7, 2, 8, 4)]
    assert training_files(files, 1.0) == files  # all, in the order given
    assert training_files(files, 0.25) == [Path("img01.jpg"), Path("img02.jpg")]
    assert training_files(files, 0.01) == [Path("img01.jpg")]  # at least one


def test_freeze_keeps_those_layers_weights_bit_identical_on_two_ranks_and_trains_the_rest(tmp_path, shapes, capfd):
    from hpcyolo_trainer.run import checkpoint as ckpt
    from hpcyolo_trainer.run.setup import initial_model
    from hpcyolo_trainer.model.weights import read_weights

    run = tmp_path / "run"
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(shapes), "--epochs", "1", "--batch", "4",
            "--nbs", "4", "--imgsz", "160", "--weights", str(V8), "--workers", "2", "--freeze", "10",
            "--fraction", "0.5", "--warmup-epochs", "0"]
    assert launch(argv, 2, env={**os.environ, "OMP_NUM_THREADS": "1"}) == 0
    out = capfd.readouterr().out
    assert "freeze: layers 0-9 (" in out and "training yolov8n on 4 images" in out  # fraction 0.5 of 8
    start, _ = initial_model("yolov8n", 4, 0, read_weights(V8))
    trained = ckpt.load_latest(run / "checkpoints", warn=print)["model"]
    frozen = [n for n, _ in start.named_parameters() if n.startswith("backbone.")]  # YOLOv8's layers 0-9
    moved = [n for n, _ in start.named_parameters() if not n.startswith("backbone.")]
    assert frozen and moved
    params = dict(start.named_parameters())
    assert all(torch.equal(trained[n], params[n].detach()) for n in frozen)
    assert sum(not torch.equal(trained[n], params[n].detach()) for n in moved) > len(moved) // 2


def test_the_schedule_gives_the_learning_rates_ultralytics_logged():
    """lr/pg1 (the norm weights, no decay) of each epoch's last batch in the
    results.csv of an ultralytics 8.4.190 run (yolo26n, SGD, lr0 0.01, lrf
    0.01, 800 images, batch 32 = nbs: 25 steps an epoch, 12 epochs, a
    warm-up of 3 epochs = 75 steps)."""
    from hpcyolo_trainer.model.detector import build_model
    from hpcyolo_trainer.run.setup import build_optimization

    logged = {1: 0.0032, 2: 0.00599433, 3: 0.00823867, 4: 0.007525, 5: 0.0067, 8: 0.004225, 12: 0.000925}
    cfg = TrainConfig(run_dir="r", data="d", batch=32, nbs=32, epochs=12, optimizer="sgd", lr0=0.01)
    optimizer, schedule, accumulate = build_optimization(cfg, build_model("yolov8n", 4), batches=25)
    assert accumulate == 1 and schedule.warmup_batches == 75
    for epoch, lr in logged.items():
        schedule.apply(optimizer, epoch * 25 - 1)
        norm = next(g for g in optimizer.param_groups if g["name"] == "norm")
        assert norm["lr"] == pytest.approx(lr, rel=1e-5), epoch


def ultralytics_steps(batches: int, epochs: int, batch: int, nbs: int, warmup_epochs: float) -> list[int]:
    """The run batches at which ultralytics 8.4's loop (engine/trainer.py,
    _do_train, transcribed) steps the optimizer; with `batches` per epoch
    and an optimizer step forced at each epoch's end, as ours does."""
    import numpy as np

    nw = round(min(warmup_epochs, max(epochs - 1, 0)) * batches)
    accumulate, last_opt_step, steps = max(round(nbs / batch), 1), -1, []
    for ni in range(batches * epochs):
        if ni < nw:
            accumulate = max(1, int(np.interp(ni, [0, nw], [1, nbs / batch]).round()))
        if ni - last_opt_step >= accumulate or (ni + 1) % batches == 0:
            steps.append(ni)
            last_opt_step = ni
    return steps


@pytest.mark.parametrize("batches,batch,nbs,warmup", [(1000, 16, 64, 3.0), (40, 4, 64, 2.5), (7, 2, 8, 0.3),
                                                      (50, 16, 64, 0.0), (30, 64, 64, 3.0)])
def test_the_warm_up_ramps_the_accumulated_batches_as_ultralytics_loop_does(batches, batch, nbs, warmup):
    from hpcyolo_trainer.optim.schedule import Schedule, warmup_batches_for

    epochs = 3
    s = Schedule(lr0=0.01, lrf=0.01, momentum=0.937, epochs=epochs, batches_per_epoch=batches, nominal=nbs / batch,
                 warmup_batches=warmup_batches_for(warmup, epochs, batches))
    ours, last = [], -1
    for at in range(batches * epochs):  # train_epoch's rule
        if at - last >= s.accumulate(at) or (at + 1) % batches == 0:
            ours.append(at)
            last = at
    theirs = ultralytics_steps(batches, epochs, batch, nbs, warmup)
    assert ours == theirs
    if warmup >= 1 and batch < nbs:
        assert ours[:2] == [0, 1]  # one batch a step at the start of the warm-up
        assert max(b - a for a, b in zip(ours, ours[1:])) == round(nbs / batch)  # and nbs / batch after it


@pytest.fixture(scope="module")
def val_off_run(tmp_path_factory, shapes):
    """One single-process run for two tests: --no-val (ultralytics'
    val=False) with patience 1, for the val-off test, in batches of 2 with
    nbs 8 and a checkpoint every step, for the test of where the optimizer
    steps. Neither test's check depends on the other's settings (validation
    does not move the optimizer's steps; the batch split does not decide
    which epochs are validated); each used to train a run of its own.
    lr0 0.0005: the fixture's weights keep scoring well above zero."""
    import subprocess

    run = tmp_path_factory.mktemp("val-off") / "run"
    r = subprocess.run([HPCYOLO, "train", "--run-dir", str(run), "--data", str(shapes), "--epochs", "3", "--batch",
                        "2", "--nbs", "8", "--imgsz", "160", "--weights", str(V8), "--workers", "0", "--no-val",
                        "--patience", "1", "--close-mosaic", "0", "--lr0", "0.0005", "--save-every", "1"],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return run, r


def test_val_off_validates_only_the_last_epoch_as_ultralytics_val_false(val_off_run):
    """--no-val (ultralytics' val=False): epochs 1 and 2 are not validated
    (zeros in results.csv, as ultralytics writes them, and said so in the
    epoch's line), the last one is; patience 1 does not stop the run; best.pt
    is the last epoch's. The fixture's weights score well above zero on
    these images, so a zero row is one that was not validated."""
    run, r = val_off_run
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split(",") for line in (run / "results.csv").read_text().splitlines()[1:]]
    assert [[float(x) for x in row[5:9]] == [0.0] * 4 for row in rows] == [True, True, False]  # P, R, mAP50, mAP50-95
    assert float(rows[2][7]) > 0.3  # mAP50 of the validated last epoch
    assert r.stdout.count("not validated (val off)") == 2 and "stopping early" not in r.stdout
    assert "arithmetic: fp32, NCHW, cudnn.benchmark off, deterministic off, 1 torch threads" in r.stdout
    assert (run / "weights" / "best.pt").read_bytes() == (run / "weights" / "last.pt").read_bytes()


def test_a_run_steps_the_optimizer_where_ultralytics_would(val_off_run):
    """8 images in batches of 2, nbs 8, 3 epochs: the warm-up (2 epochs, 8
    batches) ramps from 1 to 4 batches a step; the run's step count, in its
    checkpoints' names, is ultralytics' (with each epoch's last step)."""
    run, r = val_off_run
    assert r.returncode == 0, r.stderr
    steps = sorted(int(p.stem.split("-")[1]) for p in (run / "checkpoints").glob("ckpt-*.pt"))
    expected = ultralytics_steps(4, 3, 2, 8, 3.0)
    assert steps[-1] == len(expected) and len(expected) < 12  # fewer steps than batches, more than 12 / 4


def test_single_cls_trains_and_validates_one_class_named_item(tmp_path, shapes):
    import subprocess

    r = subprocess.run([HPCYOLO, "train", "--run-dir", str(tmp_path / "run"), "--data", str(shapes), "--epochs", "1",
                        "--batch", "4", "--nbs", "4", "--imgsz", "64", "--weights", str(V8), "--workers", "0",
                        "--optimizer", "sgd", "--lr0", "0", "--single-cls"], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert "training yolov8n on 8 images (1 classes)" in r.stdout and "class convs new for 1 classes" in r.stdout
    saved = torch.load(tmp_path / "run" / "weights" / "last.pt", weights_only=True)
    assert saved["names"] == ["item"] and saved["model"]["head.cls.0.2.bias"].shape == (1,)
    # Training and validation labels alike are all of class 0; the data YAML's four classes were there.
    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.run.inputs import load_data

    d = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    for single, classes in ((False, {0, 1, 2, 3}), (True, {0})):
        cfg = TrainConfig(run_dir=str(tmp_path / "run"), data=str(shapes), batch=4, imgsz=160, single_cls=single)
        data = load_data(cfg, d)
        assert data.nc == len(classes) and data.val_batches.nc == len(classes)
        for split in (data.train_set, data.val_batches):
            assert {int(c) for lb in split.labels for c in lb[:, 0]} == classes


def test_a_recipe_run_stopped_mid_epoch_resumes_bit_identical(tmp_path, shapes, capfd):
    """The recipe's settings on (MixUp, CutMix, Copy-Paste from a second
    sample on polygon labels, boxes from the warped polygons under
    perspective, rotation and shear, flips, channel swap, freeze,
    fraction, cosine decay, a time budget), two ranks with two loader
    workers each, stopped by the preemption path inside epoch 2.

    The budget, on the test clock (each step 10 s): epoch 1 takes 20 s, so
    the plan becomes ceil(72 / 20) = 4 epochs (from --epochs 3), which
    moves close_mosaic across batches the workers already prepared (a new
    loader), and the budget ends epoch 4 after its first step (70 s: one
    more step would overrun it)."""
    from conftest import max_abs_diff

    from hpcyolo_trainer.run import checkpoint as ckpt
    from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE
    from hpcyolo_trainer.run.stop import STEP_SECONDS_ENV

    from test_copy_paste import as_outlines

    # 64 px: what is compared (the state and results.csv, bit for bit) and the steps the plan counts do not
    # depend on the size; each of the three two-rank launches trains and validates at a sixth of 160 px's cost.
    outlined = make_shapes(tmp_path / "outlined", n_train=8, n_val=8, imgsz=64, classes=4, seed=2)
    as_outlines(outlined)

    def argv(run: Path) -> list[str]:
        return [HPCYOLO, "train", "--run-dir", str(run), "--data", str(outlined), "--epochs", "3", "--batch", "4",
                "--nbs", "4", "--imgsz", "64", "--weights", str(V8), "--workers", "2", "--close-mosaic", "1",
                "--mixup", "0.5", "--perspective", "0.0005", "--flipud", "0.3", "--bgr", "0.2", "--degrees", "5",
                "--shear", "2", "--freeze", "5", "--fraction", "0.75", "--cos-lr", "--cutmix", "0.3",
                "--copy-paste", "0.5", "--copy-paste-mode", "mixup", "--time", "0.02"]

    from test_multiscale_rect import launch_within  # a hang fails the test instead of holding CI

    env = {k: v for k, v in os.environ.items() if k != DRILL_ENV} | {"OMP_NUM_THREADS": "1", STEP_SECONDS_ENV: "10"}
    assert launch_within(argv(tmp_path / "a"), 2, env) == 0
    out = capfd.readouterr().out
    assert "nothing is pasted" not in out  # the outlines were read: Copy-Paste is on
    assert "time budget: 0.02 h less the final validation is spent at epoch 4, batch 1" in out
    assert launch_within(argv(tmp_path / "b"), 2, {**env, DRILL_ENV: "3"}) == EXIT_CODE
    assert ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)["global_step"] == 3
    capfd.readouterr()
    assert launch_within(argv(tmp_path / "b"), 2, env) == 0
    assert "resumed from" in capfd.readouterr().out
    a = ckpt.load_latest(tmp_path / "a" / "checkpoints", warn=print)
    b = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert a["epoch"] == b["epoch"] == a["epochs"] == b["epochs"] == 4 and a["global_step"] == b["global_step"] == 7
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part
    rows = [[(cells := line.split(","))[:1] + cells[2:15] for line in (run / "results.csv").read_text().splitlines()]
            for run in (tmp_path / "a", tmp_path / "b")]  # epoch and the losses to lr/pg2: not the timing (time second)
    assert rows[0] == rows[1] and len(rows[0]) == 5


def test_classes_trains_and_validates_on_those_classes_boxes_only(tmp_path, shapes):
    """classes 0,2 (ultralytics' filter): the other classes' boxes leave
    training and validation, every image stays, the model keeps the data
    YAML's four classes; a mosaic batch holds boxes of 0 and 2 only; an id
    the data does not have is one line naming the setting."""
    import subprocess

    import numpy as np
    import yaml

    from hpcyolo_trainer.data.dataset import collate
    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.common.errors import HpcyoloError
    from hpcyolo_trainer.data.sampler import EpochBatch
    from hpcyolo_trainer.run.inputs import load_data

    d = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    full = load_data(TrainConfig(run_dir=str(tmp_path / "r"), data=str(shapes), batch=4, imgsz=160), d)
    only = load_data(TrainConfig(run_dir=str(tmp_path / "r"), data=str(shapes), batch=4, imgsz=160, classes=(0, 2)), d)
    assert only.nc == full.nc == 4 and len(only.train_set) == len(full.train_set) == 8
    for a, b in ((full.train_set, only.train_set), (full.val_batches, only.val_batches)):
        assert len(a.labels) == len(b.labels)
        for la, lb in zip(a.labels, b.labels):
            assert np.array_equal(la[np.isin(la[:, 0], [0, 2])], lb)
        assert sum(map(len, b.labels)) < sum(map(len, a.labels))  # some boxes of classes 1 and 3 were there
    _, targets, _, _ = collate(only.train_set.__getitems__(EpochBatch(range(8), epoch=0, mosaic=True)))
    assert len(targets) and set(targets[:, 1].tolist()) <= {0.0, 2.0}
    with pytest.raises(HpcyoloError, match=r"^classes \(train.classes, --classes\): \[7\] not among the 4 classes"):
        load_data(TrainConfig(run_dir=str(tmp_path / "r"), data=str(shapes), batch=4, imgsz=160, classes=(0, 7)), d)

    argv = [HPCYOLO, "train", "--run-dir", str(tmp_path / "run"), "--data", str(shapes), "--epochs", "1", "--batch",
            "4", "--nbs", "4", "--imgsz", "64", "--weights", str(V8), "--workers", "0"]  # 64 px: what it asserts
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # (classes, images, settings, the same-run rule) is size-free
    bad = subprocess.run(argv + ["--classes", "0,x"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and not (tmp_path / "run").exists()
    assert bad.stderr.strip().splitlines() == ["hpcyolo: error: --classes: must be class ids separated by commas "
                                               "(0,2), got '0,x'"]
    r = subprocess.run(argv + ["--classes", "0,2"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "on 8 images (4 classes)" in r.stdout
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["classes"] == [0, 2]
    # The same run again, with the same classes, continues it; other classes are another run.
    again = subprocess.run(argv + ["--classes", "0,2", "--epochs", "2"], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "resumed from" in again.stdout, again.stderr
    other = subprocess.run(argv + ["--classes", "1"], capture_output=True, text=True, env=env)
    assert other.returncode != 0 and "classes" in other.stderr
