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

YOLO26's (`pose26`, ultralytics' PoseLoss26, inside EndToEndLoss for the
two heads):
- the assignment's overlap is the keypoints' OKS with the gt's (area x
  0.53, as ultralytics' validator), the box CIoU for a gt without labelled
  keypoints; and a gt may only take anchors of the levels that fit its size
  (sqrt(area) from 2 to 12 strides; the finest and coarsest levels open
  below and above; all its candidates where no level fits) (ultralytics'
  PoseTaskAlignedAssigner);
- with the sigma maps (training mode), a residual log-likelihood term (RLE,
  Li et al. 2021) of each labelled keypoint: log sigma - log p(error) +
  log(2 sigma) + |error|, error = (prediction - gt) / sigma per coordinate
  (sigma: the sigmoid of its logit; errors clamped to +-100), p the head's
  RealNVP flow's density, weighted per keypoint (ultralytics' RLE_WEIGHT for
  [17, 3], else 1), averaged over the labelled keypoints, at least 0, times
  `rle` (1).

Scaled for the world size as DetectionLoss (optim/loss.py): where
ultralytics averages over one process's foreground (or labelled keypoints),
the terms here are sums over this rank's divided by the global batch's
count (an all-reduce, / the ranks), so that one process computes
ultralytics' numbers and ranks together compute one process's; RLE's floor
at 0 is the global batch's (all ranks' shares zeroed where their sum is
negative).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.boxes import bbox_iou
from ..model.pose import AREA_SCALE, KPT_SHAPE, keypoint_sigmas
from .loss import DetectionLoss, EndToEndLoss, TaskAlignedAssigner

# YOLO26's RLE weights of COCO's keypoints: wrists, knees and ankles more (ultralytics' RLE_WEIGHT)
RLE_WEIGHT = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.5, 1.5, 1.0, 1.0, 1.2, 1.2, 1.5, 1.5)


class PoseAlignedAssigner(TaskAlignedAssigner):
    """YOLO26's pose assignment (ultralytics' PoseTaskAlignedAssigner): the
    overlap is the predicted keypoints' OKS, candidates gated by level.
    assign() takes pd_kpts [B,A,K,2] and gt_kpts [B,M,K,3] in pixels and
    anc_strides [A] besides the boxes."""

    level_range = (2.0, 12.0)  # a gt's sqrt(area) a level takes, in its strides

    def __init__(self, sigmas: Tensor, **kwargs):
        super().__init__(**kwargs)
        self.sigmas = sigmas

    def _candidates(self, anc_points: Tensor, gt_bboxes: Tensor, mask_gt: Tensor, *, anc_strides: Tensor,
                    **extra: Tensor) -> Tensor:
        inside = self._inside_gts(anc_points, self._widened(gt_bboxes))
        side = (gt_bboxes[..., 2:] - gt_bboxes[..., :2]).prod(-1, keepdim=True).clamp(min=0).sqrt()  # [B,M,1]
        lo, hi = self.level_range
        s = anc_strides
        gated = inside & ((side >= lo * s) | (s == s.min())) & ((side <= hi * s) | (s == s.max()))
        return torch.where(gated.any(-1, keepdim=True), gated, inside) & mask_gt.bool()

    def _alignment(self, pd_scores: Tensor, pd_bboxes: Tensor, gt_labels: Tensor, gt_bboxes: Tensor,
                   candidates: Tensor, *, pd_kpts: Tensor, gt_kpts: Tensor, **_: Tensor) -> tuple[Tensor, Tensor]:
        b, m, a = candidates.shape
        bi, mi, ai = candidates.nonzero(as_tuple=True)
        score = pd_scores[bi, ai, gt_labels[bi, mi, 0].long()]
        iou = bbox_iou(gt_bboxes[bi, mi], pd_bboxes[bi, ai], ciou=self.ciou).squeeze(-1).clamp(min=0)
        gt = gt_kpts[bi, mi]  # [P,K,3]
        labelled = gt[..., 2] > 0
        area = (gt_bboxes[bi, mi, 2:] - gt_bboxes[bi, mi, :2]).prod(-1, keepdim=True) * AREA_SCALE  # as validation
        d = (pd_kpts[bi, ai].float() - gt[..., :2]).pow(2).sum(-1)
        sigmas = self.sigmas.to(d.device)
        oks = ((-d / ((2 * sigmas).pow(2) * (area + self.eps) * 2)).exp() * labelled).sum(-1) \
            / labelled.sum(-1).clamp(min=1)
        scores = pd_scores.new_zeros(b, m, a)
        overlaps = pd_bboxes.new_zeros(b, m, a)
        scores[bi, mi, ai] = score
        overlaps[bi, mi, ai] = torch.where(labelled.any(-1), oks.to(iou.dtype), iou).to(overlaps.dtype)
        return scores.pow(self.alpha) * overlaps.pow(self.beta), overlaps


class Prepared(NamedTuple):
    """The targets as from_prepared reads them: DetectionLoss.gts()'s, and each gt's keypoints where gts() placed it."""

    gts: tuple[Tensor, Tensor, Tensor]
    keypoints: Tensor  # [B, M, K, 3]: x, y in input pixels, visibility (1 for every keypoint of a [K, 2] shape)


class PoseLoss(DetectionLoss):
    """loss, items = PoseLoss(nc, kpt_shape=...)((maps, keypoint maps[, sigma maps]), targets, keypoints).

    items: box, pose, kobj, cls, dfl (l1 at reg_max 1) and, with a `flow`,
    rle (ultralytics' order and names), each times its gain. `pose26`:
    YOLO26's keypoint decoding and assignment, and the RLE term with `flow`
    (the head's RealNVP) where the sigma maps are given. `sigmas`: a
    data.yaml's kpt_oks_sigmas (keypoint_sigmas)."""

    def __init__(self, nc: int, reg_max: int = 16, strides: Sequence[float] = (8, 16, 32), *,
                 kpt_shape: Sequence[int], sigmas: Sequence[float] | None = None, pose: float = 12.0,
                 kobj: float = 1.0, rle: float = 1.0, pose26: bool = False, flow: torch.nn.Module | None = None,
                 **kwargs):
        super().__init__(nc, reg_max, strides, **kwargs)
        self.kpt_shape = (int(kpt_shape[0]), int(kpt_shape[1]))
        self.sigmas = keypoint_sigmas(self.kpt_shape, sigmas)
        self.pose_gains = (pose, kobj, rle)
        self.pose26, self.flow = pose26, flow
        k = self.kpt_shape[0]
        self.rle_weights = torch.tensor(RLE_WEIGHT) if self.kpt_shape == KPT_SHAPE else torch.ones(k)
        if pose26:
            a = self.assigner
            self.assigner = PoseAlignedAssigner(self.sigmas, topk=a.topk, alpha=a.alpha, beta=a.beta, eps=a.eps,
                                                topk2=a.topk2, min_side=a.min_side, ciou=a.ciou)
        box, cls, dfl = self.names
        self.names = (box, "pose_loss", "kobj_loss", cls, dfl, *(("rle_loss",) if flow is not None else ()))
        # YOLO26's head places a keypoint at x + anchor; YOLOv8's and YOLO11's at x * 2 + anchor - 0.5
        self.kpt_scale, self.kpt_shift = (1.0, 0.0) if pose26 else (2.0, -0.5)

    def __call__(self, preds: tuple, targets: Tensor | tuple[Tensor, Tensor],
                 keypoints: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """preds: the detector's maps per level [B, 4*reg_max+nc, H, W], the
        keypoint maps per level [B, K*D, H, W] and, optionally (YOLO26 while
        training), the sigma maps [B, 2K, H, W] or None; targets [M, 6] (img,
        cls, cx, cy, w, h; 0..1); keypoints [M, K, D] (x, y in 0..1 of the
        image and, for D 3, visibility 0, 1 or 2), or both as the loader's
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
        sigma_maps = preds[2] if len(preds) > 2 else None
        k, dims = self.kpt_shape
        points, strides, _ = self._anchors(feats, torch.float32)
        raw = torch.cat([m.flatten(2) for m in kpt_maps], 2).float().transpose(1, 2)  # [B, A, K*D]
        kpts = raw.view(*raw.shape[:2], k, dims)
        xy = kpts[..., :2] * self.kpt_scale + points[:, None] + self.kpt_shift  # grid units
        extra = None
        if self.pose26:
            extra = dict(pd_kpts=xy.detach() * strides[:, None], gt_kpts=prepared.keypoints,
                         anc_strides=strides.view(-1))
        parts, (fg, gt_idx, target_bboxes) = self.detection(feats, prepared.gts, extra)
        sigmas = None
        if sigma_maps is not None and self.flow is not None:
            sigmas = torch.cat([m.flatten(2) for m in sigma_maps], 2).float().transpose(1, 2)
            sigmas = sigmas.reshape(*sigmas.shape[:2], k, 2)
        terms = self._keypoint_terms(kpts, xy, sigmas, strides, fg, gt_idx, target_bboxes, prepared.keypoints)
        box, cls, dfl = parts
        gains = self.pose_gains
        parts = torch.stack((box, terms[0] * gains[0], terms[1] * gains[1], cls, dfl,
                             *((terms[2] * gains[2],) if self.flow is not None else ())))
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

    def _keypoint_terms(self, kpts: Tensor, xy: Tensor, sigmas: Tensor | None, strides: Tensor, fg: Tensor,
                        gt_idx: Tensor, target_bboxes: Tensor, keypoints: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The location, visibility and RLE terms (before their gains) over
        this rank's foreground, divided by the global batch's counts."""
        k, dims = self.kpt_shape
        count = self._global_count(fg.sum())  # before any early return: every rank joins the all-reduce
        b, a = fg.nonzero(as_tuple=True)
        labelled_all = keypoints[..., 2] != 0
        if not len(b):  # zero, yet attached to the keypoint (and sigma) outputs: DDP wants every gradient
            zero = kpts.new_zeros(()) + kpts.sum() * 0
            return zero, zero, self._rle(None, None, None, None, kpts)
        gt = keypoints[b, gt_idx[b, a]]  # [n, K, 3] pixels
        gt_xy = gt[..., :2] / strides[a][:, None]
        labelled = labelled_all[b, gt_idx[b, a]]
        box = target_bboxes[b, a] / strides[a]
        area = ((box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]))[:, None]  # [n, 1], grid units
        pred_xy = xy[b, a]
        e = (pred_xy - gt_xy).pow(2).sum(-1) / ((2 * self.sigmas.to(xy.device)).pow(2) * (area + 1e-9) * 2)
        weight = k / (labelled.sum(1, keepdim=True) + 1e-9)  # objects with few labelled keypoints count as many
        location = (weight * (1 - torch.exp(-e)) * labelled).sum() / (count * k)
        visibility = location.new_zeros(())
        if dims == 3:
            bce = F.binary_cross_entropy_with_logits(kpts[b, a][..., 2], labelled.float(), reduction="sum")
            visibility = bce / (count * k)
        rle = self._rle(pred_xy, None if sigmas is None else sigmas[b, a], gt_xy, labelled, kpts)
        return location, visibility, rle

    def _rle(self, pred_xy: Tensor | None, sigma_logits: Tensor | None, gt_xy: Tensor | None,
             labelled: Tensor | None, kpts: Tensor) -> Tensor:
        """The RLE term over this rank's labelled keypoints, divided by the
        global batch's count of them, floored at 0 over the global batch;
        zero (attached to the flow) without sigma maps or keypoints."""
        if self.flow is None:
            return kpts.new_zeros(())
        attached = kpts.sum() * 0 + sum(p.sum() * 0 for p in self.flow.parameters())
        if sigma_logits is None:
            self._global_count(kpts.new_zeros(()))  # the ranks' all-reduces stay paired
            return self._floored(attached)
        weights = self.rle_weights.to(kpts.device).expand_as(labelled)[labelled]
        sigma = sigma_logits[labelled].float().sigmoid().clamp_min(torch.finfo(torch.float32).tiny)
        error = (pred_xy[labelled] - gt_xy[labelled]) / (sigma + 1e-9)
        valid = torch.isfinite(error).all(-1)  # NaN or inf would spread into the loss
        count = self._global_count(valid.sum())
        if not bool(valid.any()):
            return self._floored(attached + sigma_logits.sum() * 0)
        error, sigma, weights = error[valid].clamp(-100, 100), sigma[valid], weights[valid]
        log_phi = self.flow.log_prob(error)
        loss = torch.log(sigma) - log_phi[:, None] + torch.log(sigma * 2) + error.abs()
        return self._floored((loss * weights[:, None]).sum() / count + attached)

    def _floored(self, share: Tensor) -> Tensor:
        """This rank's share of a term floored at 0 over the global batch (ultralytics' clamp(min=0))."""
        total = share.detach().clone()
        if self.world_size > 1:
            torch.distributed.all_reduce(total)
        return share * 0 if bool(total < 0) else share

    def _global_count(self, n: Tensor) -> Tensor:
        """A count over the ranks, / the ranks (one process: its own)."""
        count = n.float()
        if self.world_size > 1:
            torch.distributed.all_reduce(count)  # no autograd: counts of a detached assignment
        return count / self.world_size


class EndToEndPoseLoss(EndToEndLoss):
    """YOLO26's keypoint loss over both heads (ultralytics' E2ELoss of
    PoseLoss26): loss, items = EndToEndPoseLoss(nc, epochs, kpt_shape=...,
    flow=model.head.flow)(((maps, keypoints, sigmas), (the one-to-one head's
    three)), (targets, keypoints)). EndToEndLoss's weighting of the heads;
    the one-to-one head's items (box, pose, kobj, cls, l1, rle), as
    ultralytics logs them."""

    def __init__(self, nc: int, epochs: int, strides: Sequence[float] = (8, 16, 32), world_size: int = 1, *,
                 kpt_shape: Sequence[int], sigmas: Sequence[float] | None = None,
                 flow: torch.nn.Module | None = None, **gains: float):
        super().__init__(nc, epochs, strides, world_size, head_loss=PoseLoss,
                         options=dict(kpt_shape=kpt_shape, sigmas=sigmas, pose26=True, flow=flow), **gains)
