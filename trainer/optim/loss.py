"""Detection losses: YOLOv8-style (task-aligned assignment, CIoU, DFL and
BCE) and YOLO26's two-head end-to-end loss built on it.

Written from the published methods, not from any YOLO codebase:
- TOOD (Feng et al., ICCV 2021): anchors are ranked per ground truth by the
  alignment metric t = s^alpha * u^beta (s: predicted score of the gt class,
  u: IoU of the predicted box with the gt); the top k inside the gt are
  positives, and their class targets are t normalised per gt so that the best
  positive of each gt gets that gt's best IoU.
- CIoU (Zheng et al., AAAI 2020) for the box regression.
- Distribution Focal Loss (Li et al., GFL, NeurIPS 2020): each box side is a
  distribution over reg_max integer bins; the target t is split over the two
  nearest bins floor(t), floor(t)+1 with weights that interpolate to t.

YOLO26's differences, as ultralytics 8.4 defines them (the numbers are
theirs): a head without bins (reg_max 1) regresses the four distances
directly, so an L1 term on them, as fractions of the image, takes DFL's place;
gt sides shorter than the middle stride are widened to it when anchors are
chosen (STAL: small objects keep candidates); and EndToEndLoss adds the
one-to-one head.

Units: the head predicts ltrb distances in *grid units* of its level
(pixels / stride); assignment compares boxes in pixels; the box and DFL losses
work in grid units again.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.boxes import bbox2dist, bbox_iou, dist2bbox, make_anchors, xywh2xyxy


class TaskAlignedAssigner(nn.Module):
    """TOOD's task-aligned label assignment (no learnable state)."""

    def __init__(self, topk: int = 10, alpha: float = 0.5, beta: float = 6.0, eps: float = 1e-9,
                 topk2: int | None = None, min_side: float = 0.0, ciou: bool = False):
        """topk2: after the topk and the one-gt-per-anchor rule, each gt keeps
        only its topk2 best anchors (1: one prediction per object, YOLO26's
        one-to-one head). min_side: STAL, gt sides shorter than this (pixels)
        count as this long when candidates are chosen (0: off). ciou: the
        alignment's overlap is the CIoU (ultralytics'), not the IoU (TOOD's)."""
        super().__init__()
        self.topk, self.alpha, self.beta, self.eps = topk, alpha, beta, eps
        self.topk2, self.min_side, self.ciou = topk2 or topk, min_side, ciou

    def forward(self, *args: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """assign()'s boxes, scores and foreground, without the gt index."""
        return self.assign(*args)[:3]

    @torch.no_grad()
    def assign(
        self,
        pd_scores: Tensor,
        pd_bboxes: Tensor,
        anc_points: Tensor,
        gt_labels: Tensor,
        gt_bboxes: Tensor,
        mask_gt: Tensor,
        **extra: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Assign anchors to gts -> (target_bboxes [B,A,4] (a subclass's boxes: as wide as its gts'),
        target_scores [B,A,nc], fg_mask [B,A] bool, gt_idx [B,A]: each anchor's gt among its image's, 0 for
        the background).

        pd_scores [B,A,nc] are probabilities; pd_bboxes [B,A,4], anc_points [A,2]
        and gt_bboxes [B,M,4] (xyxy) share one unit; gt_labels and mask_gt are [B,M,1].
        Background anchors get zero boxes and zero scores. `extra`: what a
        subclass's _alignment reads besides (segment_loss.py's mask-aware one).
        """
        if gt_bboxes.shape[1] == 0:
            return self._empty(pd_scores, gt_bboxes)
        candidates = self._candidates(anc_points, gt_bboxes, mask_gt, **extra)  # [B,M,A]
        align, overlaps = self._alignment(pd_scores, pd_bboxes, gt_labels, gt_bboxes, candidates, **extra)
        mask_pos = self._topk(align, candidates)
        mask_pos = self._one_gt_per_anchor(mask_pos, overlaps)
        if self.topk2 < self.topk:
            mask_pos = self._best_only(mask_pos, align)
        return self._targets(pd_scores, gt_labels, gt_bboxes, mask_pos, align, overlaps)

    def _empty(self, pd_scores: Tensor, gt_bboxes: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Targets for a batch without a single gt: everything is background."""
        b, a, _ = pd_scores.shape
        fg_mask = torch.zeros(b, a, dtype=torch.bool, device=pd_scores.device)
        return gt_bboxes.new_zeros(b, a, gt_bboxes.shape[-1]), torch.zeros_like(pd_scores), fg_mask, fg_mask.long()

    def _candidates(self, anc_points: Tensor, gt_bboxes: Tensor, mask_gt: Tensor, **extra: Tensor) -> Tensor:
        """[B,M,A]: the anchors each gt may take, those inside its box (widened by STAL)."""
        return self._inside_gts(anc_points, self._widened(gt_bboxes)) & mask_gt.bool()

    def _widened(self, gt_bboxes: Tensor) -> Tensor:
        """gt boxes whose sides shorter than min_side are widened to it about their centre (STAL)."""
        if not self.min_side:
            return gt_bboxes
        centre, size = (gt_bboxes[..., :2] + gt_bboxes[..., 2:]) / 2, gt_bboxes[..., 2:] - gt_bboxes[..., :2]
        small = (size < self.min_side).repeat(1, 1, 2)  # x1, y1, x2, y2 follow w, h, w, h
        half = size.clamp(min=self.min_side) / 2
        return torch.where(small, torch.cat([centre - half, centre + half], -1), gt_bboxes)

    def _inside_gts(self, points: Tensor, gt_bboxes: Tensor) -> Tensor:
        """[B,M,A]: anchor point strictly inside the gt box."""
        lt = (points[None, None] - gt_bboxes[:, :, None, :2]).amin(-1)  # [B,M,A,2] -> [B,M,A]
        rb = (gt_bboxes[:, :, None, 2:] - points[None, None]).amin(-1)
        return torch.minimum(lt, rb) > self.eps

    def _alignment(
        self, pd_scores: Tensor, pd_bboxes: Tensor, gt_labels: Tensor, gt_bboxes: Tensor, candidates: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Alignment metric s^alpha * iou^beta and IoU, both [B,M,A], zero outside the candidates."""
        b, m, a = candidates.shape
        scores = pd_scores.new_zeros(b, m, a)
        overlaps = pd_bboxes.new_zeros(b, m, a)
        # Only (image, gt, anchor) triples inside a gt: [B,M,A,4] boxes would
        # cost gigabytes at 8400 anchors and a crowded image.
        bi, mi, ai = candidates.nonzero(as_tuple=True)
        scores[bi, mi, ai] = pd_scores[bi, ai, gt_labels[bi, mi, 0].long()]
        iou = bbox_iou(gt_bboxes[bi, mi], pd_bboxes[bi, ai], ciou=self.ciou).squeeze(-1)
        overlaps[bi, mi, ai] = iou.clamp(min=0).to(overlaps.dtype)
        return scores.pow(self.alpha) * overlaps.pow(self.beta), overlaps

    def _topk(self, align: Tensor, candidates: Tensor) -> Tensor:
        """[B,M,A]: the topk anchors by alignment for each gt, restricted to candidates."""
        k = min(self.topk, align.shape[-1])
        idx = align.topk(k, dim=-1).indices
        picked = torch.zeros_like(candidates).scatter_(-1, idx, True)
        # A gt with fewer than k candidates fills its top k with outside
        # anchors (metric 0); the candidate mask drops them again.
        return picked & candidates

    def _one_gt_per_anchor(self, mask_pos: Tensor, overlaps: Tensor) -> Tensor:
        """An anchor picked by several gts goes to the gt it overlaps most among
        all it lies in, whether that gt's top k held it or not: ultralytics'
        select_highest_overlaps (overlaps are 0 outside a gt's candidates)."""
        multi = mask_pos.sum(1, keepdim=True) > 1  # [B,1,A]
        best = overlaps.argmax(1, keepdim=True)  # [B,1,A]
        only_best = torch.zeros_like(mask_pos).scatter_(1, best, True)
        return torch.where(multi, only_best, mask_pos)

    def _best_only(self, mask_pos: Tensor, align: Tensor) -> Tensor:
        """[B,M,A]: each gt's topk2 best positives by alignment, the rest dropped."""
        best = (align * mask_pos).topk(self.topk2, dim=-1).indices
        return mask_pos & torch.zeros_like(mask_pos).scatter_(-1, best, True)

    def _targets(
        self, pd_scores: Tensor, gt_labels: Tensor, gt_bboxes: Tensor, mask_pos: Tensor, align: Tensor, overlaps: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Boxes, TOOD-normalised class scores, the foreground mask and the gt index from the final assignment."""
        fg_mask = mask_pos.any(1)  # [B,A]
        gt_idx = mask_pos.to(torch.uint8).argmax(1)  # [B,A]; 0 for background, masked below
        boxes = gt_bboxes.gather(1, gt_idx[..., None].expand(-1, -1, gt_bboxes.shape[-1])) * fg_mask[..., None]
        labels = gt_labels[..., 0].long().gather(1, gt_idx)
        scores = F.one_hot(labels, pd_scores.shape[-1]).to(pd_scores.dtype) * fg_mask[..., None]
        # TOOD: t / max_t(gt) * max_iou(gt), so each gt's best positive is
        # pushed towards its best IoU, not to 1, and weaker ones proportionally less.
        align = align * mask_pos
        max_align = align.amax(-1, keepdim=True)  # [B,M,1]
        max_iou = (overlaps * mask_pos).amax(-1, keepdim=True)
        norm = (align * max_iou / (max_align + self.eps)).amax(1)  # [B,A]
        return boxes, scores * norm[..., None].to(scores.dtype), fg_mask, gt_idx.long()


class DetectionLoss:
    """YOLOv8-style loss over the raw head maps: loss, items = DetectionLoss(nc)(feats, targets)."""

    def __init__(
        self,
        nc: int,
        reg_max: int = 16,
        strides: Sequence[float] = (8, 16, 32),
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        topk: int = 10,
        world_size: int = 1,
        topk2: int | None = None,
        min_side: float = 0.0,
        assign_ciou: bool = False,
    ):
        self.nc, self.reg_max, self.strides = nc, reg_max, tuple(strides)
        self.gains = (box, cls, dfl)  # dfl: the gain of the L1 term where reg_max is 1
        self.names = ("box_loss", "cls_loss", "dfl_loss" if reg_max > 1 else "l1_loss")  # the items, as logged
        self.assigner = TaskAlignedAssigner(topk=topk, topk2=topk2, min_side=min_side, ciou=assign_ciou)
        self.world_size = world_size
        self._anchor_cache: dict[tuple, tuple[Tensor, Tensor, Tensor]] = {}

    def __call__(self, feats: list[Tensor], targets: Tensor) -> tuple[Tensor, Tensor]:
        """feats: per level [B, 4*reg_max+nc, H, W]; targets [M,6] (img, cls, cx, cy, w, h; 0..1) -> (loss, items).

        items = the three terms (box, cls, dfl), each multiplied by its gain
        (7.5, 0.5, 1.5 by default), detached: the numbers ultralytics logs as
        box_loss, cls_loss, dfl_loss. loss = their sum x the global batch.

        This is where the scale of every step is decided, so that a global
        batch gives the same gradient however it is split over ranks (one
        rank x 8 images, 2 x 4, 4 x 2). Over the global batch the loss is
        ultralytics' single-process one: sum of the anchors' terms / the
        target-score mass S, times the batch B. With `world_size` N > 1,
        this rank's images are one share of it: S is summed over the ranks
        (one all-reduce of a detached scalar on the default process group;
        every rank must call the loss at every step, as DDP's forward
        already requires), and the share is multiplied by N because DDP
        averages the ranks' gradients (ultralytics multiplies by the world
        size for the same reason; it normalises by each rank's own S, so
        its ranks agree with one process only on average). The items are
        scaled alike: their mean over the ranks equals one process's items.
        """
        return self.from_gts(feats, self.gts(feats, targets))

    def gts(self, feats: list[Tensor], targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The targets as the assigner takes them (labels, xyxy boxes in
        pixels, mask; padded per image), on the maps' device. Made on the
        device the targets are on: from the loader's CPU batch (the trainer
        passes it), the padding is sized without waiting for the GPU and
        arrives in one copy that does not wait either."""
        device = feats[0].device
        gts = _gt_tensors(targets.float(), feats[0].shape[0], self._input_hw(feats))
        if targets.device == device:
            return gts
        packed = torch.cat(gts, -1)  # [B,K,6]: one copy
        if device.type == "cuda":
            packed = packed.pin_memory()
        labels, boxes, mask = packed.to(device, non_blocking=True).split((1, 4, 1), -1)
        return labels, boxes, mask.bool()

    def from_gts(self, feats: list[Tensor], gts: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """The loss and items of `feats` against targets made by gts()."""
        parts, _ = self.detection(feats, gts)
        return parts.sum() * (feats[0].shape[0] * self.world_size), parts.detach()

    def prepare(self, preds: list[Tensor], targets: Tensor):
        """The targets as from_prepared reads them (here gts()): made once
        for the two heads of an end-to-end loss."""
        return self.gts(preds, targets)

    def from_prepared(self, preds: list[Tensor], prepared) -> tuple[Tensor, Tensor]:
        """The loss and items of `preds` against targets made by prepare()."""
        return self.from_gts(preds, prepared)

    def detection(self, feats: list[Tensor], gts: tuple[Tensor, Tensor, Tensor],
                  extra: dict | None = None) -> tuple[Tensor, tuple]:
        """The three terms (box, cls, dfl; each times its gain) of `feats`
        against targets made by gts(), and the assignment: (foreground [B,A],
        each anchor's gt index [B,A], its gt box [B,A,4] xyxy in pixels).
        `extra`: handed on to the assigner (a mask-aware one's inputs)."""
        pred_dist, pred_logits = self._flatten(feats)
        points, strides, whwh = self._anchors(feats, pred_dist.dtype)
        gt_labels, gt_bboxes, mask_gt = gts
        pred_bboxes = self._decode(points, pred_dist)  # xyxy, grid units
        # The assigner compares boxes in pixels, like the gts.
        target_bboxes, target_scores, fg, gt_idx = self.assigner.assign(
            pred_logits.detach().sigmoid(), pred_bboxes.detach() * strides, points * strides,
            gt_labels, gt_bboxes, mask_gt, **(extra or {}),
        )
        assigned = fg, gt_idx, target_bboxes
        # Normalise by the soft target mass, as in YOLOv8, so the loss scale
        # does not depend on how many anchors won: the global batch's mass
        # (see above), at least 1 for empty batches.
        score_sum = self._global_mass(target_scores) / self.world_size
        cls = F.binary_cross_entropy_with_logits(pred_logits, target_scores, reduction="sum") / score_sum
        target_bboxes = target_bboxes / strides  # back to grid units, like the predictions
        box, dfl = self._box_losses(pred_dist, pred_bboxes, points, target_bboxes, target_scores, fg, score_sum,
                                    strides, whwh)
        box_gain, cls_gain, dfl_gain = self.gains
        return torch.stack((box * box_gain, cls * cls_gain, dfl * dfl_gain)), assigned

    def _anchors(self, feats: list[Tensor], dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """(points [A,2], strides [A,1], the input's w, h, w, h [4]) for
        maps of these sizes, made once per size, device and dtype: a step
        at one size launches no kernel and copies nothing for them."""
        key = (tuple(f.shape[-2:] for f in feats), feats[0].dtype, dtype, feats[0].device)
        if key not in self._anchor_cache:
            points, strides = (t.to(dtype) for t in make_anchors(feats, self.strides))
            h, w = self._input_hw(feats)
            self._anchor_cache[key] = points, strides, points.new_tensor([w, h, w, h])
        return self._anchor_cache[key]

    def set_epoch(self, epoch: int, epochs: int | None = None) -> None:
        """Nothing here changes with the epoch (EndToEndLoss's weights do)."""

    def example_targets(self, imgsz: int, device: torch.device):
        """Targets of a throwaway batch of two imgsz images (run/step.py
        settle_buckets): an object in the middle of each."""
        return torch.tensor([[0, 0, 0.5, 0.5, 0.25, 0.25], [1, 0, 0.5, 0.5, 0.25, 0.25]], device=device)

    def _global_mass(self, target_scores: Tensor) -> Tensor:
        """The target-score mass of the whole global batch, at least 1."""
        mass = target_scores.sum()
        if self.world_size > 1:
            torch.distributed.all_reduce(mass)  # no autograd here: target scores come from detached predictions
        return mass.clamp(min=1)

    def _flatten(self, feats: list[Tensor]) -> tuple[Tensor, Tensor]:
        """Level maps -> distribution logits [B,A,4*reg_max] and class logits [B,A,nc], float32."""
        assert len(feats) == len(self.strides), f"{len(feats)} feature maps for {len(self.strides)} strides"
        b, no = feats[0].shape[:2]
        assert no == 4 * self.reg_max + self.nc, f"head has {no} channels, expected 4*{self.reg_max}+{self.nc}"
        # float32 even under autocast: BCE sums over every anchor and class,
        # and DFL's log-softmax over bins is fragile in fp16.
        pred = torch.cat([f.flatten(2) for f in feats], 2).float().transpose(1, 2)  # [B,A,no]
        return pred.split((4 * self.reg_max, self.nc), dim=-1)

    def _input_hw(self, feats: list[Tensor]) -> tuple[float, float]:
        """Input image (height, width) in pixels, from the first level's size and stride."""
        h, w = feats[0].shape[-2:]
        return h * self.strides[0], w * self.strides[0]

    def _decode(self, points: Tensor, pred_dist: Tensor) -> Tensor:
        """Distribution logits [B,A,4*reg_max] (reg_max 1: the distances) -> xyxy boxes [B,A,4] around points,
        grid units."""
        if self.reg_max == 1:
            return dist2bbox(pred_dist, points, xywh=False)
        b, a, _ = pred_dist.shape
        bins = torch.arange(self.reg_max, dtype=pred_dist.dtype, device=pred_dist.device)
        ltrb = pred_dist.view(b, a, 4, self.reg_max).softmax(-1) @ bins  # expectation over bins
        return dist2bbox(ltrb, points, xywh=False)

    def _box_losses(
        self,
        pred_dist: Tensor,
        pred_bboxes: Tensor,
        points: Tensor,
        target_bboxes: Tensor,
        target_scores: Tensor,
        fg: Tensor,
        score_sum: Tensor,
        strides: Tensor,
        whwh: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """CIoU and DFL (reg_max 1: L1) losses over foreground anchors, weighted by their target scores.
        The foreground's indices are read once (the one wait for the GPU
        here); indexing by them, unlike by the mask, waits for nothing, in
        the backward pass too."""
        b, a = fg.nonzero(as_tuple=True)
        if not len(b):
            # Zero, yet attached to the regression outputs: DDP expects every
            # parameter to get a gradient each step, even on a rank whose batch
            # has nothing to regress.
            zero = pred_dist.new_zeros(()) + pred_dist.sum() * 0  # new_zeros + : no -0.0 in the logs
            return zero, zero
        weight = target_scores.sum(-1)[b, a].unsqueeze(-1)  # [n,1]
        iou = bbox_iou(pred_bboxes[b, a], target_bboxes[b, a], ciou=True)
        box = ((1.0 - iou) * weight).sum() / score_sum
        if self.reg_max == 1:
            # The four distances in pixels over the image's width or height.
            scale = strides[a] / whwh  # [n,4]
            ltrb = bbox2dist(points[a], target_bboxes[b, a])
            l1 = F.l1_loss(pred_dist[b, a] * scale, ltrb * scale, reduction="none").mean(-1, keepdim=True)
            return box, (l1 * weight).sum() / score_sum
        # reg_max - 1 is the largest bin value: targets stay below it so both
        # DFL bins exist.
        ltrb = bbox2dist(points[a], target_bboxes[b, a], self.reg_max - 1)  # [n,4]
        dfl = (_dfl(pred_dist[b, a].view(-1, self.reg_max), ltrb) * weight).sum() / score_sum
        return box, dfl


class EndToEndLoss:
    """YOLO26's loss over both heads: loss, items = EndToEndLoss(...)((maps, one2one_maps), targets).

    The one-to-many head learns as YOLOv8's does (top 10 anchors per gt);
    the one-to-one head, on the same targets, learns one prediction per
    object (the top 7 candidates, then the single best), which is what lets
    it skip NMS. ProgLoss: the one-to-many share of the sum falls linearly
    from 0.8 in the first epoch to 0.1 in the last, the one-to-one head gets
    the rest; call set_epoch at the start of each epoch (a pure function of
    the epoch: a resumed run weighs as the uninterrupted one). The items are
    the one-to-one head's (box, cls, l1), as ultralytics logs them.

    `head_loss`: each head's loss (DetectionLoss; segment_loss.py's
    SegmentationLoss for a segmenter, whose outputs and targets it reads),
    made with `options` besides the gains.
    """

    start, end = 0.8, 0.1  # the one-to-many share in the first and the last epoch

    def __init__(self, nc: int, epochs: int, strides: Sequence[float] = (8, 16, 32), world_size: int = 1,
                 head_loss: type = DetectionLoss, options: dict | None = None, **gains: float):
        # STAL: widened to the middle stride, 16 px.
        common = dict(nc=nc, reg_max=1, strides=strides, world_size=world_size, min_side=strides[1],
                      assign_ciou=True, **(options or {}), **gains)
        self.one2many = head_loss(topk=10, **common)
        self.one2one = head_loss(topk=7, topk2=1, **common)
        self.epochs, self.epoch = epochs, 0
        self.names = self.one2one.names

    def set_epoch(self, epoch: int, epochs: int | None = None) -> None:
        """The epoch being trained, and the run's planned epochs where they
        changed (`time`: the share falls to its end over the plan)."""
        self.epoch, self.epochs = epoch, epochs or self.epochs

    def example_targets(self, imgsz: int, device: torch.device):
        return self.one2one.example_targets(imgsz, device)

    @property
    def one2many_share(self) -> float:
        left = max(1 - self.epoch / max(self.epochs - 1, 1), 0.0)  # 1 in the first epoch, 0 in the last
        return self.end + (self.start - self.end) * left

    def __call__(self, feats: tuple, targets) -> tuple[Tensor, Tensor]:
        maps, one2one_maps = feats
        share = self.one2many_share
        prepared = self.one2many.prepare(maps, targets)  # the same targets for both heads: made once
        many, _ = self.one2many.from_prepared(maps, prepared)
        one, items = self.one2one.from_prepared(one2one_maps, prepared)
        return many * share + one * (1 - share), items


def _dfl(logits: Tensor, target: Tensor) -> Tensor:
    """Distribution focal loss: logits [n*4, bins], target [n,4] in bin units -> [n,1] (mean over sides)."""
    t = target.reshape(-1)
    left = t.long()
    w_left = (left + 1) - t  # weight of floor(t) grows as t approaches it
    ce_left = F.cross_entropy(logits, left, reduction="none")
    ce_right = F.cross_entropy(logits, left + 1, reduction="none")
    loss = ce_left * w_left + ce_right * (1 - w_left)
    return loss.view(-1, 4).mean(-1, keepdim=True)


def _gt_tensors(targets: Tensor, batch: int, input_hw: tuple[float, float]) -> tuple[Tensor, Tensor, Tensor]:
    """targets [M,6] (img, cls, cx, cy, w, h; 0..1) -> labels [B,K,1], xyxy px [B,K,4], mask [B,K,1].

    K is the largest number of gts in one image; shorter images are padded and masked.
    """
    img = targets[:, 0].long()
    counts = torch.bincount(img, minlength=batch)
    most = int(counts.max()) if len(img) else 0
    order = img.argsort(stable=True)
    img, targets = img[order], targets[order]
    slot = torch.arange(len(img), device=img.device) - (counts.cumsum(0) - counts)[img]  # rank within its image
    h, w = input_hw
    labels = targets.new_zeros(batch, most, 1)
    boxes = targets.new_zeros(batch, most, 4)
    mask = torch.zeros(batch, most, 1, dtype=torch.bool, device=targets.device)
    labels[img, slot, 0] = targets[:, 1]
    boxes[img, slot] = xywh2xyxy(targets[:, 2:6] * targets.new_tensor([w, h, w, h]))
    mask[img, slot, 0] = True
    return labels, boxes, mask
