"""The instance-segmentation loss of YOLOv8 and YOLO11 (ultralytics 8.4's
v8SegmentationLoss): the detection loss (loss.py's DetectionLoss, the same
assignment) plus a mask term.

Each foreground anchor's mask is its 32 coefficients times the prototypes
(upsampled to the ground-truth masks' resolution where those are finer, as
ultralytics does at mask_ratio < 4); its loss is the per-pixel binary cross
entropy against its assigned object's mask, inside that object's box only,
averaged over the mask's pixels and divided by the box's share of the image
(so small objects weigh as much as large ones), summed over the foreground and
divided by the number of foreground anchors. The term takes the box gain, as
ultralytics' does.

Masks come in ultralytics' two layouts: overlapping (overlap_mask, its
default) one [H, W] map per image whose pixel value k marks the image's k-th
object (0 background), or one [H, W] mask per object in the targets' order.

As the detection terms are, the mask term is normalised by the global batch
(its foreground count summed over the ranks), so that one rank and many take
the same step."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.segment import crop_to_boxes as crop
from .loss import DetectionLoss


class SegmentationLoss(DetectionLoss):
    """loss, items = SegmentationLoss(nc)((maps, coefficients, prototypes), targets, masks)."""

    def __init__(self, nc: int, reg_max: int = 16, strides: Sequence[float] = (8, 16, 32), *, overlap: bool = True,
                 **kwargs):
        super().__init__(nc, reg_max, strides, **kwargs)
        self.overlap = overlap
        box, cls, dfl = self.names
        # ultralytics' order; sem_loss is YOLO26's semantic-map term, which 8.4 logs as 0 for YOLOv8 and YOLO11
        self.names = (box, "seg_loss", cls, dfl, "sem_loss")

    def __call__(self, preds: tuple[list[Tensor], list[Tensor], Tensor], targets: Tensor | tuple[Tensor, Tensor],
                 masks: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """preds: the detector's maps per level [B, 4*reg_max+nc, H, W], the
        mask coefficients per level [B, 32, H, W], the prototypes [B, 32, h, w];
        targets [M, 6] (img, cls, cx, cy, w, h; 0..1); masks [B, H', W']
        (overlap) or [M, H', W'], or both as the loader's (targets, masks).
        -> (loss, items: box, seg, cls, dfl, each times its gain, and sem (0)): loss =
        their sum x the global batch."""
        if masks is None:
            targets, masks = targets
        feats, coefficients, proto = preds
        parts, (fg, gt_idx, target_bboxes) = self.detection(feats, self.gts(feats, targets))
        pred_masks = torch.cat([c.flatten(2) for c in coefficients], 2).float().transpose(1, 2)  # [B,A,32]
        seg = self._masks(fg, gt_idx, target_bboxes, targets[:, 0].long().to(fg.device), proto.float(), pred_masks,
                          masks.to(fg.device).float(), self._input_hw(feats))
        box, cls, dfl = parts
        parts = torch.stack((box, seg * self.gains[0], cls, dfl, torch.zeros_like(box)))
        return parts.sum() * (fg.shape[0] * self.world_size), parts.detach()

    def example_targets(self, imgsz: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """DetectionLoss's, with each object's mask (its box) at the prototypes' resolution."""
        targets, side = super().example_targets(imgsz, device), imgsz // 4
        masks = torch.zeros((2, side, side), dtype=torch.uint8, device=device)
        masks[:, 3 * side // 8:5 * side // 8, 3 * side // 8:5 * side // 8] = 1
        return targets, masks  # one map per image, or one mask per object: the same here (one object each)

    def _masks(self, fg: Tensor, gt_idx: Tensor, target_bboxes: Tensor, image_of: Tensor, proto: Tensor,
               pred_masks: Tensor, masks: Tensor, input_hw: tuple[float, float]) -> Tensor:
        """The mask term (before its gain), over the foreground of every image."""
        count = fg.sum().float()
        if self.world_size > 1:
            torch.distributed.all_reduce(count)  # no autograd: the assignment is detached
        count = count / self.world_size
        if not bool(fg.any()):
            # Zero, yet attached to the coefficients and prototypes: DDP wants a gradient for every parameter.
            return (proto * 0).sum() + (pred_masks * 0).sum()
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
        return loss / count

