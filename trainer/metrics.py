"""Detection metrics: per-image matching, COCO-style AP, and a shard-friendly
accumulator for distributed validation.

Flow: each rank calls `DetStats.update` once per image, sends `state()` (plain
numpy arrays) to rank 0 (the trainer gathers them with
`torch.distributed.all_gather_object`), and rank 0 calls
`DetStats.summary(DetStats.merge(states), nc)`. Matching is per image, so a
merged state gives exactly the numbers one process over all images would.

Conventions (deliberate, so numbers can be checked by hand):
- An IoU equal to a threshold counts as a match (`iou >= t`, as pycocotools).
- AP is the 101-point interpolated AP of COCO: the precision envelope (max
  precision at any recall >= r) sampled at recall r = 0, 0.01, ..., 1; recall
  points beyond the highest recall reached contribute 0.
- Classes without ground truth are excluded from every mean (their AP is NaN),
  also when they have (false-positive) predictions, as COCO does.
- Precision and recall are reported at one confidence threshold shared by all
  classes: the one that maximises the mean F1 (at IoU 0.5) over classes with
  ground truth; a deployed model also uses one threshold for all classes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .boxes import box_iou

IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)
RECALL_POINTS = np.arange(101) / 100  # exact k/100, unlike an accumulated step
MAX_F1_CANDIDATES = 1000  # confidence thresholds tried when picking max F1


# --------------------------------------------------------------------------- matching


def _candidate_pairs(iou: np.ndarray, conf: np.ndarray, min_iou: float):
    """(gt, pred, iou) pairs with iou >= min_iou, by IoU descending, ties by
    confidence descending, then by index (lexsort is stable)."""
    gi, pi = np.nonzero(iou >= min_iou)
    v = iou[gi, pi]
    order = np.lexsort((-conf[pi], -v))
    return gi[order], pi[order], v[order]


def _greedy_one_to_one(gi: np.ndarray, pi: np.ndarray, n: int) -> np.ndarray:
    """Walk pairs in order, keeping one whose gt and prediction are both free."""
    matched = np.zeros(n, dtype=bool)
    used_gt: set[int] = set()
    for g, p in zip(gi.tolist(), pi.tolist()):
        if not matched[p] and g not in used_gt:
            matched[p] = True
            used_gt.add(g)
    return matched


def match_predictions(pred: Tensor, gt_boxes: Tensor, gt_cls: Tensor) -> Tensor:
    """Which predictions are true positives at each IoU threshold.

    pred [n,6] (x1,y1,x2,y2,conf,cls), gt_boxes [m,4] xyxy, gt_cls [m] ->
    bool [n,10] on pred's device. Per threshold: greedy one-to-one matching by
    descending IoU (ties: higher confidence first), same class only.
    """
    pred, gt_boxes = pred.detach(), gt_boxes.detach()  # metrics never need gradients
    n, thresholds = pred.shape[0], IOU_THRESHOLDS.numpy()
    correct = np.zeros((n, len(thresholds)), dtype=bool)
    if n == 0 or gt_boxes.shape[0] == 0:
        return torch.from_numpy(correct).to(pred.device)
    same_cls = gt_cls.reshape(-1, 1).long() == pred[:, 5].long().reshape(1, -1)
    # eps=0: IoU 60/100 must come out as exactly float32(0.6), the threshold,
    # whatever the box scale (normalised boxes would feel an epsilon). Two
    # zero-area boxes give 0/0 = NaN, which fails every `>=`: no match.
    iou = (box_iou(gt_boxes.float(), pred[:, :4].float(), eps=0.0) * same_cls).cpu().numpy()
    conf = pred[:, 4].float().cpu().numpy()
    gi, pi, v = _candidate_pairs(iou, conf, float(thresholds.min()))
    for j, t in enumerate(thresholds):
        # Pairs are sorted by IoU, so those passing threshold t are a prefix:
        # one sort serves all ten thresholds.
        k = int(np.searchsorted(-v, -t, side="right"))
        correct[:, j] = _greedy_one_to_one(gi[:k], pi[:k], n)
    return torch.from_numpy(correct).to(pred.device)


# --------------------------------------------------------------------------- AP


def _interpolated_ap(tp_sorted: np.ndarray, n_gt: int) -> np.ndarray:
    """COCO 101-point AP per IoU threshold of one class.

    tp_sorted [k,T] bool, predictions by confidence descending -> [T].
    """
    k = tp_sorted.shape[0]
    if k == 0:
        return np.zeros(tp_sorted.shape[1])
    tpc = np.cumsum(tp_sorted, axis=0)
    recall = tpc / n_gt
    precision = tpc / np.arange(1, k + 1)[:, None]
    # Envelope: best precision at this or any higher recall (a right-to-left max).
    envelope = np.maximum.accumulate(precision[::-1], axis=0)[::-1]
    ap = np.empty(tp_sorted.shape[1])
    for j in range(tp_sorted.shape[1]):
        idx = np.searchsorted(recall[:, j], RECALL_POINTS, side="left")
        sampled = np.where(idx < k, envelope[np.minimum(idx, k - 1), j], 0.0)
        ap[j] = sampled.mean()
    return ap


def _conf_candidates(conf: np.ndarray) -> np.ndarray:
    """Confidence thresholds to try for max F1: every distinct confidence
    (exact: P and R only change there), thinned to quantiles when there are
    many so a full COCO val (up to 1.5M predictions) stays cheap."""
    values = np.unique(conf)
    if len(values) > MAX_F1_CANDIDATES:
        values = values[np.linspace(0, len(values) - 1, MAX_F1_CANDIDATES).round().astype(int)]
    return values


def _pr_at_thresholds(tp50: np.ndarray, conf: np.ndarray, n_gt: int, taus: np.ndarray):
    """Precision and recall of one class when keeping predictions with
    conf >= tau, for each tau. tp50 and conf sorted by confidence descending."""
    kept = np.searchsorted(-conf, -taus, side="right")
    tp = np.concatenate([[0], np.cumsum(tp50)])[kept]
    precision = np.divide(tp, kept, out=np.zeros(len(taus)), where=kept > 0)
    return precision, tp / n_gt


def _f1(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    return np.divide(2 * p * r, p + r, out=np.zeros_like(p, dtype=float), where=(p + r) > 0)


def _best_f1_index(p_curves: np.ndarray, r_curves: np.ndarray) -> int | None:
    """Index of the threshold with the highest mean F1 over classes [C,K];
    None when there are no classes or no thresholds. Ties go to the lowest
    threshold (argmax takes the first; thresholds ascend): the most recall."""
    if p_curves.size == 0:
        return None
    return int(_f1(p_curves, r_curves).mean(axis=0).argmax())


def _check_classes(pred_cls: np.ndarray, target_cls: np.ndarray, nc: int) -> None:
    for name, c in (("pred_cls", pred_cls), ("target_cls", target_cls)):
        if len(c) and (c.min() < 0 or c.max() >= nc):
            raise ValueError(f"{name}: class ids must be in [0, {nc}), got {c.min()}..{c.max()}")


def _split_by_class(pred_cls: np.ndarray, conf: np.ndarray, nc: int):
    """Order (by class, then confidence descending) and per-class slice bounds."""
    order = np.lexsort((-conf, pred_cls))  # stable: ties keep input order, as COCO
    bounds = np.searchsorted(pred_cls[order], np.arange(nc + 1), side="left")
    return order, bounds


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray, nc: int) -> dict:
    """Per-class AP (COCO 101-point) and P/R at the max-mean-F1 confidence.

    tp [N,T] bool, conf [N], pred_cls [N], target_cls [M] -> dict of
    ap [nc,T], precision [nc], recall [nc] (NaN for classes without ground
    truth), n_gt [nc], n_pred [nc], present [nc] bool (has ground truth),
    conf_threshold (float; NaN without predictions).
    """
    tp = np.asarray(tp, dtype=bool)
    tp = tp[:, None] if tp.ndim == 1 else tp
    conf, pred_cls = np.asarray(conf, dtype=np.float64), np.asarray(pred_cls).astype(np.int64)
    target_cls = np.asarray(target_cls).astype(np.int64)
    _check_classes(pred_cls, target_cls, nc)
    n_gt = np.bincount(target_cls, minlength=nc)
    present = n_gt > 0
    order, bounds = _split_by_class(pred_cls, conf, nc)
    taus = _conf_candidates(conf)
    ap = np.full((nc, tp.shape[1]), np.nan)
    p_curves, r_curves = np.zeros((nc, len(taus))), np.zeros((nc, len(taus)))
    for c in np.flatnonzero(present):
        idx = order[bounds[c] : bounds[c + 1]]
        ap[c] = _interpolated_ap(tp[idx], n_gt[c])
        p_curves[c], r_curves[c] = _pr_at_thresholds(tp[idx, 0], conf[idx], n_gt[c], taus)
    best = _best_f1_index(p_curves[present], r_curves[present])
    precision, recall = np.full(nc, np.nan), np.full(nc, np.nan)
    precision[present] = p_curves[present, best] if best is not None else 0.0
    recall[present] = r_curves[present, best] if best is not None else 0.0
    return {
        "ap": ap,
        "precision": precision,
        "recall": recall,
        "n_gt": n_gt,
        "n_pred": np.diff(bounds),
        "present": present,
        "conf_threshold": float(taus[best]) if best is not None else float("nan"),
    }


# --------------------------------------------------------------------------- accumulator


def _mean_or_zero(x: np.ndarray) -> float:
    # A validation set without any ground truth has no defined mAP; 0.0 keeps
    # best-checkpoint comparisons (`>`) working where NaN would silently fail.
    return float(x.mean()) if x.size else 0.0


class DetStats:
    """Per-image matching results of one rank's shard of the validation set."""

    def __init__(self) -> None:
        self._tp: list[np.ndarray] = []
        self._conf: list[np.ndarray] = []
        self._pred_cls: list[np.ndarray] = []
        self._target_cls: list[np.ndarray] = []

    @torch.no_grad()
    def update(self, pred: Tensor, gt_boxes: Tensor, gt_cls: Tensor) -> None:
        """Add one image: pred [n,6] (x1,y1,x2,y2,conf,cls), gt_boxes [m,4] xyxy, gt_cls [m]."""
        pred = pred.detach().reshape(-1, 6)
        gt_boxes, gt_cls = gt_boxes.detach().reshape(-1, 4), gt_cls.detach().reshape(-1)
        self._tp.append(match_predictions(pred, gt_boxes, gt_cls).cpu().numpy())
        self._conf.append(pred[:, 4].float().cpu().numpy())
        self._pred_cls.append(pred[:, 5].long().cpu().numpy().astype(np.int32))
        self._target_cls.append(gt_cls.long().cpu().numpy().astype(np.int32))

    def state(self) -> dict:
        """Plain numpy arrays (bool, float32, int32: ~18 bytes per prediction),
        cheap to pickle for all_gather_object."""
        return {
            "tp": np.concatenate(self._tp) if self._tp else np.zeros((0, len(IOU_THRESHOLDS)), bool),
            "conf": np.concatenate(self._conf) if self._conf else np.zeros(0, np.float32),
            "pred_cls": np.concatenate(self._pred_cls) if self._pred_cls else np.zeros(0, np.int32),
            "target_cls": np.concatenate(self._target_cls) if self._target_cls else np.zeros(0, np.int32),
        }

    @staticmethod
    def merge(states: list[dict]) -> dict:
        """Concatenate the states of several shards (order does not matter)."""
        return {key: np.concatenate([s[key] for s in states]) for key in ("tp", "conf", "pred_cls", "target_cls")}

    @staticmethod
    def summary(state: dict, nc: int) -> dict:
        """precision, recall, map50, map50_95 (means over classes with ground
        truth), per_class_ap50 (list of nc floats, NaN where a class has no
        ground truth), conf_threshold (where precision/recall were taken)."""
        r = ap_per_class(state["tp"], state["conf"], state["pred_cls"], state["target_cls"], nc)
        ap, present = r["ap"], r["present"]
        return {
            "precision": _mean_or_zero(r["precision"][present]),
            "recall": _mean_or_zero(r["recall"][present]),
            "map50": _mean_or_zero(ap[present, 0]),
            "map50_95": _mean_or_zero(ap[present].mean(axis=1)),
            "per_class_ap50": [float(x) for x in ap[:, 0]],
            "conf_threshold": r["conf_threshold"],
        }
