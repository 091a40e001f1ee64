"""Training YOLO26: fine-tuning ultralytics' own YOLO26n checkpoint to other
classes (both heads' class branches new), and a two-rank MuSGD run stopped
by a real signal in its second epoch (after ProgLoss moved its weights) that
resumes bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHARED, max_abs_diff

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.run import checkpoint as ckpt
from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE, HOLD_ENV
from hpcyolo_trainer.model.weights import read_weights

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
Y26 = SHARED / "fixtures" / "ultralytics" / "yolo26n-shapes" / "model.pt"
LAUNCH = "import json, sys; from hpcyolo.node.local import launch; sys.exit(launch(json.loads(sys.argv[1]), 2))"
pytestmark = pytest.mark.skipif(not Y26.is_file(), reason=f"no reference fixture {Y26}")


@pytest.fixture(scope="module")
def shapes3(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("d3") / "shapes", n_train=16, n_val=4, imgsz=64, classes=3, seed=7)


def argv(run: Path, data: Path, *extra: str) -> list[str]:
    return [HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--batch", "4", "--nbs", "4",
            "--imgsz", "64", *extra]


def env(**extra: str) -> dict:
    return {**{k: v for k, v in os.environ.items() if k not in (DRILL_ENV, HOLD_ENV)}, "OMP_NUM_THREADS": "1",
            **extra}


def test_ultralytics_yolo26n_fine_tunes_to_other_classes_with_both_class_branches_new(tmp_path, shapes3):
    # lr0 0: nothing moves, so last.pt shows what the run started from.
    r = subprocess.run(argv(tmp_path / "run", shapes3, "--weights", str(Y26), "--optimizer", "sgd", "--lr0", "0",
                            "--epochs", "1", "--workers", "0", "--warmup-epochs", "0"), capture_output=True, text=True,
                       env=env())
    assert r.returncode == 0, r.stderr
    assert "from model.pt (ultralytics yolo26n, 4 classes); class convs new for 3 classes" in r.stdout
    assert "training yolo26n on 16 images (3 classes)" in r.stdout
    epoch_line = next(line for line in r.stdout.splitlines() if line.startswith("epoch 1/1: loss"))
    assert " l1 " in epoch_line  # the epoch line names YOLO26's third loss term
    assert (tmp_path / "run" / "results.csv").read_text().startswith("epoch,time,train/box_loss,train/cls_loss,"
                                                                     "train/l1_loss,")
    saved = torch.load(tmp_path / "run" / "weights" / "last.pt", weights_only=True)["model"]
    source = read_weights(Y26).state
    new = [f"head.{branch}.{i}.2.{p}" for branch in ("cls", "one2one_cls") for i in range(3) for p in ("weight",
                                                                                                       "bias")]
    for key in new:
        assert saved[key].shape[0] == 3, key
    kept = [k for k in source if k.endswith(".weight") and source[k].dim() == 4 and k not in new]
    assert kept and max((saved[k] - source[k].float()).abs().max().item() for k in kept) < 1e-5


def test_end2end_validates_each_epoch_as_hpcyolo_val_end2end_measures(tmp_path):
    """train.end2end: each epoch's row is the one-to-one head's NMS-free
    measure, the figure `hpcyolo val --end2end` gives for last.pt, not the default one."""
    data = make_shapes(tmp_path / "shapes", n_train=8, n_val=8, imgsz=160, classes=4, seed=3)
    common = ["--weights", str(Y26), "--optimizer", "sgd", "--lr0", "0", "--epochs", "1", "--workers", "0", "--batch",
              "4", "--imgsz", "160", "--close-mosaic", "1"]
    r = subprocess.run([*argv(tmp_path / "run", data), *common, "--end2end"], capture_output=True, text=True,
                       env=env())
    assert r.returncode == 0, r.stderr
    header, row = (line.split(",") for line in (tmp_path / "run" / "results.csv").read_text().splitlines()[:2])
    row = dict(zip(header, row))

    def val(*extra: str) -> dict:
        out = subprocess.run([HPCYOLO, "val", str(tmp_path / "run" / "weights" / "last.pt"), "--data", str(data),
                              "--imgsz", "160", "--batch", "8", "--json", *extra], capture_output=True, text=True,
                             env=env())
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    e2e, default = val("--end2end"), val()
    assert float(row["metrics/mAP50-95(B)"]) == pytest.approx(e2e["map50_95"], abs=1e-5)
    assert float(row["metrics/mAP50(B)"]) == pytest.approx(e2e["map50"], abs=1e-5)
    assert e2e["map50_95"] > 0.1 and abs(e2e["map50_95"] - default["map50_95"]) > 1e-3


def test_end2end_for_a_model_without_a_one_to_one_head_is_one_line_before_anything_is_written(tmp_path, shapes3):
    r = subprocess.run([*argv(tmp_path / "run", shapes3), "--model", "yolov8n", "--end2end"], capture_output=True,
                       text=True, env=env())
    assert r.returncode == 1 and not (tmp_path / "run").exists()
    assert r.stderr.strip().splitlines() == ["hpcyolo: error: end2end (--end2end, train.end2end): yolov8n has no "
                                             "one-to-one head; NMS-free validation is for YOLO26"]


def hold_then_signal(args: list[str], step: int) -> tuple[int, str]:
    """Two ranks that hold after optimizer step `step` until a signal comes;
    then SIGUSR2 (the site's preemption signal) to the launcher, which passes
    it on to the ranks as srun does. Returns (exit code, output)."""
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(args)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env(**{HOLD_ENV: str(step)}),
                         start_new_session=True)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if f"holding after step {step}" in line:
                p.send_signal(signal.SIGUSR2)
                break
        lines.append(p.communicate(timeout=300)[0])
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, "".join(lines)


def test_a_musgd_run_stopped_by_a_signal_resumes_bit_identical(tmp_path, shapes3, capfd):
    """16 images, 2 ranks x 2: 4 steps an epoch; held after step 5 (epoch 2,
    whose ProgLoss weights differ from epoch 1's), stopped by SIGUSR2, then
    resumed; two loader workers a rank, as users run."""
    args = ["--model", "yolo26n", "--optimizer", "musgd", "--epochs", "3", "--close-mosaic", "1", "--workers", "2"]
    assert launch(argv(tmp_path / "a", shapes3, *args), 2, env=env()) == 0
    code, out = hold_then_signal(argv(tmp_path / "b", shapes3, *args), 5)
    assert code == EXIT_CODE, out
    assert "stopping for preemption (SIGUSR2) at epoch 2, batch 1" in out
    stopped = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert (stopped["epoch"], stopped["batch"], stopped["global_step"]) == (1, 1, 5)
    capfd.readouterr()
    assert launch(argv(tmp_path / "b", shapes3, *args), 2, env=env()) == 0
    assert "resumed from" in capfd.readouterr().out
    a = ckpt.load_latest(tmp_path / "a" / "checkpoints", warn=print)
    b = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert a["global_step"] == b["global_step"] == 12 and a["arch"] == "yolo26n"
    assert "momentum_buffer_SGD" in str(a["optimizer"]["state"][0].keys())  # MuSGD's state, resumed too
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part

    def measured(run: Path) -> list[list[str]]:
        rows = (run / "results.csv").read_text().splitlines()
        # epoch, the losses, P, R, mAPs, val losses, lrs: not the timing (time second)
        return [(cells := row.split(","))[:1] + cells[2:15] for row in rows]

    assert measured(tmp_path / "a") == measured(tmp_path / "b") and len(measured(tmp_path / "a")) == 4
