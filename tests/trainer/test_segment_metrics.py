"""Box and mask metrics against ultralytics' own validator: the predictions
benchmarks/ultralytics_reference.py `metric_inputs` draws from a seed (jittered
objects, weaker duplicates, wrong classes, false positives), matched by box
and by mask IoU with ultralytics 8.4's match_predictions and scored by its
ap_per_class; its figures in tests/reference/ultralytics/metrics.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import REPO
from test_task_models import reference_script

from hpcyolo_trainer.data.masks import polygon_mask
from hpcyolo_trainer.eval.metrics import SegStats

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "metrics.json").read_text())


def mask_and_box(hw, polygon):
    mask = polygon_mask(hw, polygon)
    ys, xs = np.nonzero(mask)
    return mask, ([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] if len(xs) else [0, 0, 0, 0])


def test_box_and_mask_metrics_equal_ultralytics():
    script = reference_script()
    stats = SegStats(method="ultralytics")
    for image in script.metric_inputs():
        gt = [mask_and_box(script.MASK_HW, p) for p in image["gt_polygons"]]
        pr = [mask_and_box(script.MASK_HW, p) for p in image["pred_polygons"]]
        h, w = script.MASK_HW
        pred = torch.tensor([[*b, c, k] for (_, b), c, k in zip(pr, image["conf"], image["pred_cls"])],
                            dtype=torch.float32).reshape(-1, 6)
        pred_masks = torch.tensor(np.stack([m for m, _ in pr])) if pr else torch.zeros(0, h, w)
        stats.update(pred, pred_masks, torch.tensor([b for _, b in gt], dtype=torch.float32).reshape(-1, 4),
                     torch.tensor(image["gt_cls"]), torch.tensor(np.stack([m for m, _ in gt])))
    state = SegStats.merge([stats.state()])
    assert state["boxes"]["tp"].astype(int).tolist() == REFERENCE["box"]["tp"]
    assert state["masks"]["tp"].astype(int).tolist() == REFERENCE["mask"]["tp"]
    summary = SegStats.summary(state, 3, method="ultralytics")
    for key in ("map50", "map50_95", "precision", "recall"):
        assert summary[key] == pytest.approx(REFERENCE["box"][key], abs=1e-6), key
        assert summary[f"{key}_mask"] == pytest.approx(REFERENCE["mask"][key], abs=1e-6), key
    assert SegStats.fitness(summary) == pytest.approx(REFERENCE["fitness"], abs=1e-9)
    assert summary["map50_95_mask"] < summary["map50_95"]  # the masks match less well: the two are told apart
