"""Classification end to end: a yolo11n classifier trained on two ranks
(gloo, two loader workers each) on a shapes set of class folders, once
through and once stopped by a real signal and resumed, bit-identical;
results.csv with ultralytics' classify columns; `hpcyolo val`, `predict`
and `export` of its weights, each against another path (the last epoch's
row, the validation's top-1, torch); the task and the dataset's layout refused in one line where they
do not go together. The two runs are shared by the tests (module scope).
Against ultralytics (tests/reference/ultralytics/trained/yolo11n-cls and
yolo26n-cls, made by benchmarks/ultralytics_reference.py classify): the
validation transform's bytes, each classifier's top-1, top-5 and val/loss
through `hpcyolo val` on one rank and two, its top-5 predictions, and
yolo11n-cls's weights fine-tuned to other classes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import max_abs_diff
from test_yolo26_train import HPCYOLO, LAUNCH, argv, env, hold_then_signal

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.common.preemption import EXIT_CODE
from hpcyolo_trainer.run import checkpoint as ckpt

# 16 images, 2 ranks x 2: 4 steps an epoch; the stop after step 5, in epoch 2 (the last).
ARGS = ["--task", "classify", "--model", "yolo11n", "--epochs", "2", "--workers", "2", "--flipud", "0.3"]
# ultralytics' classify columns in its order (time second), then hpcyolo's speed columns
COLUMNS = ["epoch", "time", "train/loss", "metrics/accuracy_top1", "metrics/accuracy_top5", "val/loss", "lr/pg0",
           "lr/pg1", "lr/pg2", "speed/images_per_s", "speed/data_wait", "speed/gpu_mem_GiB"]
TOP1, TOP5 = COLUMNS.index("metrics/accuracy_top1"), COLUMNS.index("metrics/accuracy_top5")


def two_ranks(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LAUNCH, json.dumps(args)], capture_output=True, text=True, env=env())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """{data, a: the uninterrupted run, b: the stopped and resumed one, its images from the shared image cache
    (`cache`: its folder), stopped and resumed: b's outputs}."""
    tmp = tmp_path_factory.mktemp("classify")
    data = make_shapes(tmp / "shapes", n_train=16, n_val=8, imgsz=64, classes=3, seed=1, task="classify")
    a = two_ranks(argv(tmp / "a", data, *ARGS))
    assert a.returncode == 0, a.stdout + a.stderr
    cached = [*ARGS, "--cache", "disk", "--cache-dir", str(tmp / "cache")]
    code, stopped = hold_then_signal(argv(tmp / "b", data, *cached), 5)
    assert code == EXIT_CODE, stopped
    b = two_ranks(argv(tmp / "b", data, *cached))
    assert b.returncode == 0, b.stdout + b.stderr
    return {"data": data, "a": tmp / "a", "b": tmp / "b", "stopped": stopped, "resumed": b.stdout, "out": a.stdout,
            "cache": tmp / "cache"}


def rows(run: Path) -> list[list[str]]:
    return [row.split(",") for row in (run / "results.csv").read_text().splitlines()]


def test_a_classify_run_stopped_by_a_signal_on_two_ranks_resumes_bit_identical(runs):
    assert "stopping for preemption (SIGUSR2) at epoch 2, batch 1" in runs["stopped"]
    assert "resumed from" in runs["resumed"]
    a = ckpt.load_latest(runs["a"] / "checkpoints", warn=print)
    b = ckpt.load_latest(runs["b"] / "checkpoints", warn=print)
    assert a["global_step"] == b["global_step"] == 8
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part
    def measured(run):  # epoch, loss, top1, top5, val loss, lrs: the timing columns (time second) differ between runs
        return [row[:1] + row[2:9] for row in rows(run)]

    assert measured(runs["a"]) == measured(runs["b"]) and len(measured(runs["a"])) == 3


def test_the_image_cache_is_built_once_and_trains_as_the_files_do(runs):
    """Run b read its training images from one cache for both ranks and
    their loader workers (and the resumed job used it again); run a decoded
    the files: the two are bit-identical (the test above)."""
    caches = [p for p in runs["cache"].rglob("imgcache-*") if p.is_dir()]
    assert len(caches) == 1 and (caches[0] / "images.u8").stat().st_size > 0, list(runs["cache"].rglob("*"))
    assert "no image cache" not in runs["stopped"] + runs["resumed"]


def test_results_csv_has_ultralytics_classify_columns_and_the_run_its_plots(runs):
    table = rows(runs["a"])
    assert table[0] == COLUMNS
    for row in table[1:]:
        loss, top1, top5, val_loss = map(float, row[2:6])
        assert loss > 0 and val_loss > 0 and 0 <= top1 <= top5 == 1.0  # 3 classes: the top 5 holds them all
    assert "epoch 2/2: loss" in runs["out"] and " top1 " in runs["out"] and "top1_acc" in runs["out"]
    made = {p.name for p in runs["a"].iterdir()}
    assert {"confusion_matrix.png", "confusion_matrix_normalized.png", "train_batch0.jpg", "val_batch0_labels.jpg",
            "val_batch0_pred.jpg", "results.png"} <= made
    assert "labels.jpg" not in made  # ultralytics draws no labels of a classification set
    saved = torch.load(runs["a"] / "weights" / "last.pt", weights_only=True)
    assert saved["task"] == "classify" and saved["names"] == ["circle", "square", "triangle"]


def test_compare_ranks_classifiers_by_top1_and_top5(runs, tmp_path):
    from PIL import Image

    from hpcyolo.login.compare import find_runs, plot, ranking, text_table

    found = find_runs([runs["a"], runs["b"]])
    table = ranking(found)
    for row in table:
        # the last of equals, as best.pt
        best = max(rows(runs[row["run"]])[1:][::-1], key=lambda r: (float(r[TOP1]) + float(r[TOP5])) / 2)
        assert (f"{row['top1']:.5f}", f"{row['top5']:.5f}") == (best[TOP1], best[TOP5])
        assert row["fitness"] == pytest.approx((row["top1"] + row["top5"]) / 2) and "map50" not in row
    head = text_table(table).splitlines()[0].split()
    assert head[4:6] == ["top1", "top5"] and "mAP50" not in head and "nan" not in text_table(table)
    plot(found, tmp_path / "cmp.png")
    with Image.open(tmp_path / "cmp.png") as im:
        im.verify()


def test_val_of_the_last_weights_gives_the_last_epochs_figures(runs, tmp_path):
    r = subprocess.run([HPCYOLO, "val", str(runs["a"] / "weights" / "last.pt"), "--data", str(runs["data"]),
                        "--imgsz", "64", "--json", "--plots", str(tmp_path)], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    last = dict(zip(COLUMNS, rows(runs["a"])[-1]))
    assert ours["images"] == 8
    assert f"{ours['top1']:.5f}" == last["metrics/accuracy_top1"] and f"{ours['top5']:.5f}" == \
        last["metrics/accuracy_top5"]
    assert {p.name for p in tmp_path.iterdir()} == {"confusion_matrix.png", "confusion_matrix_normalized.png"}
    r = subprocess.run([HPCYOLO, "val", str(runs["a"] / "weights" / "last.pt"), "--data", str(runs["data"]),
                        "--imgsz", "64"], capture_output=True, text=True, env=env())
    assert r.returncode == 0 and f"top1 {ours['top1']:.4f} top5 {ours['top5']:.4f} loss {ours['loss']:.4f} " \
        "(8 images)" in r.stdout
    # The run validated in batches of 4 (twice its batch per rank), two equal halves of the 8: the same mean.
    assert ours["loss"] == pytest.approx(float(last["val/loss"]), abs=2e-5)


def test_predict_gives_each_images_five_classes_and_agrees_with_val(runs, tmp_path):
    weights, val = runs["a"] / "weights" / "last.pt", runs["data"] / "val"
    r = subprocess.run([HPCYOLO, "predict", str(weights), str(val), "--imgsz", "64", "--out", str(tmp_path),
                        "--format", "json"], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert len(predictions) == 8
    hits = 0
    for p in predictions:
        confidences = [t["confidence"] for t in p["top5"]]
        assert len(confidences) == 3 and confidences == sorted(confidences, reverse=True)
        assert sum(confidences) == pytest.approx(1.0, abs=1e-4)
        hits += p["top5"][0]["name"] == Path(p["image"]).parent.name
    top1 = float(dict(zip(COLUMNS, rows(runs["a"])[-1]))["metrics/accuracy_top1"])
    assert hits / 8 == pytest.approx(top1)  # predict's path and the validation's measure the same
    r = subprocess.run([HPCYOLO, "predict", str(weights), predictions[0]["image"], "--imgsz", "64", "--out",
                        str(tmp_path / "txt")], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "txt" / "labels" / f"{Path(predictions[0]['image']).stem}.txt").read_text().splitlines()
    assert lines == [f"{t['confidence']:.2f} {t['name']}" for t in predictions[0]["top5"]]


def test_export_writes_softmax_probabilities_of_shape_batch_by_classes(runs, tmp_path):
    from hpcyolo_trainer.eval.export import run_onnx
    from hpcyolo_trainer.model.weights import build_from, read_weights

    out = tmp_path / "m.onnx"
    r = subprocess.run([HPCYOLO, "export", str(runs["a"] / "weights" / "best.pt"), "--imgsz", "64", "--dynamic",
                        "-o", str(out)], capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    x = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    got = run_onnx(str(out), x.numpy())
    model = build_from(read_weights(runs["a"] / "weights" / "best.pt")).eval()
    with torch.no_grad():
        want = model(x).softmax(1).numpy()
    assert got.shape == (3, 3) and np.abs(got.sum(1) - 1).max() < 1e-5
    assert np.abs(got - want).max() < 1e-4


def source_names() -> list[str]:
    from hpcyolo_trainer.model.classify import build_classifier

    return list(build_classifier("yolo11n", 3).state_dict())


def test_ultralytics_weights_fine_tune_to_other_classes_with_a_new_linear_layer(runs, tmp_path):
    """Ultralytics' yolo11n-cls of 6 classes (tests/reference; read by the
    restricted unpickler, its recorded torchvision transforms inert) onto the
    3 classes of the runs' set: everything but the linear layer kept (lr0 0:
    nothing moves, so last.pt shows what the run started from)."""
    from hpcyolo_trainer.model.weights import read_weights

    weights = str(TRAINED / "model.pt")
    r = subprocess.run(argv(tmp_path / "run", runs["data"], "--task", "classify", "--weights", weights,
                            "--epochs", "1", "--workers", "0", "--optimizer", "sgd", "--lr0", "0",
                            "--warmup-epochs", "0", "--freeze", "10"), capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    assert "from model.pt (ultralytics yolo11n, 6 classes); class convs new for 3 classes" in r.stdout
    # ultralytics' layers 0-9 of yolo11n-cls: the body, all but the head
    body = sum(1 for k in source_names() if k.startswith("body.") and not k.endswith(("running_mean", "running_var",
                                                                                       "num_batches_tracked")))
    assert f"freeze: layers 0-9 ({body} tensors) stay as they are" in r.stdout
    assert "training yolo11n on 16 images (3 classes)" in r.stdout
    saved = torch.load(tmp_path / "run" / "weights" / "last.pt", weights_only=True)["model"]
    source = read_weights(TRAINED / "model.pt").state
    assert saved["head.linear.weight"].shape == (3, 1280) and source["head.linear.weight"].shape == (6, 1280)
    kept = [k for k in source if k.endswith(".weight") and source[k].dim() == 4]
    assert kept and max((saved[k] - source[k].float()).abs().max().item() for k in kept) < 1e-5


def test_task_and_dataset_layout_that_do_not_go_together_are_one_line(runs, tmp_path, shapes):
    r = subprocess.run(argv(tmp_path / "detect", runs["data"], "--epochs", "1"), capture_output=True, text=True,
                       env=env())
    assert r.returncode != 0 and "a folder of class folders is a classification dataset" in r.stderr
    r = subprocess.run(argv(tmp_path / "cls", shapes, "--task", "classify", "--epochs", "1"), capture_output=True,
                       text=True, env=env())
    assert r.returncode != 0 and "train.task classify takes a dataset folder in ultralytics' layout" in r.stderr
    assert not (tmp_path / "detect").exists() and not (tmp_path / "cls" / "config.yaml").exists()
    broken = shutil.copytree(runs["data"], tmp_path / "broken")
    shutil.rmtree(broken / "val" / "square")
    r = subprocess.run(argv(tmp_path / "broken-run", broken, "--task", "classify"), capture_output=True, text=True,
                       env=env())
    assert r.returncode != 0 and f"{broken / 'val'}: no folder for class 'square'" in r.stderr


# == against ultralytics ==========================================================================================

REFERENCES = Path(__file__).resolve().parent.parent / "reference" / "ultralytics" / "trained"
TRAINED = REFERENCES / "yolo11n-cls"  # and its transforms.npz
CLASSIFIERS = ("yolo11n-cls", "yolo26n-cls")  # trained by ultralytics on REFERENCE_DATA, one per family
# The set ultralytics trained and validated its reference classifier on (its val.json says so).
REFERENCE_DATA = "hpcyolo make-dataset shapes DIR --task classify --train 600 --val 60 --imgsz 64 --classes 6 --seed 7"


@pytest.fixture(scope="module")
def reference_set(tmp_path_factory) -> Path:
    for name in CLASSIFIERS:
        reference = json.loads((REFERENCES / name / "val.json").read_text())
        assert reference["data"] == REFERENCE_DATA and reference["ultralytics"] == "8.4.190"
        assert reference["model"] == name
    return make_shapes(tmp_path_factory.mktemp("cls-ref") / "shapes", n_train=600, n_val=60, imgsz=64, classes=6,
                       seed=7, task="classify")


def test_val_transform_gives_ultralytics_classify_transforms_bytes():
    """Four images (37 x 90, 90 x 37, 64 x 64, 50 x 71) at 32 px (shrunk)
    and 64 px (enlarged): ultralytics' classify_transforms (torchvision's
    Resize, CenterCrop, ToTensor on Pillow) gave these bytes."""
    from hpcyolo_trainer.data.classify import val_transform

    reference = np.load(TRAINED / "transforms.npz")
    for k in range(4):
        for size in (32, 64):
            want = reference[f"output{k}_{size}"]
            got = val_transform(reference[f"input{k}"], size)
            assert got.shape == want.shape == (size, size, 3)
            assert np.array_equal(got, want), (k, size, int(np.abs(got.astype(int) - want).max()))


def test_training_steps_give_torchvisions_bytes_at_the_same_parameters():
    """What classify_augmentations draws, applied at given parameters: the
    resized crop (shrunk and enlarged) and each colour-jitter operation at
    two factors give the bytes torchvision's functional API gave there."""
    from hpcyolo_trainer.data.classify import adjust, resized_crop

    reference = np.load(TRAINED / "transforms.npz")
    img = reference["input0"]
    for name, box in (("shrunk", (3, 10, 30, 60, 32)), ("enlarged", (5, 7, 20, 24, 64))):
        assert np.array_equal(resized_crop(img, *box), reference[f"crop_{name}"]), name
    jitter = [key for key in reference.files if key.split("_")[0] in ("brightness", "contrast", "saturation", "hue")]
    assert len(jitter) == 8
    for key in jitter:
        op, factor = key.split("_")
        got, want = adjust(img, op, float(factor)), reference[key]
        assert not np.array_equal(want, img) and np.array_equal(got, want), (key, int(np.abs(got.astype(int) - want).max()))


def test_randaugment_operations_give_torchvisions_bytes():
    """Each of RandAugment's 14 operations (ultralytics' default auto_augment)
    at its magnitude (bin 9 of 31), both signs where signed, on a 64 x 64
    image: the magnitude and the bytes torchvision's RandAugment gave."""
    from hpcyolo_trainer.data.classify import RAND_OPS, rand_magnitude, rand_op

    reference = np.load(TRAINED / "transforms.npz")
    img = reference["output0_64"]
    for op in RAND_OPS:
        magnitude, signed = rand_magnitude(op, 64, 64)
        assert magnitude == float(reference[f"rand_{op}_magnitude"]), op
        for sign in (1.0, -1.0) if signed else (1.0,):
            want = reference[f"rand_{op}_{sign:+.0f}"]
            assert np.array_equal(rand_op(img, op, sign * magnitude), want), (op, sign)
            # each acts, but the identity, posterize at 7 bits and autocontrast of an image spanning 0-255 already
            assert op in ("Identity", "Posterize", "AutoContrast") or not np.array_equal(want, img), (op, sign)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_val_of_ultralytics_classifier_gives_its_top1_top5_and_val_loss_on_one_rank_and_two(name, reference_set,
                                                                                              capfd):
    """Ultralytics' own yolo11n-cls and yolo26n-cls checkpoints (read by the
    restricted unpickler), on the set they were trained on: their top-1 and
    top-5 as its `val` measured them, their loss as its validator logs
    val/loss."""
    reference = json.loads((REFERENCES / name / "val.json").read_text())
    args = [HPCYOLO, "val", str(REFERENCES / name / "model.pt"), "--data", str(reference_set), "--imgsz", "64", "--batch", "16",
            "--json"]
    r = subprocess.run(args, capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    print({key: (ours[key], reference[key]) for key in ("top1", "top5")}, (ours["loss"], reference["val_loss"]))
    assert ours["images"] == reference["images"] == 60
    assert ours["top1"] == pytest.approx(reference["top1"], abs=1e-6)
    assert ours["top5"] == pytest.approx(reference["top5"], abs=1e-6)
    assert ours["loss"] == pytest.approx(reference["val_loss"], rel=1e-4)
    assert reference["top1"] > 0.5  # a classifier that learned the set (chance: 1/6)
    if name != CLASSIFIERS[0]:
        # Two ranks (evaluate.share_batches: every rank a share of the batches, rank 0 merging their stats in batch
        # order) is the task's path, not the model family's: the first model's two-rank launch shows it, the
        # second family's repeated it at a launch's cost.
        return
    capfd.readouterr()
    assert launch(args, 2, env=env()) == 0
    out = capfd.readouterr().out.strip().splitlines()
    assert len(out) == 1 and json.loads(out[0]) == ours


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_predict_gives_ultralytics_top5_and_probabilities(name, reference_set, tmp_path):
    reference = json.loads((REFERENCES / name / "val.json").read_text())["predictions"]
    r = subprocess.run([HPCYOLO, "predict", str(REFERENCES / name / "model.pt"), *(str(reference_set / p["image"])
                        for p in reference), "--imgsz", "64", "--out", str(tmp_path), "--format", "json"],
                       capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads((tmp_path / "predictions.json").read_text())
    assert len(ours) == len(reference) == 4
    for mine, theirs in zip(ours, reference):
        assert [t["class"] for t in mine["top5"]] == theirs["top5"], mine["image"]
        assert [t["confidence"] for t in mine["top5"]] == pytest.approx(theirs["conf"], abs=1e-4)


def test_dropout_is_a_setting_that_reaches_the_classifiers_head(tmp_path):
    """`dropout` from the command line or an ultralytics args.yaml sets the
    head's Dropout, which then acts while training only."""
    import torch

    from hpcyolo_trainer.common.recipe import read_recipe
    from hpcyolo_trainer.model.classify import build_classifier
    from hpcyolo_trainer.run.setup import set_dropout

    recipe = tmp_path / "args.yaml"
    recipe.write_text("dropout: 0.5\nerasing: 0.4\n")
    taken, ignored = read_recipe(recipe)
    assert taken["dropout"] == 0.5 and "dropout" not in ignored
    model = build_classifier("yolo11n", 3)
    set_dropout(model, 0.5)
    assert model.head.drop.p == 0.5
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    model.train()
    assert not torch.equal(model(x), model(x))  # two draws of the mask
    model.eval()
    assert torch.equal(model(x)[0], model(x)[0])


@pytest.mark.parametrize("command", ["val", "predict", "export"])
def test_end2end_with_a_classifier_is_one_line(command, reference_set, tmp_path):
    """--end2end (NMS-free) means nothing to a classifier: val, predict and
    export say so in one line, exit 1, and write nothing."""
    weights = str(REFERENCES / "yolo26n-cls" / "model.pt")
    args = {"val": ["--data", str(reference_set)],
            "predict": [str(next((reference_set / "val").rglob("*.jpg"))), "--out", str(tmp_path / "out")],
            "export": ["-o", str(tmp_path / "out.onnx")]}[command]
    r = subprocess.run([HPCYOLO, command, weights, *args, "--imgsz", "64", "--end2end"], capture_output=True,
                       text=True, env=env())
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [f"hpcyolo: error: {weights}: a classifier has no NMS to leave out; "
                                             "--end2end (NMS-free, ultralytics' nms=False) is for YOLO26 detectors "
                                             "and segmenters"]
    assert not list(tmp_path.iterdir())
