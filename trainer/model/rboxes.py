"""Rotated-box geometry for the oriented-box (OBB) task: formats, the
probabilistic IoU, distance coding about anchor points, rotated NMS.

A rotated box is ``xywhr``: centre (cx, cy), width, height and the angle r in
radians of its width side against the x axis, in the last dim (ultralytics'
convention). As ultralytics 8.4 defines them (utils/metrics.py, ops.py,
tal.py, nms.py), written here in pure torch (no torchvision):

- ProbIoU (Llerena et al., arXiv 2106.06072): each box is the Gaussian of
  its uniform density (covariance R diag(w^2, h^2)/12 R^T); the overlap is
  one minus the Hellinger distance of the two Gaussians, from their
  Bhattacharyya distance clamped to [eps, 100];
- corners: (cx, cy) + (w/2) u +- (h/2) v with u = (cos r, sin r) and
  v = (-sin r, cos r), in ultralytics' order (+u+v, +u-v, -u-v, -u+v);
- the corners back to xywhr are OpenCV's minimum-area rectangle, the longer
  side as w, r folded into [-pi/4, 3pi/4) (ultralytics' xyxyxyxy2xywhr: in
  common/polygon.py, numpy's, which the data path uses too);
- regularize: r into [0, pi/2), w and h swapped where r mod pi >= pi/2;
- rotated NMS is Fast-NMS (Bolya et al., arXiv 1904.02689) over the batched
  ProbIoU: a box is dropped if any higher-scoring box, kept or not, overlaps
  it above the threshold.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

EPS = 1e-7


def covariance(boxes: Tensor, floor: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """xywhr [..., 5] -> the box Gaussians' covariances (a, b, c), [[a, c], [c, b]], each [..., 1].
    `floor` is added to w^2/12 and h^2/12 (the loss's bound on sub-pixel boxes' gradients)."""
    a, b = (boxes[..., 2:4].pow(2) / 12 + floor).split(1, dim=-1)
    r = boxes[..., 4:5]
    cos, sin = r.cos(), r.sin()
    cos2, sin2 = cos.pow(2), sin.pow(2)
    return a * cos2 + b * sin2, a * sin2 + b * cos2, (a - b) * cos * sin


def _hellinger_overlap(xy1, cov1, xy2, cov2, eps: float) -> Tensor:
    """1 - Hellinger distance of two Gaussians (broadcast), from their Bhattacharyya distance."""
    (x1, y1), (x2, y2) = xy1, xy2
    (a1, b1, c1), (a2, b2, c2) = cov1, cov2
    det = (a1 + a2) * (b1 + b2) - (c1 + c2).pow(2)
    t1 = ((a1 + a2) * (y1 - y2).pow(2) + (b1 + b2) * (x1 - x2).pow(2)) / (det + eps) * 0.25
    t2 = ((c1 + c2) * (x2 - x1) * (y1 - y2)) / (det + eps) * 0.5
    t3 = (det / (4 * ((a1 * b1 - c1.pow(2)).clamp(min=0) * (a2 * b2 - c2.pow(2)).clamp(min=0)).sqrt() + eps)
          + eps).log() * 0.5
    bd = (t1 + t2 + t3).clamp(eps, 100.0)
    return 1 - (1.0 - (-bd).exp() + eps).sqrt()


def probiou(a: Tensor, b: Tensor, eps: float = EPS, floor: float = 0.0) -> Tensor:
    """ProbIoU of paired xywhr boxes [..., 5] -> [..., 1] (ultralytics' probiou)."""
    return _hellinger_overlap(a[..., :2].split(1, -1), covariance(a, floor), b[..., :2].split(1, -1),
                              covariance(b, floor), eps)


def batch_probiou(a: Tensor, b: Tensor, eps: float = EPS) -> Tensor:
    """ProbIoU of every box of a [N, 5] with every box of b [M, 5] -> [N, M] (ultralytics' batch_probiou)."""
    row = [t.squeeze(-1)[None] for t in b[..., :2].split(1, -1)], [t.squeeze(-1)[None] for t in covariance(b)]
    return _hellinger_overlap(a[..., :2].split(1, -1), covariance(a), *row, eps)


def xywhr2xyxyxyxy(boxes: Tensor) -> Tensor:
    """xywhr [..., 5] -> the four corners [..., 4, 2], in ultralytics' order."""
    centre, w, h, r = boxes[..., :2], boxes[..., 2:3], boxes[..., 3:4], boxes[..., 4:5]
    cos, sin = r.cos(), r.sin()
    u = torch.cat((w / 2 * cos, w / 2 * sin), -1)
    v = torch.cat((-h / 2 * sin, h / 2 * cos), -1)
    return torch.stack((centre + u + v, centre + u - v, centre - u - v, centre - u + v), -2)


def regularize(boxes: Tensor) -> Tensor:
    """xywhr with r in [0, pi/2): w and h swapped where r mod pi is in [pi/2, pi)
    (ultralytics' regularize_rboxes; the same rectangle)."""
    x, y, w, h, r = boxes.unbind(-1)
    swap = r % math.pi >= math.pi / 2
    return torch.stack((x, y, torch.where(swap, h, w), torch.where(swap, w, h), r % (math.pi / 2)), -1)


def dist2rbox(distance: Tensor, angle: Tensor, points: Tensor, dim: int = -1) -> Tensor:
    """ltrb distances [..., 4] measured in the box's own frame (rotated by `angle`) from
    anchor points -> (cx, cy, w, h) [..., 4], in the points' units; the angle is not appended."""
    lt, rb = distance.split(2, dim=dim)
    cos, sin = angle.cos(), angle.sin()
    xf, yf = ((rb - lt) / 2).split(1, dim=dim)
    centre = torch.cat((xf * cos - yf * sin, xf * sin + yf * cos), dim=dim) + points
    return torch.cat((centre, lt + rb), dim=dim)


def rbox2dist(boxes: Tensor, points: Tensor, angle: Tensor, reg_max: int | float | None = None) -> Tensor:
    """dist2rbox's inverse: (cx, cy, w, h) [..., 4] and the angle [..., 1] -> ltrb from points,
    clamped to [0, reg_max - 0.01] where reg_max (the largest bin value) is given."""
    offset_x, offset_y = (boxes[..., :2] - points).split(1, -1)
    cos, sin = angle.cos(), angle.sin()
    xf, yf = offset_x * cos + offset_y * sin, -offset_x * sin + offset_y * cos
    w, h = boxes[..., 2:3], boxes[..., 3:4]
    ltrb = torch.cat((w / 2 - xf, h / 2 - yf, w / 2 + xf, h / 2 + yf), -1)
    return ltrb if reg_max is None else ltrb.clamp(0, reg_max - 0.01)


def rotated_nms(boxes: Tensor, scores: Tensor, iou_thres: float) -> Tensor:
    """Fast-NMS of xywhr boxes [N, 5] by ProbIoU -> kept indices, highest score first
    (ultralytics' TorchNMS.fast_nms with batch_probiou)."""
    if not len(boxes):
        return torch.empty((0,), dtype=torch.long, device=boxes.device)
    order = scores.argsort(descending=True)
    overlaps = batch_probiou(boxes[order], boxes[order]).triu_(diagonal=1)
    return order[(overlaps > iou_thres).sum(0) <= 0]


def non_max_suppression_obb(preds: Tensor, conf_thres: float = 0.001, iou_thres: float = 0.7, max_det: int = 300,
                            max_nms: int = 30000, agnostic: bool = False, multi_label: bool = False,
                            max_wh: float = 7680) -> list[Tensor]:
    """Decoded predictions [B, 4 + nc + 1, A] (cx, cy, w, h px, class scores, angle) -> per image
    [n, 7]: (cx, cy, w, h, conf, cls, angle), as ultralytics' non_max_suppression(rotated=True):
    the best class per anchor (or every class above conf_thres with `multi_label`), at most
    max_nms by confidence, per class by shifting centres max_wh px per class index, at most max_det."""
    out = []
    for x in preds.transpose(1, 2):
        scores, angle = x[:, 4:-1], x[:, -1:]
        x = x[scores.amax(1) > conf_thres]
        scores, angle = x[:, 4:-1], x[:, -1:]
        if multi_label and scores.shape[1] > 1:
            i, j = (scores > conf_thres).nonzero(as_tuple=True)
            x = torch.cat((x[i, :4], scores[i, j, None], j[:, None].to(x.dtype), angle[i]), 1)
        else:
            conf, j = scores.max(1, keepdim=True)
            x = torch.cat((x[:, :4], conf, j.to(x.dtype), angle), 1)[conf.view(-1) > conf_thres]
        if len(x) > max_nms:
            x = x[x[:, 4].argsort(descending=True)[:max_nms]]
        shift = x[:, 5:6] * (0 if agnostic else max_wh)
        kept = rotated_nms(torch.cat((x[:, :2] + shift, x[:, 2:4], x[:, 6:7]), -1), x[:, 4], iou_thres)
        out.append(x[kept[:max_det]])
    return out
