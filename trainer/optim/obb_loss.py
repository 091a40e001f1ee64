"""The oriented-box losses of ultralytics 8.4: YOLOv8's and YOLO11's
(v8OBBLoss), the detection loss (loss.py's DetectionLoss) on rotated boxes
plus an angle term; and YOLO26's (E2ELoss of v8OBBLoss: EndToEndOBBLoss
here), the same over its two heads.

As ultralytics defines them (the numbers are its):
- targets are (cx, cy, w, h, r): a rotated box, r in radians; objects whose
  w or h is under 2 px at the input's size are dropped before anything else
  (ultralytics: "to stabilize training");
- the assignment (RotatedTaskAlignedAssigner) is the task-aligned one with
  the rotated box's ProbIoU as its overlap (rboxes.probiou) and, as
  candidates, the anchors inside the rotated box (its edges included), sides
  shorter than the middle stride widened to it about the centre (STAL, every
  family here, as ultralytics 8.4 applies it); an anchor several gts pick
  goes to the gt it overlaps most among all it is a candidate of (ultralytics'
  rule, not TaskAlignedAssigner's);
- a prediction is ltrb distances in the box's own frame and the head's angle
  (model/obb.py), decoded by rboxes.dist2rbox; the box term is 1 - ProbIoU
  with 0.01 added to both variances (bounds the gradients of sub-pixel
  boxes); the distance term DFL over rbox2dist's distances (reg_max 16) or,
  without bins (YOLO26), L1 on them as fractions of the image;
- the angle term: sin^2(2 (r_pred - r_gt)) (pi-periodic and blind to the
  swap of w and h), weighted by exp(-ln(w/h)^2 / 9), near 0 for squares
  whose angle is ill-defined, and by the target score, over the target-score
  mass; its gain is ultralytics' `angle` (1.0);
- the items are box, cls, dfl (l1 without bins) and angle, each times its gain.

The world size scales every term as DetectionLoss's docstring says: the
global batch's target-score mass, and the sum times the global batch."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.rboxes import dist2rbox, probiou, rbox2dist, xywhr2xyxyxyxy
from .loss import DetectionLoss, EndToEndLoss, TaskAlignedAssigner, _dfl

MIN_SIDE_PX = 2.0  # targets narrower than this at the input's size are dropped (ultralytics v8OBBLoss)
PROBIOU_FLOOR = 0.01  # added to both Gaussians' variances in the box term (ultralytics RotatedBboxLoss.floor)
ANGLE_ASPECT = 3.0  # the aspect-ratio weight's width, exp(-ln(w/h)^2 / ANGLE_ASPECT^2) (ultralytics' lambda_val)


class RotatedTaskAlignedAssigner(TaskAlignedAssigner):
    """TaskAlignedAssigner on xywhr boxes (ultralytics' RotatedTaskAlignedAssigner):
    the overlap is ProbIoU, the candidates the anchors inside the rotated box."""

    def _widened(self, gt_bboxes: Tensor) -> Tensor:
        """gt sides shorter than min_side set to it, the centre and angle kept (STAL)."""
        if not self.min_side:
            return gt_bboxes
        wh = gt_bboxes[..., 2:4]
        return torch.cat((gt_bboxes[..., :2], torch.where(wh < self.min_side, self.min_side, wh), gt_bboxes[..., 4:]),
                         -1)

    def _inside_gts(self, points: Tensor, gt_bboxes: Tensor) -> Tensor:
        """[B,M,A]: the anchor point projects onto both edges from the box's first
        corner within their lengths (inside or on the rotated box)."""
        a, b, _, d = xywhr2xyxyxyxy(gt_bboxes).split(1, dim=-2)  # each [B,M,1,2]
        ab, ad = b - a, d - a
        ap = points[None, None] - a  # [B,M,A,2]
        along_ab, along_ad = (ap * ab).sum(-1), (ap * ad).sum(-1)
        return ((along_ab >= 0) & (along_ab <= (ab * ab).sum(-1)) & (along_ad >= 0)
                & (along_ad <= (ad * ad).sum(-1)))

    def _one_gt_per_anchor(self, mask_pos: Tensor, overlaps: Tensor) -> Tensor:
        """An anchor picked by several gts goes to the gt it overlaps most among
        all those it is a candidate of, as ultralytics' select_highest_overlaps
        does, even one whose top k did not pick it (TaskAlignedAssigner keeps
        the winner among the gts that picked it: crowded scenes then assign
        otherwise than ultralytics, the `dense` case of the loss reference)."""
        multi = mask_pos.sum(1, keepdim=True) > 1  # [B,1,A]
        best = overlaps.argmax(1, keepdim=True)
        return torch.where(multi, torch.zeros_like(mask_pos).scatter_(1, best, True), mask_pos)

    def _alignment(self, pd_scores: Tensor, pd_bboxes: Tensor, gt_labels: Tensor, gt_bboxes: Tensor,
                   candidates: Tensor) -> tuple[Tensor, Tensor]:
        b, m, a = candidates.shape
        scores, overlaps = pd_scores.new_zeros(b, m, a), pd_bboxes.new_zeros(b, m, a)
        bi, mi, ai = candidates.nonzero(as_tuple=True)
        scores[bi, mi, ai] = pd_scores[bi, ai, gt_labels[bi, mi, 0].long()]
        overlaps[bi, mi, ai] = probiou(gt_bboxes[bi, mi], pd_bboxes[bi, ai]).squeeze(-1).clamp(min=0)
        return scores.pow(self.alpha) * overlaps.pow(self.beta), overlaps


class Prepared(NamedTuple):
    """A batch's rotated targets on the loss's device, made once for both heads of an end-to-end loss."""

    labels: Tensor  # [B,K,1]
    boxes: Tensor  # [B,K,5] xywhr, pixels and radians
    mask: Tensor  # [B,K,1] bool


class OBBLoss(DetectionLoss):
    """loss, items = OBBLoss(nc)((maps, angles), targets): ultralytics' v8OBBLoss.

    maps per level [B, 4*reg_max + nc, H, W] and angles per level [B, 1, H, W]
    in radians (OBBModel.forward); targets [M, 7] (img, cls, cx, cy, w, h, r:
    the centre and sides as fractions of the input, r in radians). The
    assignment's overlap is ProbIoU whatever `assign_ciou` says (an
    end-to-end loss's common option, for the axis-aligned heads)."""

    def __init__(self, nc: int, reg_max: int = 16, strides: Sequence[float] = (8, 16, 32), *, angle: float = 1.0,
                 **kwargs):
        super().__init__(nc, reg_max, strides, **kwargs)
        a = self.assigner
        self.assigner = RotatedTaskAlignedAssigner(topk=a.topk, alpha=a.alpha, beta=a.beta, eps=a.eps, topk2=a.topk2,
                                                   min_side=a.min_side)
        self.angle_gain = angle
        self.names = (*self.names, "angle_loss")

    def __call__(self, preds: tuple, targets: Tensor) -> tuple[Tensor, Tensor]:
        return self.from_prepared(preds, self.prepare(preds, targets))

    def prepare(self, preds: tuple, targets: Tensor) -> Prepared:
        """The targets padded per image (labels, xywhr in pixels, mask) on the maps' device, the tiny ones dropped."""
        feats = preds[0]
        h, w = self._input_hw(feats)
        targets = targets.float()
        targets = targets[(targets[:, 4] * w >= MIN_SIDE_PX) & (targets[:, 5] * h >= MIN_SIDE_PX)]
        img = targets[:, 0].long()
        batch = feats[0].shape[0]
        counts = torch.bincount(img, minlength=batch)
        order = img.argsort(stable=True)
        img, targets = img[order], targets[order]
        slot = torch.arange(len(img), device=img.device) - (counts.cumsum(0) - counts)[img]
        most = int(counts.max()) if len(img) else 0
        labels, boxes = targets.new_zeros(batch, most, 1), targets.new_zeros(batch, most, 5)
        mask = torch.zeros(batch, most, 1, dtype=torch.bool, device=targets.device)
        labels[img, slot, 0] = targets[:, 1]
        boxes[img, slot] = targets[:, 2:7] * targets.new_tensor([w, h, w, h, 1])
        mask[img, slot, 0] = True
        device = feats[0].device
        return Prepared(labels.to(device), boxes.to(device), mask.to(device))

    def from_prepared(self, preds: tuple, prepared: Prepared) -> tuple[Tensor, Tensor]:
        feats, angles = preds
        pred_dist, pred_logits = self._flatten(feats)
        pred_angle = torch.cat([a.flatten(2) for a in angles], 2).float().transpose(1, 2)  # [B,A,1]
        points, strides, whwh = self._anchors(feats, pred_dist.dtype)
        pred_bboxes = torch.cat((dist2rbox(self._distances(pred_dist), pred_angle, points), pred_angle), -1)
        pixels = torch.cat((pred_bboxes[..., :4].detach() * strides, pred_bboxes[..., 4:].detach()), -1)
        target_bboxes, target_scores, fg, _ = self.assigner.assign(
            pred_logits.detach().sigmoid(), pixels, points * strides, *prepared)
        score_sum = self._global_mass(target_scores) / self.world_size
        cls = F.binary_cross_entropy_with_logits(pred_logits, target_scores, reduction="sum") / score_sum
        target_bboxes = torch.cat((target_bboxes[..., :4] / strides, target_bboxes[..., 4:]), -1)  # grid units
        box, dfl, angle = self._rotated_losses(pred_dist, pred_bboxes, points, target_bboxes, target_scores, fg,
                                               score_sum, strides, whwh)
        box_gain, cls_gain, dfl_gain = self.gains
        parts = torch.stack((box * box_gain, cls * cls_gain, dfl * dfl_gain, angle * self.angle_gain))
        return parts.sum() * (fg.shape[0] * self.world_size), parts.detach()

    def example_targets(self, imgsz: int, device: torch.device) -> Tensor:
        """A box turned by 0.3 rad in the middle of each of two images."""
        return torch.tensor([[0, 0, 0.5, 0.5, 0.25, 0.125, 0.3], [1, 0, 0.5, 0.5, 0.25, 0.125, 0.3]], device=device)

    def _distances(self, pred_dist: Tensor) -> Tensor:
        """[B,A,4*reg_max] -> the four distances [B,A,4] (reg_max 1: as they are)."""
        if self.reg_max == 1:
            return pred_dist
        b, a, _ = pred_dist.shape
        bins = torch.arange(self.reg_max, dtype=pred_dist.dtype, device=pred_dist.device)
        return pred_dist.view(b, a, 4, self.reg_max).softmax(-1) @ bins

    def _rotated_losses(self, pred_dist: Tensor, pred_bboxes: Tensor, points: Tensor, target_bboxes: Tensor,
                        target_scores: Tensor, fg: Tensor, score_sum: Tensor, strides: Tensor,
                        whwh: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The ProbIoU, distance (DFL or L1) and angle terms over the foreground
        anchors, weighted by their target scores (boxes in grid units)."""
        b, a = fg.nonzero(as_tuple=True)
        if not len(b):
            # Zero, yet attached to the distances and angles: DDP wants a gradient for every parameter.
            zero = pred_dist.new_zeros(()) + (pred_bboxes.sum() + pred_dist.sum()) * 0
            return zero, zero, zero
        weight = target_scores.sum(-1)[b, a].unsqueeze(-1)  # [n,1]
        pred, target = pred_bboxes[b, a], target_bboxes[b, a]
        box = ((1.0 - probiou(pred, target, floor=PROBIOU_FLOOR)) * weight).sum() / score_sum
        if self.reg_max == 1:
            scale = strides[a] / whwh  # the distances in pixels over the image's width or height
            ltrb = rbox2dist(target[:, :4], points[a], target[:, 4:5])
            l1 = F.l1_loss(pred_dist[b, a] * scale, ltrb * scale, reduction="none").mean(-1, keepdim=True)
            dfl = (l1 * weight).sum() / score_sum
        else:
            ltrb = rbox2dist(target[:, :4], points[a], target[:, 4:5], self.reg_max - 1)
            dfl = (_dfl(pred_dist[b, a].view(-1, self.reg_max), ltrb) * weight).sum() / score_sum
        return box, dfl, self._angle(pred[:, 4], target, weight.squeeze(-1)) / score_sum

    @staticmethod
    def _angle(pred_angle: Tensor, target: Tensor, weight: Tensor) -> Tensor:
        """sum of sin^2(2 (pred - gt)), weighted by the aspect ratio's exp(-ln(w/h)^2 / 9) and `weight`."""
        aspect = torch.exp(-torch.log((target[:, 2] + 1e-9) / (target[:, 3] + 1e-9)) ** 2 / ANGLE_ASPECT ** 2)
        delta = pred_angle - target[:, 4]
        delta = delta - torch.round(delta / torch.pi) * torch.pi  # into [-pi/2, pi/2], as ultralytics'
        return (aspect * torch.sin(2 * delta) ** 2 * weight).sum()


class EndToEndOBBLoss(EndToEndLoss):
    """YOLO26's oriented-box loss over both heads (ultralytics' E2ELoss of
    v8OBBLoss): loss, items = EndToEndOBBLoss(nc, epochs)(((maps, angles),
    (the one-to-one head's maps, angles)), targets). EndToEndLoss's
    weighting of the heads; the one-to-one head's items (box, cls, l1,
    angle), as ultralytics logs them."""

    def __init__(self, nc: int, epochs: int, strides: Sequence[float] = (8, 16, 32), world_size: int = 1, *,
                 angle: float = 1.0, **gains: float):
        super().__init__(nc, epochs, strides, world_size, head_loss=OBBLoss, options=dict(angle=angle), **gains)
