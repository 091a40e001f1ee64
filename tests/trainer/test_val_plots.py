"""The plots ultralytics users read, by ultralytics' names: the confusion
matrix and the P, R, F1 and PR curves of a validation (checked against the
metrics they come from), and `hpcyolo val --plots`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import SHARED
from PIL import Image

from hpcyolo_trainer.eval.metrics import ConfusionMatrix, DetStats, curves

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
FIXTURE = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes"
VAL_PLOTS = ("confusion_matrix.png", "confusion_matrix_normalized.png", "BoxPR_curve.png", "BoxF1_curve.png",
             "BoxP_curve.png", "BoxR_curve.png")


def test_the_confusion_matrix_counts_as_ultralytics_matrix_does():
    m = ConfusionMatrix(nc=2)
    gt = torch.tensor([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]], dtype=torch.float32)
    gt_cls = torch.tensor([0, 1, 0])
    pred = torch.tensor([[0, 0, 10, 10, 0.9, 0],  # object 0, right class
                         [1, 1, 10, 10, 0.8, 1],  # object 0 again: a detection of nothing (each object once)
                         [20, 20, 30, 31, 0.7, 0],  # object 1 (class 1) taken for class 0
                         [60, 60, 70, 70, 0.6, 1],  # nothing there
                         [40, 40, 50, 50, 0.2, 0]])  # below conf 0.25: ignored, so object 2 is missed
    m.update(pred, gt, gt_cls)
    # rows predicted (0, 1, background), columns true (0, 1, background)
    np.testing.assert_array_equal(m.matrix, [[1, 1, 0], [0, 0, 2], [1, 0, 0]])
    m.update(torch.zeros((0, 6)), gt[:1], gt_cls[:1])  # an image without detections: its object missed
    m.update(pred[:1], torch.zeros((0, 4)), torch.zeros(0))  # one without objects: a detection of nothing
    np.testing.assert_array_equal(m.matrix, [[1, 1, 1], [0, 0, 2], [2, 0, 0]])


def test_the_curves_at_their_points():
    # One class, 2 objects; predictions at confidence 0.9 (hit), 0.6 (miss), 0.3 (hit).
    state = {"tp": np.array([[1], [0], [1]], bool), "conf": np.array([0.9, 0.6, 0.3], np.float32),
             "pred_cls": np.zeros(3, np.int32), "target_cls": np.zeros(2, np.int32)}
    c = curves(state, 1)
    at = {round(float(x), 3): k for k, x in enumerate(c["x"])}
    k = at[round(float(c["x"][np.abs(c["x"] - 0.6).argmin()]), 3)]
    assert c["recall"][0, 0] == 1.0 and c["precision"][0, 0] == 2 / 3  # at confidence 0: every prediction
    assert abs(c["recall"][0, k] - 0.5) < 0.01 and abs(c["precision"][0, k] - 0.5) < 0.01  # at 0.6
    assert c["recall"][0, -1] == 0.0  # above every prediction: nothing found
    assert c["pr"][0, 0] == 1.0 and abs(c["pr"][0, 750] - 2 / 3) < 1e-9  # the envelope at recall 0.75


def test_a_model_that_finds_nothing_still_gets_its_plots(tmp_path):
    from hpcyolo_trainer.report.plots import write_val_plots

    state = DetStats().state()  # no predictions at all
    state["target_cls"] = np.array([0, 1, 1], np.int32)
    c = curves(state, 2)
    assert c["present"].tolist() == [True, True] and not c["precision"].any() and not c["recall"].any()
    m = ConfusionMatrix(2)
    m.update(torch.zeros((0, 6)), torch.tensor([[0, 0, 5, 5], [5, 5, 9, 9]]).float(), torch.tensor([0, 1]))
    written = write_val_plots({"confusion": m.matrix, "curves": c, "map50": 0.0}, ["a", "b"], tmp_path)
    assert [p.name for p in written] == list(VAL_PLOTS) and all(p.stat().st_size > 1000 for p in written)


def test_the_plots_agree_with_the_metrics_and_hpcyolo_val_writes_them(tmp_path):
    """Ultralytics' yolov8n fixture on its shapes set: the confusion matrix
    counts every object once, the PR curve's area is the mAP50, the F1
    curve's peak is the mean F1 where P and R are reported."""
    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.eval.evaluate import ValBatches, validate
    from hpcyolo_trainer.model.weights import build_from, read_weights

    w = read_weights(FIXTURE / "model.pt")
    model = build_from(w)
    files = sorted((FIXTURE / "images" / "val").iterdir()) if (FIXTURE / "images" / "val").is_dir() else None
    if files is None:
        from hpcyolo_trainer.data.dataset import load_data_spec

        files = load_data_spec(str(FIXTURE / "data.yaml")).val
    batches = ValBatches(files, w.nc, 160, 16)
    s = validate(Dist(0, 0, 1, torch.device("cpu")), model, batches, plots=True)
    instances = sum(len(np.asarray(lb).reshape(-1, 5)) for lb in batches.labels)
    m = s["confusion"]
    assert m[:, :w.nc].sum() == instances == sum(s["per_class_instances"])
    assert (m[:w.nc, :w.nc].argmax(0) == np.arange(w.nc)).all()  # a trained model: each class mostly itself
    c = s["curves"]
    mean_pr = c["pr"][c["present"]].mean(0)
    area = float(((mean_pr[1:] + mean_pr[:-1]) / 2 * np.diff(c["x"])).sum())
    assert abs(area - s["map50"]) < 0.01, (area, s["map50"])
    p, r = np.array(s["per_class_precision"]), np.array(s["per_class_recall"])  # at the max-mean-F1 confidence
    best = float(np.mean(2 * p * r / (p + r)))
    assert abs(c["f1"][c["present"]].mean(0).max() - best) < 0.02, best  # the curve's peak, on its grid

    out = tmp_path / "plots"
    r = subprocess.run([HPCYOLO, "val", str(FIXTURE / "model.pt"), "--data", str(FIXTURE / "data.yaml"),
                        "--imgsz", "160", "--plots", str(out), "--json"], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["map50"] > 0.5 and f"plots in {out}" in r.stderr
    for name in [*VAL_PLOTS, "val_batch0_labels.jpg", "val_batch0_pred.jpg"]:
        with Image.open(out / name) as im:
            im.verify()
            assert min(im.size) >= 300, name


def test_a_segmenters_val_batch_pred_shows_the_masks_of_the_predictions_drawn(tmp_path):
    """val_batchN_pred.jpg of a segmentation: each prediction above 0.25
    confidence with its mask blended in (masks at a quarter of the canvas, as
    validation makes them); a prediction below it neither boxed nor masked."""
    from hpcyolo_trainer.eval.evaluate import batch_drawer

    imgs = torch.full((1, 3, 64, 64), 128, dtype=torch.uint8)
    det = torch.tensor([[4.0, 4.0, 60.0, 60.0, 0.9, 0.0], [4.0, 4.0, 60.0, 60.0, 0.1, 1.0]])
    masks = torch.zeros(2, 16, 16, dtype=torch.bool)
    masks[0, 4:8, 4:8] = True  # pixels 16..31 of the canvas: the sure prediction's
    masks[1, 10:14, 10:14] = True  # pixels 40..55: the unsure one's, not drawn
    meta = ((0, 0), np.zeros((0, 5), np.float32), (64, 64), torch.zeros((0, 16, 16)))
    draw = batch_drawer(["a", "b"], tmp_path, batches=1)
    draw(imgs, [meta], [(det, masks)])
    with Image.open(tmp_path / "val_batch0_pred.jpg") as im:
        px = np.asarray(im.convert("RGB")).astype(int)
    scale = px.shape[0] / 64
    at = lambda y, x: px[int(y * scale), int(x * scale)]  # noqa: E731
    assert np.abs(at(24, 24) - 128).max() > 30  # inside the sure mask: tinted
    assert np.abs(at(48, 48) - 128).max() < 12 and np.abs(at(36, 20) - 128).max() < 12  # elsewhere: grey
