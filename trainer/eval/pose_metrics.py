"""Keypoint metrics as ultralytics 8.4's pose validator computes them
(ultralytics/utils/metrics.py kpt_iou, models/yolo/pose/val.py): a
prediction matches a ground truth of its class by the object keypoint
similarity (OKS, COCO's) of their keypoints, at the same ten thresholds
0.5 ... 0.95 as boxes by IoU; P, R, mAP50 and mAP50-95 of the keypoints
follow as the boxes' do (metrics.py), and the fitness is the boxes'
mAP50-95 plus the keypoints'.

OKS of a gt with a prediction: the mean over the gt's labelled keypoints
(visibility not 0) of exp(-d^2 / (2 * (2 sigma)^2 * area)), d in pixels,
area the gt box's w * h * 0.53 (xtcocotools' cocoeval), the sigmas those of
the loss (model/pose.py keypoint_sigmas: a data.yaml's kpt_oks_sigmas,
else COCO's for [17, 3], else 1/K).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.pose import AREA_SCALE
from .metrics import DetStats, match_iou


def keypoint_similarity(gt_kpts: Tensor, pred_kpts: Tensor, area: Tensor, sigmas: Tensor,
                        eps: float = 1e-7) -> Tensor:
    """[m, n] OKS of gt keypoints [m, K, 3] (x, y, visibility) with predicted
    keypoints [n, K, 2+] (x, y, ...), in one unit; area [m], sigmas [K]."""
    d = (gt_kpts[:, None, :, :2] - pred_kpts[None, :, :, :2]).pow(2).sum(-1)  # [m, n, K]
    labelled = (gt_kpts[..., 2] != 0)[:, None]  # [m, 1, K]
    sigmas = sigmas.to(d)
    e = d / ((2 * sigmas).pow(2) * (area[:, None, None] + eps) * 2)
    return ((-e).exp() * labelled).sum(-1) / (labelled.sum(-1) + eps)


class PoseStats:
    """DetStats for boxes and, matched by OKS, for keypoints: one image at a
    time, the same shard-friendly state per kind."""

    def __init__(self, sigmas: Tensor, method: str = "coco") -> None:
        self.sigmas = sigmas
        self.boxes, self.keypoints = DetStats(method), DetStats(method)

    @torch.no_grad()
    def update(self, pred: Tensor, pred_kpts: Tensor, gt_boxes: Tensor, gt_cls: Tensor, gt_kpts: Tensor) -> None:
        """Add one image: pred [n, 6] with its keypoints [n, K, 2+], gts [m, 4]
        xyxy, [m] classes and keypoints [m, K, 3] (a [K, 2] shape's: all
        labelled, visibility 1), in input pixels."""
        self.boxes.update(pred, gt_boxes, gt_cls)
        pred, gt_cls = pred.detach().reshape(-1, 6), gt_cls.detach().reshape(-1)
        gt_boxes = gt_boxes.detach().reshape(-1, 4).float()
        area = (gt_boxes[:, 2] - gt_boxes[:, 0]) * (gt_boxes[:, 3] - gt_boxes[:, 1]) * AREA_SCALE
        oks = keypoint_similarity(gt_kpts.float(), pred_kpts.float(), area, self.sigmas)
        self.keypoints.add(match_iou(oks, pred, gt_cls, self.keypoints.method), pred, gt_cls)

    def state(self) -> dict:
        return {"boxes": self.boxes.state(), "keypoints": self.keypoints.state()}

    @staticmethod
    def merge(states: list[dict]) -> dict:
        return {kind: DetStats.merge([s[kind] for s in states]) for kind in ("boxes", "keypoints")}

    @staticmethod
    def summary(state: dict, nc: int, method: str = "coco") -> dict:
        """DetStats.summary of the boxes, and of the keypoints under keys
        ending in `_pose` (precision_pose, recall_pose, map50_pose, ...)."""
        boxes = DetStats.summary(state["boxes"], nc, method)
        keypoints = DetStats.summary(state["keypoints"], nc, method)
        return {**boxes, **{f"{k}_pose": v for k, v in keypoints.items()}}

    @staticmethod
    def fitness(summary: dict) -> float:
        """Ultralytics 8.4's fitness of a pose model: the boxes' mAP50-95 plus the keypoints'."""
        return summary["map50_95"] + summary["map50_95_pose"]
