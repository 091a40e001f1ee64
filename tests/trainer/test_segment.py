"""Segmentation against ultralytics and across ranks: `hpcyolo val` of
ultralytics' own yolo11n-seg, trained on a shapes set by
benchmarks/ultralytics_reference.py (tests/reference/ultralytics/trained),
gives ultralytics' box and mask figures on that set's val split, with one
rank and two; a segment run stopped by a real signal on two ranks with two
loader workers each resumes bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import max_abs_diff
from test_yolo26_train import argv, env, hold_then_signal

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import launch
from hpcyolo_trainer.common.preemption import EXIT_CODE
from hpcyolo_trainer.run import checkpoint as ckpt

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
TRAINED = Path(__file__).resolve().parent.parent / "reference" / "ultralytics" / "trained" / "yolo11n-seg"
# The set the reference model was trained and validated on (its val.json says so): the same seed writes the same files.
DATA = "hpcyolo make-dataset shapes DIR --task segment --train 240 --val 40 --seed 3"


@pytest.fixture(scope="module")
def reference_set(tmp_path_factory) -> Path:
    reference = json.loads((TRAINED / "val.json").read_text())
    assert reference["data"] == DATA and reference["ultralytics"] == "8.4.190"
    return make_shapes(tmp_path_factory.mktemp("seg") / "shapes", n_train=240, n_val=40, imgsz=160, task="segment",
                       seed=3)


def test_val_of_ultralytics_segmenter_gives_its_box_and_mask_figures_on_one_rank_and_two(reference_set, capfd):
    reference = json.loads((TRAINED / "val.json").read_text())
    args = [HPCYOLO, "val", str(TRAINED / "model.pt"), "--data", str(reference_set), "--imgsz", "160", "--batch",
            "16", "--json"]
    r = subprocess.run(args, capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    gaps = {}
    for kind, figures in (("box", ours), ("mask", ours["masks"])):
        for key in ("precision", "recall", "map50", "map50_95"):
            gaps[f"{kind} {key}"] = (round(figures[key], 4), round(reference[kind][key], 4))
    print(gaps)
    assert all(abs(a - b) <= 0.005 for a, b in gaps.values()), gaps
    assert reference["mask"]["map50"] > 0.1  # a model that finds objects: the comparison means something
    capfd.readouterr()
    assert launch(args, 2, env=env()) == 0
    out = capfd.readouterr().out.strip().splitlines()
    assert len(out) == 1 and json.loads(out[0]) == ours


def test_a_segment_run_stopped_by_a_signal_on_two_ranks_resumes_bit_identical(tmp_path, capfd):
    """16 images, 2 ranks x 2: 4 steps an epoch; held after step 5 (epoch 2),
    stopped by SIGUSR2, resumed; two loader workers a rank; mosaic, a rotating
    warp and copy-paste move the polygons."""
    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=4, imgsz=64, task="segment", seed=1)
    args = ["--task", "segment", "--model", "yolo11n", "--epochs", "3", "--close-mosaic", "1", "--workers", "2",
            "--degrees", "10", "--copy-paste", "0.5"]
    assert launch(argv(tmp_path / "a", data, *args), 2, env=env()) == 0
    code, out = hold_then_signal(argv(tmp_path / "b", data, *args), 5)
    assert code == EXIT_CODE, out
    assert "stopping for preemption (SIGUSR2) at epoch 2, batch 1" in out
    capfd.readouterr()
    assert launch(argv(tmp_path / "b", data, *args), 2, env=env()) == 0
    assert "resumed from" in capfd.readouterr().out
    a = ckpt.load_latest(tmp_path / "a" / "checkpoints", warn=print)
    b = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert a["global_step"] == b["global_step"] == 12
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part

    def measured(run: Path) -> list[list[str]]:
        rows = (run / "results.csv").read_text().splitlines()
        return [row.split(",")[:13] for row in rows]  # epoch, 4 losses, box and mask figures: not lr or timing

    rows = measured(tmp_path / "a")
    assert rows == measured(tmp_path / "b") and len(rows) == 4
    assert rows[0][1:5] == ["train/box_loss", "train/seg_loss", "train/cls_loss", "train/dfl_loss"]
    assert rows[0][9:13] == ["metrics/precision(M)", "metrics/recall(M)", "metrics/mAP50(M)", "metrics/mAP50-95(M)"]
