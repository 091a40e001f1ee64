"""The instance-segmentation losses of ultralytics 8.4: YOLOv8's and
YOLO11's (v8SegmentationLoss), the detection loss (loss.py's DetectionLoss,
the same assignment) plus a mask term; and YOLO26's (E2ELoss of
SegmentLoss26: EndToEndSegmentationLoss here), which adds a mask-aware
assignment and a semantic-map term, over its two heads.

Each foreground anchor's mask is its 32 coefficients times the prototypes
(upsampled to the ground-truth masks' resolution where those are finer, as
ultralytics does at mask_ratio < 4); its loss is the per-pixel binary cross
entropy against its assigned object's mask, inside that object's box only,
averaged over the mask's pixels and divided by the box's share of the image
(so small objects weigh as much as large ones), summed over the foreground and
divided by the number of foreground anchors. The term takes the box gain, as
ultralytics' does.

YOLO26 (ultralytics 8.4's numbers):
- the assignment's overlap of a (gt, anchor) pair is the mean of the boxes'
  CIoU and the masks' IoU: the anchor's predicted mask (its coefficients
  times the prototypes, above 0, cut to its predicted box) against the gt's
  mask, both at the prototypes' resolution; measured for each gt's 3 x topk
  best candidates by the box alignment (the others' mask IoU counts as 0).
  The positives, the choice between gts and the soft class targets all
  favour anchors with good masks.
- the prototype net's semantic map (training only: nc logits a pixel at an
  eighth of the input) learns each pixel's class: the class of the object
  covering it (overlapping masks: the map's; one mask per object: the
  smallest mask covering it, the first of equals), no class where none does;
  half the mean binary cross entropy, half the Dice loss (smoothing 1, per
  image and class, averaged), times the box gain; logged as sem_loss (0
  without the map: YOLOv8, YOLO11, and validation, which has none). As
  ultralytics', only where the batch has a foreground anchor.
- the one-to-one head learns on the same targets with detached prototypes
  and semantic map (model/segment.py): its terms train its own branches.

Masks come in ultralytics' two layouts: overlapping (overlap_mask, its
default) one [H, W] map per image whose pixel value k marks the image's k-th
object (0 background), or one [H, W] mask per object in the targets' order.

As the detection terms are, the mask term is normalised by the global batch
(its foreground count summed over the ranks), so that one rank and many take
the same step; the semantic term is a mean over the images, which the ranks'
equal shares average to the global batch's, and is taken where the global
batch has a foreground."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.boxes import bbox_iou
from ..model.segment import crop_to_boxes as crop
from .loss import DetectionLoss, EndToEndLoss, TaskAlignedAssigner

MASK_CANDIDATES = 3  # a gt's mask IoU is measured for its MASK_CANDIDATES x topk best anchors by the box alignment
MASK_CHUNK = 1 << 25  # predicted-mask pixels decoded at once for the assignment (128 MB of float32)


class Prepared(NamedTuple):
    """A batch's targets on the loss's device, made once for both heads of an end-to-end loss."""

    gts: tuple[Tensor, Tensor, Tensor]  # DetectionLoss.gts(): labels [B,M,1], xyxy px [B,M,4], valid [B,M,1]
    masks: Tensor  # the loader's masks as float: [B,H,W] maps (overlap) or [N,H,W]
    image_of: Tensor  # [N]: each target's image
    slot: Tensor  # [N]: each target's place among its image's (its index in gts' M)


class MaskAlignedAssigner(TaskAlignedAssigner):
    """The task-aligned assignment whose overlap is the mean of the box CIoU
    and the predicted mask's IoU with the gt's (ultralytics 8.4's
    SegTaskAlignedAssigner). assign() takes coefficients [B,A,32], proto
    [B,32,h,w], gt_masks [B,M,h,w] bool and mask_scale (prototype pixels per
    input pixel) besides the boxes."""

    def _alignment(self, pd_scores: Tensor, pd_bboxes: Tensor, gt_labels: Tensor, gt_bboxes: Tensor,
                   candidates: Tensor, *, coefficients: Tensor, proto: Tensor, gt_masks: Tensor,
                   mask_scale: float) -> tuple[Tensor, Tensor]:
        b, m, a = candidates.shape
        bi, mi, ai = candidates.nonzero(as_tuple=True)
        score = pd_scores[bi, ai, gt_labels[bi, mi, 0].long()]
        iou = bbox_iou(gt_bboxes[bi, mi], pd_bboxes[bi, ai], ciou=self.ciou).squeeze(-1).clamp(min=0)
        # The box alignment picks whose masks are measured; eps keeps a zero-metric candidate among them.
        box_align = pd_scores.new_zeros(b, m, a)
        box_align[bi, mi, ai] = (score.pow(self.alpha) * iou.pow(self.beta)).to(box_align.dtype) + self.eps
        best = box_align.topk(min(MASK_CANDIDATES * self.topk, a), dim=-1).indices
        measured = torch.zeros_like(candidates).scatter_(-1, best, True)[bi, mi, ai].nonzero().squeeze(1)
        mask_iou = torch.zeros_like(iou)
        if len(measured):
            mask_iou[measured] = self._mask_ious(bi[measured], mi[measured], ai[measured], pd_bboxes, coefficients,
                                                 proto, gt_masks, mask_scale).to(iou.dtype)
        scores = pd_scores.new_zeros(b, m, a)
        overlaps = pd_bboxes.new_zeros(b, m, a)
        scores[bi, mi, ai] = score
        overlaps[bi, mi, ai] = ((iou + mask_iou) / 2).to(overlaps.dtype)
        return scores.pow(self.alpha) * overlaps.pow(self.beta), overlaps

    @staticmethod
    def _mask_ious(bi: Tensor, mi: Tensor, ai: Tensor, pd_bboxes: Tensor, coefficients: Tensor, proto: Tensor,
                   gt_masks: Tensor, mask_scale: float) -> Tensor:
        """The IoU of each pair's predicted mask (anchor ai of image bi) with
        gt mi's, at the prototypes' resolution; each anchor's mask made once.
        In float32 outside autocast, so that the pixel counts are exact."""
        h, w = proto.shape[-2:]
        step = max(1, MASK_CHUNK // (h * w))
        out = torch.zeros(len(bi), dtype=torch.float32, device=proto.device)
        with torch.autocast(proto.device.type, enabled=False):
            for img in bi.unique().tolist():
                pairs = (bi == img).nonzero().squeeze(1)
                anchors, which = ai[pairs].unique(return_inverse=True)
                gt = gt_masks[img].flatten(1).float()  # [M, h*w]
                ious = []
                for first in range(0, len(anchors), step):
                    chunk = anchors[first:first + step]
                    logits = (coefficients[img, chunk].float() @ proto[img].float().flatten(1)).view(-1, h, w)
                    pred = crop((logits > 0).float(), pd_bboxes[img, chunk].float() * mask_scale).flatten(1)
                    inter = gt @ pred.T  # [M, n]
                    union = gt.sum(1, keepdim=True) + pred.sum(1)[None] - inter
                    ious.append(inter / union.clamp(min=1))
                out[pairs] = torch.cat(ious, 1)[mi[pairs], which]
        return out


class SegmentationLoss(DetectionLoss):
    """loss, items = SegmentationLoss(nc)((maps, coefficients, prototypes[, semantic]), targets, masks).

    `mask_aware`: YOLO26's assignment (MaskAlignedAssigner)."""

    def __init__(self, nc: int, reg_max: int = 16, strides: Sequence[float] = (8, 16, 32), *, overlap: bool = True,
                 mask_aware: bool = False, **kwargs):
        super().__init__(nc, reg_max, strides, **kwargs)
        self.overlap, self.mask_aware = overlap, mask_aware
        if mask_aware:
            a = self.assigner
            self.assigner = MaskAlignedAssigner(topk=a.topk, alpha=a.alpha, beta=a.beta, eps=a.eps, topk2=a.topk2,
                                                min_side=a.min_side, ciou=a.ciou)
        box, cls, dfl = self.names
        # ultralytics' order; sem_loss is YOLO26's semantic-map term, which 8.4 logs as 0 for YOLOv8 and YOLO11
        self.names = (box, "seg_loss", cls, dfl, "sem_loss")

    def __call__(self, preds: tuple, targets: Tensor | tuple[Tensor, Tensor],
                 masks: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """preds: the detector's maps per level [B, 4*reg_max+nc, H, W], the
        mask coefficients per level [B, 32, H, W], the prototypes [B, 32, h, w]
        and, optionally (YOLO26 while training), the semantic map [B, nc, H/8,
        W/8] or None; targets [M, 6] (img, cls, cx, cy, w, h; 0..1); masks
        [B, H', W'] (overlap) or [M, H', W'], or both as the loader's
        (targets, masks). -> (loss, items: box, seg, cls, dfl, sem, each times
        its gain; sem 0 without a semantic map): loss = their sum x the global
        batch."""
        if masks is not None:
            targets = (targets, masks)
        return self.from_prepared(preds, self.prepare(preds, targets))

    def prepare(self, preds: tuple, targets: tuple[Tensor, Tensor]) -> Prepared:
        """The loader's (targets, masks) as from_prepared reads them."""
        rows, masks = targets
        feats = preds[0]
        image_of = rows[:, 0].long()
        counts = torch.bincount(image_of, minlength=feats[0].shape[0])
        order = image_of.argsort(stable=True)
        slot = torch.empty_like(image_of)  # as gts() places them: the targets' order within each image
        slot[order] = torch.arange(len(image_of), device=image_of.device) - (counts.cumsum(0) - counts)[image_of[order]]
        device = feats[0].device
        return Prepared(self.gts(feats, rows), masks.to(device).float(), image_of.to(device), slot.to(device))

    def from_prepared(self, preds: tuple, prepared: Prepared) -> tuple[Tensor, Tensor]:
        feats, coefficients, proto = preds[:3]
        semantic = preds[3] if len(preds) > 3 else None
        pred_masks = torch.cat([c.flatten(2) for c in coefficients], 2).float().transpose(1, 2)  # [B,A,32]
        proto = proto.float()
        extra = self._assign_masks(prepared, pred_masks, proto, feats) if self.mask_aware else None
        parts, (fg, gt_idx, target_bboxes) = self.detection(feats, prepared.gts, extra)
        seg, count = self._masks(fg, gt_idx, target_bboxes, prepared.image_of, proto, pred_masks, prepared.masks,
                                 self._input_hw(feats))
        box, cls, dfl = parts
        if semantic is None:
            sem = torch.zeros_like(box)
        elif bool(count > 0):  # as ultralytics: only where the (global) batch has a foreground
            sem = self._semantic(semantic.float(), prepared)
        else:
            sem = (semantic.float() * 0).sum()  # zero, yet attached: DDP wants a gradient for every parameter
        parts = torch.stack((box, seg * self.gains[0], cls, dfl, sem * self.gains[0]))
        return parts.sum() * (fg.shape[0] * self.world_size), parts.detach()

    def example_targets(self, imgsz: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """DetectionLoss's, with each object's mask (its box) at the prototypes' resolution."""
        targets, side = super().example_targets(imgsz, device), imgsz // 4
        masks = torch.zeros((2, side, side), dtype=torch.uint8, device=device)
        masks[:, 3 * side // 8:5 * side // 8, 3 * side // 8:5 * side // 8] = 1
        return targets, masks  # one map per image, or one mask per object: the same here (one object each)

    def _assign_masks(self, prepared: Prepared, pred_masks: Tensor, proto: Tensor, feats: list[Tensor]) -> dict:
        """MaskAlignedAssigner's inputs: each gt's mask [B,M,h,w] at the
        prototypes' resolution (nearest), where gts() placed its box."""
        b, m = prepared.gts[0].shape[:2]
        h, w = proto.shape[-2:]
        masks = prepared.masks
        if masks.numel() and masks.shape[-2:] != (h, w):
            masks = F.interpolate(masks[None], (h, w), mode="nearest")[0]
        if self.overlap:
            gt_masks = masks[:, None] == torch.arange(1, m + 1, device=masks.device, dtype=masks.dtype)[:, None, None]
        else:
            gt_masks = torch.zeros((b, m, h, w), dtype=torch.bool, device=masks.device)
            gt_masks[prepared.image_of, prepared.slot] = masks > 0.5
        return dict(coefficients=pred_masks.detach(), proto=proto.detach(), gt_masks=gt_masks,
                    mask_scale=h / self._input_hw(feats)[0])

    def _semantic(self, semantic: Tensor, prepared: Prepared) -> Tensor:
        """The semantic map's term (before its gain): half BCE, half Dice
        against each pixel's class, one-hot (no class where no object is),
        made at the masks' resolution and taken to the map's (nearest)."""
        masks, labels = prepared.masks, prepared.gts[0][..., 0].long()  # labels [B,M]
        b, nc = semantic.shape[:2]
        if self.overlap:  # a pixel of value k is its image's k-th object's
            classes = F.pad(labels, (1, 0)).gather(1, masks.long().flatten(1)).view(masks.shape)
            present = masks != 0
        else:  # the smallest mask covering the pixel, the first of equals
            n, h, w = masks.shape
            area = masks.sum((1, 2)).long()
            none = int(area.max() + 1) * n if n else 1  # above every key
            key = torch.where(masks > 0, (area * n + torch.arange(n, device=masks.device))[:, None, None], none)
            first = torch.full((b, h, w), none, dtype=torch.long, device=masks.device)
            first = first.scatter_reduce(0, prepared.image_of.view(-1, 1, 1).expand(n, h, w), key, "amin")
            present = first < none
            owner = torch.where(present, first % max(n, 1), 0)
            classes = labels[prepared.image_of[owner], prepared.slot[owner]] if n else torch.zeros_like(first)
        target = torch.zeros((b, nc, *masks.shape[-2:]), device=semantic.device)
        target.scatter_(1, classes[:, None], present[:, None].float())
        if target.shape[-2:] != semantic.shape[-2:]:
            target = F.interpolate(target, semantic.shape[-2:], mode="nearest")
        bce = F.binary_cross_entropy_with_logits(semantic, target)
        p = semantic.sigmoid()
        dice = (2 * (p * target).sum((2, 3)) + 1) / (p.sum((2, 3)) + target.sum((2, 3)) + 1)
        return 0.5 * bce + 0.5 * (1 - dice).mean()

    def _masks(self, fg: Tensor, gt_idx: Tensor, target_bboxes: Tensor, image_of: Tensor, proto: Tensor,
               pred_masks: Tensor, masks: Tensor, input_hw: tuple[float, float]) -> tuple[Tensor, Tensor]:
        """The mask term (before its gain), over the foreground of every
        image; and the global batch's foreground count (over the ranks, / ranks)."""
        count = fg.sum().float()
        if self.world_size > 1:
            torch.distributed.all_reduce(count)  # no autograd: the assignment is detached
        count = count / self.world_size
        if not bool(fg.any()):
            # Zero, yet attached to the coefficients and prototypes: DDP wants a gradient for every parameter.
            return (proto * 0).sum() + (pred_masks * 0).sum(), count
        if masks.shape[-2:] != proto.shape[-2:]:  # finer gt masks (mask_ratio < 4): the prototypes upsampled
            proto = F.interpolate(proto, masks.shape[-2:], mode="bilinear", align_corners=False)
        mask_h, mask_w = proto.shape[-2:]
        h, w = input_hw
        normalised = target_bboxes / target_bboxes.new_tensor([w, h, w, h])
        area = (normalised[..., 2] - normalised[..., 0]) * (normalised[..., 3] - normalised[..., 1])  # [B,A]
        boxes = normalised * normalised.new_tensor([mask_w, mask_h, mask_w, mask_h])  # in mask pixels
        loss = proto.new_zeros(())
        for i in range(fg.shape[0]):
            picked = fg[i]
            if not bool(picked.any()):
                continue
            idx = gt_idx[i][picked]
            if self.overlap:
                gt = (masks[i] == (idx + 1).view(-1, 1, 1).to(masks.dtype)).float()
            else:
                gt = masks[image_of == i][idx]
            logits = torch.einsum("nk,khw->nhw", pred_masks[i][picked], proto[i])
            bce = F.binary_cross_entropy_with_logits(logits, gt, reduction="none")
            loss = loss + (crop(bce, boxes[i][picked]).mean(dim=(1, 2)) / area[i][picked]).sum()
        return loss / count, count


class EndToEndSegmentationLoss(EndToEndLoss):
    """YOLO26's segmentation loss over both heads (ultralytics' E2ELoss of
    SegmentLoss26): loss, items = EndToEndSegmentationLoss(nc, epochs)(
    ((maps, coefficients, proto, semantic), (the one-to-one head's maps and
    coefficients, proto, semantic)), (targets, masks)). EndToEndLoss's
    weighting of the heads; the one-to-one head's items (box, seg, cls, l1,
    sem), as ultralytics logs them."""

    def __init__(self, nc: int, epochs: int, strides: Sequence[float] = (8, 16, 32), world_size: int = 1, *,
                 overlap: bool = True, **gains: float):
        super().__init__(nc, epochs, strides, world_size, head_loss=SegmentationLoss,
                         options=dict(overlap=overlap, mask_aware=True), **gains)
        self.overlap = overlap
