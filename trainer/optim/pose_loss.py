"""The keypoint (pose) loss, as ultralytics 8.4 defines it (v8PoseLoss,
KeypointLoss in ultralytics/utils/loss.py): the detector's three terms on the
same assignment, and per foreground anchor, against its assigned object's
keypoints:

- a keypoint location term, 1 - exp(-e) of each labelled keypoint with
  e = d^2 / ((2 sigma)^2 * 2 * area) (COCO's object keypoint similarity:
  d the distance, area the assigned box's, both in grid units of the
  anchor's level), scaled by K / (the object's labelled keypoints), averaged
  over anchors and keypoints, times the `pose` gain (12);
- with kpt_shape [K, 3], a visibility term: BCE of each keypoint's third
  value against "labelled" (visibility not 0), averaged, times `kobj` (1).

The sigmas are COCO's for [17, 3] (ultralytics' OKS_SIGMA) and 1/K for every
other shape, as ultralytics chooses them. A predicted keypoint decodes as
its head's: YOLOv8's and YOLO11's (x * 2 + anchor - 0.5), YOLO26's
(x + anchor), in grid units.

Scaled for the world size as DetectionLoss (optim/loss.py): where
ultralytics averages over one process's foreground, the two terms here are
sums over this rank's foreground divided by the global batch's foreground
count (an all-reduce, / the ranks), so that one process computes
ultralytics' numbers and ranks together compute one process's.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .loss import DetectionLoss

# COCO's per-keypoint sigmas (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles): ultralytics' OKS_SIGMA
OKS_SIGMA = (0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07, 0.87, 0.87, 0.89, 0.89)
COCO_KPT_SHAPE = (17, 3)


def keypoint_sigmas(kpt_shape: Sequence[int]) -> Tensor:
    """[K] OKS sigmas: COCO's / 10 for kpt_shape [17, 3], else 1/K each (ultralytics' choice)."""
    k = int(kpt_shape[0])
    if tuple(kpt_shape) == COCO_KPT_SHAPE:
        return torch.tensor(OKS_SIGMA, dtype=torch.float32) / 10.0
    return torch.full((k,), 1.0 / k)


class Prepared(NamedTuple):
    """The targets as from_prepared reads them: DetectionLoss.gts()'s, and each gt's keypoints where gts() placed it."""

    gts: tuple[Tensor, Tensor, Tensor]
    keypoints: Tensor  # [B, M, K, 3]: x, y in input pixels, visibility (1 for every keypoint of a [K, 2] shape)


class PoseLoss(DetectionLoss):
    """loss, items = PoseLoss(nc, kpt_shape=...)((maps, keypoint maps), targets, keypoints).

    items: box, pose, kobj, cls, dfl (ultralytics' order and names), each times its gain."""

    def __init__(self, nc: int, reg_max: int = 16, strides: Sequence[float] = (8, 16, 32), *,
                 kpt_shape: Sequence[int], pose: float = 12.0, kobj: float = 1.0, **kwargs):
        super().__init__(nc, reg_max, strides, **kwargs)
        self.kpt_shape = (int(kpt_shape[0]), int(kpt_shape[1]))
        self.sigmas = keypoint_sigmas(self.kpt_shape)
        self.pose_gains = (pose, kobj)
        box, cls, dfl = self.names
        self.names = (box, "pose_loss", "kobj_loss", cls, dfl)
        # YOLO26's head (reg_max 1) places a keypoint at x + anchor; YOLOv8's and YOLO11's at x * 2 + anchor - 0.5
        self.kpt_scale, self.kpt_shift = (1.0, 0.0) if reg_max == 1 else (2.0, -0.5)

    def __call__(self, preds: tuple, targets: Tensor | tuple[Tensor, Tensor],
                 keypoints: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """preds: the detector's maps per level [B, 4*reg_max+nc, H, W] and
        the keypoint maps per level [B, K*D, H, W]; targets [M, 6] (img, cls,
        cx, cy, w, h; 0..1); keypoints [M, K, D] (x, y in 0..1 of the image
        and, for D 3, visibility 0, 1 or 2), or both as the loader's
        (targets, keypoints). -> (loss, items): loss = their sum x the
        global batch."""
        if keypoints is not None:
            targets = (targets, keypoints)
        return self.from_prepared(preds, self.prepare(preds, targets))

    def prepare(self, preds: tuple, targets: tuple[Tensor, Tensor]) -> Prepared:
        """The loader's (targets, keypoints) as from_prepared reads them."""
        rows, keypoints = targets
        feats = preds[0]
        gts = self.gts(feats, rows)
        return Prepared(gts, self._placed(rows, keypoints.to(gts[1].device).float(), gts[1].shape[:2],
                                          self._input_hw(feats)))

    def from_prepared(self, preds: tuple, prepared: Prepared) -> tuple[Tensor, Tensor]:
        feats, kpt_maps = preds[:2]
        parts, (fg, gt_idx, target_bboxes) = self.detection(feats, prepared.gts)
        location, visibility = self._keypoint_terms(kpt_maps, feats, fg, gt_idx, target_bboxes, prepared.keypoints)
        box, cls, dfl = parts
        pose, kobj = self.pose_gains
        parts = torch.stack((box, location * pose, visibility * kobj, cls, dfl))
        return parts.sum() * (fg.shape[0] * self.world_size), parts.detach()

    def example_targets(self, imgsz: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """DetectionLoss's, each object's keypoints spread over its box, all visible."""
        targets = super().example_targets(imgsz, device)
        k, dims = self.kpt_shape
        xy = 0.5 + 0.1 * torch.stack([torch.linspace(-1, 1, k, device=device)] * 2, -1)
        keypoints = torch.cat([xy, torch.full((k, 1), 2.0, device=device)], -1)[:, :dims]
        return targets, keypoints.expand(len(targets), k, dims).clone()

    @staticmethod
    def _placed(rows: Tensor, keypoints: Tensor, slots: tuple[int, int], input_hw: tuple[float, float]) -> Tensor:
        """[B, M, K, 3] keypoints in pixels, each object's where gts() placed
        its box (its rank among its image's rows); a [K, 2] shape's all visible."""
        if keypoints.shape[-1] == 2:
            keypoints = torch.cat([keypoints, torch.ones_like(keypoints[..., :1])], -1)
        image_of = rows[:, 0].long().to(keypoints.device)
        counts = torch.bincount(image_of, minlength=slots[0])
        order = image_of.argsort(stable=True)
        slot = torch.empty_like(image_of)
        slot[order] = torch.arange(len(image_of), device=image_of.device) - (counts.cumsum(0) - counts)[image_of[order]]
        placed = keypoints.new_zeros((*slots, *keypoints.shape[1:]))
        h, w = input_hw
        placed[image_of, slot] = keypoints * keypoints.new_tensor([w, h, 1.0])
        return placed

    def _keypoint_terms(self, kpt_maps: list[Tensor], feats: list[Tensor], fg: Tensor, gt_idx: Tensor,
                        target_bboxes: Tensor, keypoints: Tensor) -> tuple[Tensor, Tensor]:
        """The location and visibility terms (before their gains) over this
        rank's foreground, divided by the global batch's foreground count."""
        k, dims = self.kpt_shape
        pred = torch.cat([m.flatten(2) for m in kpt_maps], 2).float().transpose(1, 2)  # [B, A, K*D]
        count = self._global_count(fg)  # before the early return: every rank joins the all-reduce
        b, a = fg.nonzero(as_tuple=True)
        if not len(b):  # zero, yet attached to the keypoint maps: DDP wants a gradient for every parameter
            zero = pred.new_zeros(()) + pred.sum() * 0
            return zero, zero
        points, strides, _ = self._anchors(feats, pred.dtype)
        pred = pred[b, a].view(-1, k, dims)
        xy = pred[..., :2] * self.kpt_scale + points[a][:, None] + self.kpt_shift  # grid units
        gt = keypoints[b, gt_idx[b, a]]  # [n, K, 3] pixels
        gt_xy = gt[..., :2] / strides[a][:, None]
        labelled = gt[..., 2] != 0
        box = target_bboxes[b, a] / strides[a]
        area = ((box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]))[:, None]  # [n, 1], grid units
        sigmas = self.sigmas.to(pred.device)
        e = (xy - gt_xy).pow(2).sum(-1) / ((2 * sigmas).pow(2) * (area + 1e-9) * 2)
        weight = k / (labelled.sum(1, keepdim=True) + 1e-9)  # objects with few labelled keypoints count as many
        location = (weight * (1 - torch.exp(-e)) * labelled).sum() / (count * k)
        if dims == 2:
            return location, location.new_zeros(())
        visibility = F.binary_cross_entropy_with_logits(pred[..., 2], labelled.float(), reduction="sum") / (count * k)
        return location, visibility

    def _global_count(self, fg: Tensor) -> Tensor:
        """The global batch's foreground anchors over the ranks, / the ranks (one process: its own)."""
        count = fg.sum().float()
        if self.world_size > 1:
            torch.distributed.all_reduce(count)  # no autograd: the assignment is detached
        return count / self.world_size
