"""Detection metrics against cases small enough to compute by hand.

Notation in the comments: predictions listed by confidence descending, each
TP or FP; P/R the cumulative precision/recall after each one; "env" the
precision envelope (max precision at this or a higher recall). COCO's 101
recall points are r = 0, 0.01, ..., 1; each takes env at the first prediction
whose recall >= r, or 0 when recall never reaches r. AP = mean of the 101.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hpcyolo_trainer.eval.metrics import IOU_THRESHOLDS, DetStats, ap_per_class, match_predictions

BOX = [0.0, 0.0, 10.0, 10.0]  # area 100: a [0,0,10,h] prediction has IoU h/10
FAR = [50.0, 50.0, 60.0, 60.0]  # overlaps nothing above


def preds(*rows) -> torch.Tensor:
    """rows of (box, conf, cls) -> [n,6]."""
    return torch.tensor([[*box, conf, cls] for box, conf, cls in rows], dtype=torch.float32).reshape(-1, 6)


def gts(*rows):
    """rows of (box, cls) -> (boxes [m,4], cls [m])."""
    boxes = torch.tensor([box for box, _ in rows], dtype=torch.float32).reshape(-1, 4)
    return boxes, torch.tensor([cls for _, cls in rows], dtype=torch.int64)


def summarise(images, nc: int) -> dict:
    stats = DetStats()
    for p, (boxes, cls) in images:
        stats.update(p, boxes, cls)
    return DetStats.summary(stats.state(), nc)


def test_iou_thresholds():
    assert IOU_THRESHOLDS.tolist() == pytest.approx([0.5 + 0.05 * i for i in range(10)])


# --------------------------------------------------------------------------- matching


def test_match_shape_dtype_and_empty_inputs():
    p = preds((BOX, 0.9, 0))
    assert match_predictions(p, *gts((BOX, 0))).dtype == torch.bool
    assert match_predictions(p, *gts((BOX, 0))).shape == (1, 10)
    assert match_predictions(preds(), *gts((BOX, 0))).shape == (0, 10)
    assert not match_predictions(p, *gts()).any()  # no GT: every prediction is FP


def test_match_is_greedy_by_iou_not_by_confidence():
    # A: IoU 0.6, conf 0.9; B: IoU 0.9, conf 0.5; one GT. Pairs by IoU: B first,
    # so B takes the GT at every threshold it passes (0.5..0.9, IoU 90/100 is
    # exactly float32(0.9): at the threshold counts) and A is left an FP.
    p = preds(([0, 0, 10, 6], 0.9, 0), ([0, 0, 10, 9], 0.5, 0))
    tp = match_predictions(p, *gts((BOX, 0)))
    assert tp[0].tolist() == [False] * 10
    assert tp[1].tolist() == [True] * 9 + [False]


def test_match_is_one_to_one():
    # Two GTs, an exact hit on each plus a duplicate of the first: 2 TP, 1 FP.
    g = gts((BOX, 0), ([20, 0, 30, 10], 0))
    p = preds((BOX, 0.9, 0), ([20, 0, 30, 10], 0.8, 0), (BOX, 0.7, 0))
    assert match_predictions(p, *g)[:, 0].tolist() == [True, True, False]


def test_match_iou_at_and_around_thresholds():
    g = gts((BOX, 0))
    # IoU 0.6 exactly (60/100): TP at 0.5, 0.55 and 0.6 (>=), FP from 0.65 on.
    assert match_predictions(preds(([0, 0, 10, 6], 0.9, 0)), *g)[0].tolist() == [True] * 3 + [False] * 7
    # IoU 0.64: the same three; 0.75 exactly: 0.5..0.75, six; 0.49: none.
    assert match_predictions(preds(([0, 0, 10, 6.4], 0.9, 0)), *g)[0].sum() == 3
    assert match_predictions(preds(([0, 0, 10, 7.5], 0.9, 0)), *g)[0].sum() == 6
    assert match_predictions(preds(([0, 0, 10, 4.9], 0.9, 0)), *g)[0].sum() == 0


def test_class_mismatch_is_fp():
    assert not match_predictions(preds((BOX, 0.9, 1)), *gts((BOX, 0))).any()


# --------------------------------------------------------------------------- summaries


def test_perfect_predictions():
    images = [
        (preds((BOX, 0.9, 0), ([20, 20, 40, 40], 0.8, 1)), gts((BOX, 0), ([20, 20, 40, 40], 1))),
        (preds(([5, 5, 25, 15], 0.7, 1)), gts(([5, 5, 25, 15], 1))),
    ]
    s = summarise(images, nc=2)
    assert (s["map50"], s["map50_95"], s["precision"], s["recall"]) == (1.0, 1.0, 1.0, 1.0)
    assert s["per_class_ap50"] == [1.0, 1.0]


def test_tp_then_lower_conf_fp():
    # TP(0.9) FP(0.8), 1 GT: P = 1, 1/2; R = 1, 1; env = 1, 1/2. Recall 1 is
    # reached at the first prediction, so all 101 points take env = 1: AP = 1.
    # Max F1: keep conf >= 0.9 -> P 1, R 1 (F1 1) beats conf >= 0.8 (F1 2/3).
    s = summarise([(preds((BOX, 0.9, 0), (FAR, 0.8, 0)), gts((BOX, 0)))], nc=1)
    assert s["map50"] == 1.0 and s["map50_95"] == 1.0
    assert (s["precision"], s["recall"]) == (1.0, 1.0)
    assert s["conf_threshold"] == pytest.approx(0.9)


def test_fp_ranked_above_tp():
    # FP(0.9) TP(0.8), 1 GT: P = 0, 1/2; R = 0, 1; env = 1/2, 1/2.
    # r = 0: first recall >= 0 is the FP, env 1/2; r = 0.01..1: the TP, env 1/2.
    # AP = 101 * 0.5 / 101 = 0.5 (the area under a flat P = 0.5 curve).
    s = summarise([(preds((FAR, 0.9, 0), (BOX, 0.8, 0)), gts((BOX, 0)))], nc=1)
    assert s["map50"] == pytest.approx(0.5) and s["map50_95"] == pytest.approx(0.5)
    assert (s["precision"], s["recall"]) == (pytest.approx(0.5), 1.0)


def test_envelope_and_101_points():
    # TP(0.9) FP(0.8) TP(0.7), 2 GTs: P = 1, 1/2, 2/3; R = 1/2, 1/2, 1;
    # env = 1, 2/3, 2/3. r = 0..0.50 (51 points) -> first prediction, 1;
    # r = 0.51..1 (50 points) -> third, 2/3. AP = (51 + 50 * 2/3) / 101 = 253/303
    # = 0.83498... Max F1: conf >= 0.9: 2/3; >= 0.8: 1/2; >= 0.7: P 2/3, R 1, F1 0.8.
    g = gts((BOX, 0), ([20, 0, 30, 10], 0))
    p = preds((BOX, 0.9, 0), (FAR, 0.8, 0), ([20, 0, 30, 10], 0.7, 0))
    s = summarise([(p, g)], nc=1)
    assert s["map50"] == pytest.approx(253 / 303)
    assert (s["precision"], s["recall"]) == (pytest.approx(2 / 3), 1.0)


def test_iou_0_6_box_map50_95():
    # One GT, one prediction with IoU 0.6: AP 1 at 0.5, 0.55, 0.6 and 0 at the
    # seven thresholds from 0.65: map50 = 1, map50_95 = 3/10.
    s = summarise([(preds(([0, 0, 10, 6], 0.9, 0)), gts((BOX, 0)))], nc=1)
    assert s["map50"] == 1.0
    assert s["map50_95"] == pytest.approx(0.3)


def test_class_mismatch_summary():
    # Right box, wrong class: class 0 has a GT and no TP (AP 0); class 1 has no
    # GT, so its FP is excluded from the means (NaN in the per-class list).
    s = summarise([(preds((BOX, 0.9, 1)), gts((BOX, 0)))], nc=2)
    assert s["map50"] == 0.0 and s["recall"] == 0.0
    assert s["per_class_ap50"][0] == 0.0 and math.isnan(s["per_class_ap50"][1])


def test_missed_gts_lower_recall():
    # TP(0.9), 2 GTs: P = 1, R = 1/2. r = 0..0.50 -> 1 (51 points), r = 0.51..1
    # never reached -> 0. AP = 51/101 = 0.50495...
    s = summarise([(preds((BOX, 0.9, 0)), gts((BOX, 0), ([20, 0, 30, 10], 0)))], nc=1)
    assert s["map50"] == pytest.approx(51 / 101)
    assert (s["precision"], s["recall"]) == (1.0, 0.5)


def test_two_classes_averaged():
    # Class 0: one exact TP, AP 1 at every threshold.
    # Class 1: FP(0.9) above TP(0.8) whose IoU is 0.6: AP 0.5 at 0.5..0.6 (as in
    # test_fp_ranked_above_tp), 0 from 0.65 on (both FP): mean over the ten 0.15.
    # map50 = (1 + 0.5)/2 = 0.75; map50_95 = (1 + 0.15)/2 = 0.575.
    # Max mean F1: conf >= 0.95 or 0.9: (1 + 0)/2; >= 0.8: (1 + 2/3)/2 -> there
    # P = (1 + 0.5)/2 = 0.75, R = (1 + 1)/2 = 1.
    p = preds((BOX, 0.95, 0), (FAR, 0.9, 1), ([20, 0, 30, 6], 0.8, 1))
    s = summarise([(p, gts((BOX, 0), ([20, 0, 30, 10], 1)))], nc=2)
    assert s["per_class_ap50"] == [1.0, pytest.approx(0.5)]
    assert s["map50"] == pytest.approx(0.75)
    assert s["map50_95"] == pytest.approx(0.575)
    assert (s["precision"], s["recall"]) == (pytest.approx(0.75), 1.0)


def test_class_with_gts_but_no_predictions():
    # Class 0 perfect (AP 1), class 1 has a GT and no prediction (AP 0, P 0,
    # R 0), class 2 has neither (excluded): map50 = 0.5, P = R = 0.5.
    s = summarise([(preds((BOX, 0.9, 0)), gts((BOX, 0), ([20, 0, 30, 10], 1)))], nc=3)
    assert s["per_class_ap50"][:2] == [1.0, 0.0] and math.isnan(s["per_class_ap50"][2])
    assert (s["map50"], s["map50_95"], s["precision"], s["recall"]) == (0.5, 0.5, 0.5, 0.5)


def test_nothing_at_all():
    s = DetStats.summary(DetStats().state(), nc=2)
    assert (s["map50"], s["map50_95"], s["precision"], s["recall"]) == (0.0, 0.0, 0.0, 0.0)
    s = summarise([(preds(), gts((BOX, 0)))], nc=1)  # GTs, no predictions at all
    assert (s["map50"], s["recall"]) == (0.0, 0.0)


def test_class_ids_out_of_range_are_rejected():
    with pytest.raises(ValueError, match="target_cls"):
        ap_per_class(np.zeros((0, 10), bool), np.zeros(0), np.zeros(0), np.array([3]), nc=2)


# --------------------------------------------------------------------------- distributed use


def random_images(n: int, nc: int, seed: int = 0):
    """Images with GT boxes and jittered, sometimes misclassified or spurious predictions."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(n):
        m = int(rng.integers(0, 5))
        xy = rng.uniform(0, 80, (m, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(5, 20, (m, 2))], axis=1)
        cls = rng.integers(0, nc, m)
        keep = rng.random(m) < 0.8  # some GTs missed
        pb = boxes[keep] + rng.normal(0, 1.5, (int(keep.sum()), 4))
        pc = np.where(rng.random(int(keep.sum())) < 0.1, (cls[keep] + 1) % nc, cls[keep])
        spurious = rng.uniform(0, 80, (int(rng.integers(0, 3)), 2))
        pb = np.concatenate([pb, np.concatenate([spurious, spurious + 10], axis=1)])
        pc = np.concatenate([pc, rng.integers(0, nc, len(spurious))])
        p = np.concatenate([pb, rng.random((len(pb), 1)), pc[:, None]], axis=1)
        images.append((torch.tensor(p, dtype=torch.float32), (torch.tensor(boxes, dtype=torch.float32), torch.tensor(cls))))
    return images


def test_merging_two_halves_equals_the_whole():
    images, nc = random_images(40, nc=3), 3
    whole, a, b = DetStats(), DetStats(), DetStats()
    for i, (p, (boxes, cls)) in enumerate(images):
        whole.update(p, boxes, cls)
        (a if i % 2 else b).update(p, boxes, cls)  # interleaved, as a sampler shards
    expected = DetStats.summary(whole.state(), nc)
    merged = DetStats.summary(DetStats.merge([a.state(), b.state()]), nc)
    assert 0.0 < expected["map50_95"] < expected["map50"] < 1.0  # a non-trivial case
    for key in ("precision", "recall", "map50", "map50_95", "conf_threshold"):
        assert merged[key] == pytest.approx(expected[key])
    np.testing.assert_allclose(merged["per_class_ap50"], expected["per_class_ap50"])


def test_state_is_plain_numpy():
    stats = DetStats()
    stats.update(preds((BOX, 0.9, 0)), *gts((BOX, 0)))
    state = stats.state()
    assert set(state) == {"tp", "conf", "pred_cls", "target_cls"}
    assert all(isinstance(v, np.ndarray) for v in state.values())
    assert state["tp"].dtype == bool and state["tp"].shape == (1, 10)


def test_degenerate_boxes_never_match():
    # Zero-area prediction on a zero-area GT: IoU 0/0 is no match, not an error.
    p = preds(([5, 5, 5, 5], 0.9, 0))
    assert not match_predictions(p, *gts(([5, 5, 5, 5], 0))).any()
