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

`method="ultralytics"` (what `hpcyolo val` reports, to compare with
ultralytics' `model.val()`) differs in two places, both as ultralytics does:
- matching: the predictions in input order (after NMS: the most confident
  first), each taking the ground truth it overlaps most among those still
  free, not the greedy walk by IoU;
- AP: the precision envelope over (0, 1), the curve's points, a drop to 0 at
  the highest recall reached and (1, 0) is linearly interpolated at the 101
  recall points and integrated with the trapezoid rule;
- precision and recall: at the confidence of ultralytics' 1000-point grid
  where the mean F1 over classes, smoothed, is highest.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..model.boxes import box_iou
from ..model.rboxes import batch_probiou

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


def match_predictions(pred: Tensor, gt_boxes: Tensor, gt_cls: Tensor, method: str = "coco") -> Tensor:
    """Which predictions are true positives at each IoU threshold.

    pred [n,6] (x1,y1,x2,y2,conf,cls), gt_boxes [m,4] xyxy, gt_cls [m] ->
    bool [n,10] on pred's device. Per threshold: greedy one-to-one matching by
    descending IoU (ties: higher confidence first), same class only.
    """
    pred, gt_boxes = pred.detach(), gt_boxes.detach()  # metrics never need gradients
    if pred.shape[0] == 0 or gt_boxes.shape[0] == 0:
        return torch.zeros(pred.shape[0], len(IOU_THRESHOLDS), dtype=torch.bool, device=pred.device)
    # eps=0: IoU 60/100 must come out as exactly float32(0.6), the threshold,
    # whatever the box scale (normalised boxes would feel an epsilon). Two
    # zero-area boxes give 0/0 = NaN, which fails every `>=`: no match.
    return match_iou(box_iou(gt_boxes.float(), pred[:, :4].float(), eps=0.0), pred, gt_cls, method)


def match_rotated(pred: Tensor, gt_boxes: Tensor, gt_cls: Tensor, method: str = "coco") -> Tensor:
    """match_predictions of rotated boxes by their ProbIoU, as ultralytics'
    OBB validator matches them: pred [n,7] (cx, cy, w, h, conf, cls, angle:
    rboxes.non_max_suppression_obb's rows), gt_boxes [m,5] xywhr, gt_cls [m] -> bool [n,10]."""
    pred, gt_boxes = pred.detach(), gt_boxes.detach()
    if pred.shape[0] == 0 or gt_boxes.shape[0] == 0:
        return torch.zeros(pred.shape[0], len(IOU_THRESHOLDS), dtype=torch.bool, device=pred.device)
    boxes = torch.cat((pred[:, :4], pred[:, 6:7]), 1).float()
    return match_iou(batch_probiou(gt_boxes.float(), boxes), pred, gt_cls, method)


def mask_iou(gt_masks: Tensor, pred_masks: Tensor, eps: float = 1e-7) -> Tensor:
    """[m, n] IoU of binary masks gt [m, H, W] and pred [n, H, W] (as ultralytics'
    mask_iou: overlap / (sum of areas - overlap + eps))."""
    gt, pred = gt_masks.flatten(1).float(), pred_masks.flatten(1).float()
    overlap = gt @ pred.T
    return overlap / (gt.sum(1)[:, None] + pred.sum(1)[None] - overlap + eps)


def match_iou(iou: Tensor, pred: Tensor, gt_cls: Tensor, method: str = "coco") -> Tensor:
    """match_predictions for any overlap: iou [m, n] of the ground truths with
    the predictions pred [n, 6] (its conf and cls columns read), gt_cls [m]
    -> bool [n, 10]."""
    n, thresholds = pred.shape[0], IOU_THRESHOLDS.numpy()
    correct = np.zeros((n, len(thresholds)), dtype=bool)
    if n == 0 or iou.shape[0] == 0:
        return torch.from_numpy(correct).to(pred.device)
    same_cls = gt_cls.reshape(-1, 1).long() == pred[:, 5].long().reshape(1, -1)
    iou = (iou * same_cls).cpu().numpy()
    if method == "ultralytics":
        return torch.from_numpy(_match_ultralytics(iou, thresholds, n)).to(pred.device)
    conf = pred[:, 4].float().cpu().numpy()
    gi, pi, v = _candidate_pairs(iou, conf, float(thresholds.min()))
    for j, t in enumerate(thresholds):
        # Pairs are sorted by IoU, so those passing threshold t are a prefix:
        # one sort serves all ten thresholds.
        k = int(np.searchsorted(-v, -t, side="right"))
        correct[:, j] = _greedy_one_to_one(gi[:k], pi[:k], n)
    return torch.from_numpy(correct).to(pred.device)


def _match_ultralytics(iou: np.ndarray, thresholds: np.ndarray, n: int) -> np.ndarray:
    """Ultralytics 8.4's matching: the predictions in input order (after NMS:
    the most confident first), each taking, per threshold, the ground truth
    it overlaps most among those no earlier prediction took, if that overlap
    reaches the threshold. [n, T] bool."""
    correct = np.zeros((n, len(thresholds)), dtype=bool)
    taken = np.zeros((iou.shape[0], len(thresholds)), dtype=bool)
    columns = np.arange(len(thresholds))
    for j in np.flatnonzero((iou >= thresholds.min()).any(0)):
        free = np.where(taken, 0, iou[:, j, None])  # [m, T]
        best = free.argmax(0)
        correct[j] = free[best, columns] >= thresholds
        taken[best, columns] |= correct[j]
    return correct


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


def _trapezoid_ap(tp_sorted: np.ndarray, n_gt: int) -> np.ndarray:
    """Ultralytics 8.4's AP per IoU threshold of one class: the envelope of
    the curve extended by (0, 1), a drop to precision 0 at the highest recall
    reached and (1, 0), interpolated at 101 recall points, integrated by the
    trapezoid rule. tp_sorted [k,T] bool -> [T]."""
    k, t = tp_sorted.shape
    if k == 0:  # no predictions of the class: 0, not the area under the (0, 1)-(1, 0) line
        return np.zeros(t)
    tpc = np.cumsum(tp_sorted, axis=0)
    recall = tpc / (n_gt + 1e-16)
    precision = tpc / np.arange(1, k + 1)[:, None]
    ap = np.empty(t)
    for j in range(t):
        mrec, mpre = _envelope(recall[:, j], precision[:, j])
        y = np.interp(RECALL_POINTS, mrec, mpre)
        ap[j] = float(((y[1:] + y[:-1]) / 2 * np.diff(RECALL_POINTS)).sum())
    return ap


def _envelope(recall: np.ndarray, precision: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(recall, precision) points of ultralytics 8.4's precision envelope: the
    curve from (0, 1), falling to 0 at its highest recall, then to (1, 0);
    each precision the best at that or any higher recall."""
    mrec = np.concatenate(([0.0], recall, [recall[-1] if len(recall) else 1.0], [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0], [0.0]))
    return mrec, np.maximum.accumulate(mpre[::-1])[::-1]


def _smooth(y: np.ndarray, fraction: float) -> np.ndarray:
    """A box filter `fraction` of y's length wide (odd), edges padded with the end values (ultralytics' smooth)."""
    width = round(len(y) * fraction * 2) // 2 + 1
    pad = np.ones(width // 2)
    return np.convolve(np.concatenate((pad * y[0], y, pad * y[-1])), np.ones(width) / width, mode="valid")


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


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray, nc: int,
                 method: str = "coco") -> dict:
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
        ap[c] = (_trapezoid_ap if method == "ultralytics" else _interpolated_ap)(tp[idx], n_gt[c])
        p_curves[c], r_curves[c] = _pr_at_thresholds(tp[idx, 0], conf[idx], n_gt[c], taus)
    precision, recall = np.full(nc, np.nan), np.full(nc, np.nan)
    if method == "ultralytics":  # its 1000-point confidence grid, the mean F1 smoothed
        grid = curves({"tp": tp, "conf": conf, "pred_cls": pred_cls, "target_cls": target_cls}, nc)
        best = int(_smooth(grid["f1"][present].mean(0), 0.1).argmax()) if present.any() else None
        p_curves, r_curves, taus = grid["precision"], grid["recall"], CURVE_POINTS
    else:
        best = _best_f1_index(p_curves[present], r_curves[present])
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

    def __init__(self, method: str = "coco") -> None:
        if method not in ("coco", "ultralytics"):
            raise ValueError(f"method must be coco or ultralytics, got {method!r}")
        self.method = method
        self._tp: list[np.ndarray] = []
        self._conf: list[np.ndarray] = []
        self._pred_cls: list[np.ndarray] = []
        self._target_cls: list[np.ndarray] = []

    @torch.no_grad()
    def update(self, pred: Tensor, gt_boxes: Tensor, gt_cls: Tensor) -> None:
        """Add one image: pred [n,6] (x1,y1,x2,y2,conf,cls), gt_boxes [m,4] xyxy, gt_cls [m]."""
        pred = pred.detach().reshape(-1, 6)
        gt_boxes, gt_cls = gt_boxes.detach().reshape(-1, 4), gt_cls.detach().reshape(-1)
        self.add(match_predictions(pred, gt_boxes, gt_cls, self.method), pred, gt_cls)

    def add(self, tp: Tensor, pred: Tensor, gt_cls: Tensor) -> None:
        """Add one image's matches tp [n,10] of its predictions pred [n,6] to its gt classes [m]."""
        self._tp.append(tp.cpu().numpy())
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
    def summary(state: dict, nc: int, method: str = "coco") -> dict:
        """precision, recall, map50, map50_95 (means over classes with ground
        truth), per_class_ap50 (list of nc floats, NaN where a class has no
        ground truth), conf_threshold (where precision/recall were taken), and
        per class: per_class_ap50_95, per_class_precision, per_class_recall,
        per_class_instances."""
        r = ap_per_class(state["tp"], state["conf"], state["pred_cls"], state["target_cls"], nc, method)
        ap, present = r["ap"], r["present"]
        return {
            "precision": _mean_or_zero(r["precision"][present]),
            "recall": _mean_or_zero(r["recall"][present]),
            "map50": _mean_or_zero(ap[present, 0]),
            "map50_95": _mean_or_zero(ap[present].mean(axis=1)),
            "per_class_ap50": [float(x) for x in ap[:, 0]],
            "per_class_ap50_95": [float(x) for x in ap.mean(axis=1)],
            "per_class_precision": [float(x) for x in r["precision"]],
            "per_class_recall": [float(x) for x in r["recall"]],
            "per_class_instances": [int(x) for x in r["n_gt"]],
            "conf_threshold": r["conf_threshold"],
        }


class OBBStats(DetStats):
    """DetStats of oriented boxes, matched by ProbIoU (match_rotated), as
    ultralytics' OBB validator; its summary and fitness are detection's."""

    @torch.no_grad()
    def update(self, pred: Tensor, gt_boxes: Tensor, gt_cls: Tensor) -> None:
        """Add one image: pred [n,7] (cx, cy, w, h, conf, cls, angle), gt_boxes [m,5] xywhr, gt_cls [m]."""
        pred = pred.detach().reshape(-1, 7)
        gt_boxes, gt_cls = gt_boxes.detach().reshape(-1, 5), gt_cls.detach().reshape(-1)
        self.add(match_rotated(pred, gt_boxes, gt_cls, self.method), pred, gt_cls)


class SegStats:
    """DetStats for boxes and, matched by mask IoU, for masks: one image at a
    time, the same shard-friendly state per kind."""

    def __init__(self, method: str = "coco") -> None:
        self.boxes, self.masks = DetStats(method), DetStats(method)

    @torch.no_grad()
    def update(self, pred: Tensor, pred_masks: Tensor, gt_boxes: Tensor, gt_cls: Tensor, gt_masks: Tensor) -> None:
        """Add one image: pred [n,6] with its masks [n,H,W], gts [m,4] xyxy, [m] classes and masks [m,H,W]."""
        self.boxes.update(pred, gt_boxes, gt_cls)
        pred, gt_cls = pred.detach().reshape(-1, 6), gt_cls.detach().reshape(-1)
        self.masks.add(match_iou(mask_iou(gt_masks, pred_masks), pred, gt_cls, self.masks.method), pred, gt_cls)

    def state(self) -> dict:
        return {"boxes": self.boxes.state(), "masks": self.masks.state()}

    @staticmethod
    def merge(states: list[dict]) -> dict:
        return {kind: DetStats.merge([s[kind] for s in states]) for kind in ("boxes", "masks")}

    @staticmethod
    def summary(state: dict, nc: int, method: str = "coco") -> dict:
        """DetStats.summary of the boxes, and of the masks under keys ending
        in `_mask` (precision_mask, recall_mask, map50_mask, map50_95_mask, ...)."""
        boxes = DetStats.summary(state["boxes"], nc, method)
        masks = DetStats.summary(state["masks"], nc, method)
        return {**boxes, **{f"{k}_mask": v for k, v in masks.items()}}

    @staticmethod
    def fitness(summary: dict) -> float:
        """Ultralytics 8.4's fitness of a segmentation: the boxes' mAP50-95 plus the masks'."""
        return summary["map50_95"] + summary["map50_95_mask"]


# --------------------------------------------------------------------------- what the plots show

CURVE_POINTS = np.linspace(0, 1, 1000)  # ultralytics' grid for its curves (confidence, or recall)


def curves(state: dict, nc: int) -> dict:
    """The curves of ultralytics' Box*_curve.png from a merged DetStats
    state, at IoU 0.5: per class [nc, 1000] precision, recall and F1 over
    confidence (x: CURVE_POINTS), and the precision envelope over recall
    (`pr`, x: CURVE_POINTS); `present` [nc] marks classes with ground truth.
    Recall and precision at a confidence come from the predictions at or
    above it (interpolated between them, as ultralytics does)."""
    tp = np.asarray(state["tp"], dtype=bool)
    tp50 = tp[:, 0] if tp.ndim == 2 else tp
    conf = np.asarray(state["conf"], dtype=np.float64)
    pred_cls = np.asarray(state["pred_cls"]).astype(np.int64)
    n_gt = np.bincount(np.asarray(state["target_cls"]).astype(np.int64), minlength=nc)
    order, bounds = _split_by_class(pred_cls, conf, nc)
    x = CURVE_POINTS
    p, r, pr = np.zeros((nc, len(x))), np.zeros((nc, len(x))), np.zeros((nc, len(x)))
    for c in np.flatnonzero(n_gt > 0):
        idx = order[bounds[c]:bounds[c + 1]]
        if not len(idx):
            continue
        tpc = np.cumsum(tp50[idx])
        recall = tpc / n_gt[c]
        precision = tpc / np.arange(1, len(idx) + 1)
        r[c] = np.interp(-x, -conf[idx], recall, left=0)  # conf descends: interp wants x ascending
        p[c] = np.interp(-x, -conf[idx], precision, left=1)
        pr[c] = np.interp(x, *_envelope(recall, precision))
    return {"x": x, "precision": p, "recall": r, "f1": _f1(p, r), "pr": pr, "present": n_gt > 0}


class ConfusionMatrix:
    """Ultralytics' detection confusion matrix, [nc + 1, nc + 1]: rows the
    predicted class, columns the true one, the last row and column the
    background (a missed object; a detection of nothing). Detections above
    `conf` are matched to objects of any class at IoU above `iou`, each
    object and each detection at most once, the best IoU first."""

    def __init__(self, nc: int, conf: float = 0.25, iou: float = 0.45):
        self.nc, self.conf, self.iou = nc, conf, iou
        self.matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)

    def update(self, pred: Tensor, gt_boxes: Tensor, gt_cls: Tensor) -> None:
        """One image: pred [n, 6] (x1, y1, x2, y2, conf, cls), gt_boxes [m, 4], gt_cls [m]; or oriented
        boxes, pred [n, 7] (cx, cy, w, h, conf, cls, angle) and gt_boxes [m, 5] xywhr, matched by
        ProbIoU (ultralytics' confusion matrix of OBB)."""
        rotated = pred.shape[-1] == 7
        pred = pred.detach().float().cpu().reshape(-1, 7 if rotated else 6)
        pred = pred[pred[:, 4] > self.conf]
        gt_cls = gt_cls.detach().cpu().reshape(-1).long().numpy()
        pred_cls = pred[:, 5].long().numpy()
        if not len(pred):
            np.add.at(self.matrix, (self.nc, gt_cls), 1)
            return
        if not len(gt_cls):
            np.add.at(self.matrix, (pred_cls, self.nc), 1)
            return
        if rotated:
            iou = batch_probiou(gt_boxes.detach().float().cpu().reshape(-1, 5),
                                torch.cat([pred[:, :4], pred[:, 6:7]], 1)).numpy()
        else:
            iou = box_iou(gt_boxes.detach().float().cpu().reshape(-1, 4), pred[:, :4]).numpy()
        gi, pi = np.nonzero(iou > self.iou)
        pairs = np.stack([gi, pi, iou[gi, pi]], axis=1)
        pairs = pairs[np.argsort(-pairs[:, 2], kind="stable")]
        pairs = pairs[np.unique(pairs[:, 1], return_index=True)[1]]  # each detection's best object
        pairs = pairs[np.argsort(-pairs[:, 2], kind="stable")]
        pairs = pairs[np.unique(pairs[:, 0], return_index=True)[1]]  # each object's best detection
        gi, pi = pairs[:, 0].astype(int), pairs[:, 1].astype(int)
        np.add.at(self.matrix, (pred_cls[pi], gt_cls[gi]), 1)
        missed = np.setdiff1d(np.arange(len(gt_cls)), gi)
        np.add.at(self.matrix, (self.nc, gt_cls[missed]), 1)
        spurious = np.setdiff1d(np.arange(len(pred_cls)), pi)
        np.add.at(self.matrix, (pred_cls[spurious], self.nc), 1)
