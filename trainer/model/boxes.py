"""Box geometry for the detector: formats, IoU/CIoU, anchors, ltrb coding, NMS.

Pure torch (no torchvision). Conventions used everywhere in hpcyolo_trainer:

- ``xyxy`` is (x1, y1, x2, y2), ``xywh`` is (cx, cy, w, h), both in the last dim;
- anchor points are cell centres in *grid units* of their level (multiply by the
  level's stride for pixels); ``make_anchors`` returns the strides alongside;
- ``ltrb`` distances are measured from an anchor point to the box sides, in the
  same units as the point (grid units in the loss).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

# Pairs of boxes tested for overlap per chunk in NMS: bounds memory (about
# 100 bytes a pair) when many boxes crowd one spot.
_NMS_PAIR_CHUNK = 1 << 22
# Vectorised greedy rounds before NMS falls back to a plain loop (see _greedy_keep).
_NMS_ROUNDS = 12
# Above this many boxes, NMS first settles the best ones in blocks of
# _NMS_SETTLE_TOP (see _settle_top), if the x-sweep would test more than
# _NMS_SETTLE_PAIRS pairs per box: crowded single-class images, not the
# usual many-class output where the class offsets already keep boxes apart.
_NMS_SETTLE_MIN = 2048
_NMS_SETTLE_TOP = 256
_NMS_SETTLE_PAIRS = 64
# Off the CPU (a GPU), NMS decides the boxes in score order, this many at a
# time, from their whole overlap matrix (a byte a pair): see _dense_nms.
_NMS_DENSE_TOP = 8192


def xywh2xyxy(x: Tensor) -> Tensor:
    """(cx, cy, w, h) -> (x1, y1, x2, y2) over the last dim."""
    xy, half = x[..., :2], x[..., 2:4] / 2
    return torch.cat((xy - half, xy + half), dim=-1)


def xyxy2xywh(x: Tensor) -> Tensor:
    """(x1, y1, x2, y2) -> (cx, cy, w, h) over the last dim."""
    x1y1, x2y2 = x[..., :2], x[..., 2:4]
    return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim=-1)


def _area(b: Tensor) -> Tensor:
    """Area of xyxy boxes over the last dim (degenerate boxes count 0)."""
    return (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)


def _inter_union(a: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Intersection and union areas of broadcastable xyxy boxes [...,4] -> [...] each."""
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:4], b[..., 2:4])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]  # not prod(-1): its backward reads a flag from the GPU, a wait in every step
    return inter, _area(a) + _area(b) - inter + eps


def box_iou(a: Tensor, b: Tensor, eps: float = 1e-7) -> Tensor:
    """IoU matrix of xyxy boxes a [N,4] and b [M,4] -> [N,M]."""
    inter, union = _inter_union(a[:, None], b[None], eps)
    return inter / union


def bbox_iou(a: Tensor, b: Tensor, xywh: bool = False, ciou: bool = True, eps: float = 1e-7) -> Tensor:
    """Elementwise IoU, or Complete-IoU (Zheng et al. 2020), of broadcastable [...,4] boxes -> [...,1]."""
    if xywh:
        a, b = xywh2xyxy(a), xywh2xyxy(b)
    inter, union = _inter_union(a, b, eps)
    iou = inter / union
    if ciou:
        iou = iou - _ciou_penalty(a, b, iou, eps)
    return iou.unsqueeze(-1)


def _ciou_penalty(a: Tensor, b: Tensor, iou: Tensor, eps: float) -> Tensor:
    """CIoU's centre-distance and aspect-ratio terms of xyxy boxes: rho^2/c^2 + alpha*v."""
    (acx, acy, aw, ah), (bcx, bcy, bw, bh) = xyxy2xywh(a).unbind(-1), xyxy2xywh(b).unbind(-1)
    enclosing = torch.maximum(a[..., 2:4], b[..., 2:4]) - torch.minimum(a[..., :2], b[..., :2])
    c2 = enclosing.pow(2).sum(-1) + eps  # squared diagonal of the enclosing box
    rho2 = (bcx - acx).pow(2) + (bcy - acy).pow(2)  # squared centre distance
    v = (4 / math.pi**2) * (torch.atan(bw / bh.clamp(min=eps)) - torch.atan(aw / ah.clamp(min=eps))).pow(2)
    # The paper treats alpha as a trade-off weight, not a function to differentiate.
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return rho2 / c2 + alpha * v


def make_anchors(feats: Sequence[Tensor], strides: Sequence[float], offset: float = 0.5) -> tuple[Tensor, Tensor]:
    """Cell-centre points [A,2] (x, y; grid units) and their strides [A,1], level by level, row-major."""
    assert len(feats) == len(strides), "one stride per feature level"
    points, stride_list = [], []
    dtype, device = feats[0].dtype, feats[0].device
    for feat, stride in zip(feats, strides):
        h, w = feat.shape[-2:]
        sx = torch.arange(w, dtype=dtype, device=device) + offset
        sy = torch.arange(h, dtype=dtype, device=device) + offset
        gy, gx = torch.meshgrid(sy, sx, indexing="ij")  # y outer, x inner: matches feat.flatten(2)
        points.append(torch.stack((gx, gy), -1).view(-1, 2))
        stride_list.append(torch.full((h * w, 1), float(stride), dtype=dtype, device=device))
    return torch.cat(points), torch.cat(stride_list)


def dist2bbox(distance: Tensor, points: Tensor, xywh: bool = True, dim: int = -1) -> Tensor:
    """ltrb distances from points -> boxes (xywh or xyxy) along dim."""
    lt, rb = distance.chunk(2, dim)
    x1y1, x2y2 = points - lt, points + rb
    if xywh:
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)
    return torch.cat((x1y1, x2y2), dim)


def bbox2dist(points: Tensor, bbox: Tensor, reg_max: int | float | None = None) -> Tensor:
    """xyxy boxes -> ltrb distances from points, clamped to [0, reg_max - 0.01]
    where reg_max is given (None: as they are).

    ``reg_max`` here is the largest bin *value*: a head with 16 bins (values
    0..15) passes 15, so the two-bin DFL target floor(t), floor(t)+1 stays in range.
    """
    x1y1, x2y2 = bbox.chunk(2, -1)
    ltrb = torch.cat((points - x1y1, x2y2 - points), -1)
    return ltrb if reg_max is None else ltrb.clamp(0, reg_max - 0.01)


def nms(boxes: Tensor, scores: Tensor, iou_thres: float, dense: bool | None = None) -> Tensor:
    """Greedy NMS of xyxy boxes [N,4]; returns kept indices [K] sorted by score, highest first.

    `dense`: decide from whole overlap matrices (_dense_nms) rather than the
    sparse overlap graph; None: dense off the CPU. Both give the same boxes.
    """
    assert 0 <= iou_thres <= 1, "iou_thres must lie in [0, 1]"
    order = scores.argsort(descending=True, stable=True)
    ranked = boxes[order]
    keep = torch.zeros(len(order), dtype=torch.bool, device=boxes.device)
    if dense if dense is not None else boxes.device.type != "cpu":
        _dense_nms(ranked, iou_thres, keep)
        return order[keep]
    if _crowded(ranked, iou_thres):
        rest = _settle_top(ranked, iou_thres, keep)
    else:
        rest = torch.arange(len(order), device=boxes.device)
    src, dst = _overlap_graph(ranked[rest], iou_thres)
    keep[rest[_greedy_keep(src, dst, len(rest))]] = True
    return order[keep]


def _crowded(boxes: Tensor, iou_thres: float) -> bool:
    """Many boxes, and the x-sweep would test many pairs per box."""
    n = len(boxes)
    return n > _NMS_SETTLE_MIN and int(_x_windows(boxes, iou_thres)[1].sum()) > _NMS_SETTLE_PAIRS * n


def _settle_top(ranked: Tensor, iou_thres: float, keep: Tensor) -> Tensor:
    """Decide the best-scoring boxes block by block, marking keep; returns the rank indices still open."""
    # Around each object, candidates crowd together and the overlap graph
    # grows with the square of the crowd; its best box suppresses most of it.
    # So settle the top boxes exactly (they depend on nobody below them) and
    # drop all they suppress, for as long as that removes many boxes per block.
    alive = torch.arange(len(ranked), device=ranked.device)
    while len(alive) > _NMS_SETTLE_MIN:
        top, rest = alive[:_NMS_SETTLE_TOP], alive[_NMS_SETTLE_TOP:]
        kept = top[_greedy_keep(*_upper_overlaps(ranked[top], iou_thres).nonzero(as_tuple=True), len(top))]
        keep[kept] = True
        alive = _unsuppressed(ranked, rest, kept, iou_thres)
        if len(rest) - len(alive) < 3 * _NMS_SETTLE_TOP:  # no longer pays for itself
            break
    return alive


def _dense_nms(ranked: Tensor, iou_thres: float, keep: Tensor) -> None:
    """Greedy NMS for a GPU, marking keep: a few passes over whole matrices.

    The sparse path (below) finds the few overlapping pairs with sorts,
    searches and Python loops: cheap on a CPU, but on a GPU each of its many
    small steps is a kernel launch and many wait for the GPU (on an H200,
    this path made a validation pass of 200 images 1.82 s instead of the
    sparse path's 2.51 s). Here the best _NMS_DENSE_TOP boxes are decided
    from their overlap matrix, everything they suppress is dropped, and so
    on with the boxes left.
    """
    alive = torch.arange(len(ranked), device=ranked.device)
    while len(alive):
        top, alive = alive[:_NMS_DENSE_TOP], alive[_NMS_DENSE_TOP:]
        kept = top[_fixed_point_keep(_upper_overlaps(ranked[top], iou_thres))]
        keep[kept] = True
        alive = _unsuppressed(ranked, alive, kept, iou_thres)


def _overlap_blocks(a: Tensor, b: Tensor, iou_thres: float):
    """_overlaps(a, b) in blocks of a's rows, each about _NMS_PAIR_CHUNK pairs at most (memory)."""
    rows = max(1, _NMS_PAIR_CHUNK // max(1, len(b)))
    for i in range(0, len(a), rows):
        yield _overlaps(a[i:i + rows], b, iou_thres)


def _upper_overlaps(boxes: Tensor, iou_thres: float) -> Tensor:
    """[N,N] bool, strictly upper: IoU(boxes_i, boxes_j) > iou_thres for i < j (score-ranked boxes)."""
    return torch.cat(list(_overlap_blocks(boxes, boxes, iou_thres))).triu_(1)


def _unsuppressed(ranked: Tensor, rest: Tensor, kept: Tensor, iou_thres: float) -> Tensor:
    """The rank indices of `rest` whose boxes no box of `kept` overlaps."""
    hit = [block.any(1) for block in _overlap_blocks(ranked[rest], ranked[kept], iou_thres)]
    return rest[~torch.cat(hit)] if hit else rest


def _fixed_point_keep(over: Tensor) -> Tensor:
    """Greedy NMS's keep mask from the strictly upper overlap matrix of n score-ranked boxes.

    Greedy keeps box j iff no kept box above it overlaps it: keep is the
    fixed point of keep = not any(over[i, j] for kept i). Iterated from all
    kept, the first t boxes are final after t passes, and an unchanged pass
    means all are: real detections take a handful of passes; a long chain of
    boxes each suppressing the next is left to _greedy_keep.
    """
    keep = torch.ones(len(over), dtype=torch.bool, device=over.device)
    for _ in range(_NMS_ROUNDS):
        new = ~(over & keep[:, None]).any(0)
        if torch.equal(new, keep):
            return keep
        keep = new
    return _greedy_keep(*over.nonzero(as_tuple=True), len(over))


def _overlaps(a: Tensor, b: Tensor, iou_thres: float) -> Tensor:
    """[N,M] bool: IoU(a_i, b_j) > iou_thres, without the division."""
    inter, union = _inter_union(a[:, None], b[None], 1e-7)
    return inter > iou_thres * union


def _overlap_graph(boxes: Tensor, iou_thres: float) -> tuple[Tensor, Tensor]:
    """Edges (src, dst), src < dst, between score-ranked boxes whose IoU exceeds iou_thres."""
    # A dense N x N IoU matrix costs seconds at 5k-30k boxes on a CPU, yet
    # almost all pairs are far apart: only test the pairs _x_windows allows.
    x_order, count = _x_windows(boxes, iou_thres)
    xb = boxes[x_order]
    y1, y2 = xb[:, 1].contiguous(), xb[:, 3].contiguous()
    height = (y2 - y1).clamp(min=0)
    src, dst = [], []
    for i, j in _window_pairs(count):
        # Cheap 1-D test first (IoU > t needs y-overlap > t * both heights),
        # then the exact IoU on the few survivors.
        y_overlap = torch.minimum(y2[i], y2[j]) - torch.maximum(y1[i], y1[j])
        near = y_overlap > 0.999 * iou_thres * torch.maximum(height[i], height[j])
        i, j = i[near], j[near]
        inter, union = _inter_union(xb[i], xb[j], 1e-7)
        hit = inter > iou_thres * union  # IoU > t without the division
        a, b = x_order[i[hit]], x_order[j[hit]]
        src.append(torch.minimum(a, b))
        dst.append(torch.maximum(a, b))
    empty = x_order.new_empty(0)
    return torch.cat(src) if src else empty, torch.cat(dst) if dst else empty


def _x_windows(boxes: Tensor, iou_thres: float) -> tuple[Tensor, Tensor]:
    """Boxes' order by x1, and how many boxes after each (in that order) start close enough to overlap it."""
    # With x1_j >= x1_i, IoU > t needs x-overlap > t * w_i (the overlap area
    # exceeds t * area_i and its height is at most h_i), so box j must start
    # before x2_i - t * w_i.
    x_order = boxes[:, 0].argsort()
    xb = boxes[x_order]
    width = (xb[:, 2] - xb[:, 0]).clamp(min=0)
    reach = xb[:, 2] - 0.999 * iou_thres * width  # 0.999: never lose a borderline pair to rounding
    end = torch.searchsorted(xb[:, 0].contiguous(), reach.contiguous())
    return x_order, (end - torch.arange(len(xb), device=xb.device) - 1).clamp(min=0)


def _window_pairs(count: Tensor):
    """Yield (i, j) index chunks: every i paired with i+1 .. i+count[i], at most about _NMS_PAIR_CHUNK pairs a chunk."""
    cum = count.cumsum(0)
    start = 0
    while start < len(count):
        done = cum[start - 1] if start else cum.new_zeros(())
        stop = max(int(torch.searchsorted(cum, done + _NMS_PAIR_CHUNK, right=True)), start + 1)
        c = count[start:stop]
        i = torch.repeat_interleave(torch.arange(start, stop, device=c.device), c)
        first = torch.repeat_interleave(c.cumsum(0) - c, c)  # where each i's run starts
        yield i, i + 1 + torch.arange(len(i), device=c.device) - first
        start = stop


def _greedy_keep(src: Tensor, dst: Tensor, n: int) -> Tensor:
    """Greedy NMS on the overlap graph of n score-ranked boxes -> keep mask [n]."""
    # A box is kept iff no kept higher-ranked neighbour suppresses it. Decide
    # boxes in vectorised rounds: kept once all its higher neighbours are
    # suppressed, suppressed once one of them is kept. Real detections settle
    # in a handful of rounds; a long chain of boxes each suppressing the next
    # settles one link a round, so after a few rounds finish row by row.
    kept = torch.zeros(n, dtype=torch.bool, device=src.device)
    undecided = torch.ones_like(kept)
    for _ in range(_NMS_ROUNDS):
        if not bool(undecided.any()):
            return kept
        live = undecided[dst] & (kept[src] | undecided[src])  # drop edges from suppressed boxes
        src, dst = src[live], dst[live]
        blocked = torch.zeros_like(kept).index_fill_(0, dst, True)
        hit = torch.zeros_like(kept).index_fill_(0, dst[kept[src]], True)
        kept |= undecided & ~blocked
        undecided &= blocked & ~hit
    return _greedy_rows(src, dst, kept, undecided)


def _greedy_rows(src: Tensor, dst: Tensor, kept: Tensor, undecided: Tensor) -> Tensor:
    """The textbook one-box-at-a-time greedy loop over what the rounds left undecided."""
    live = undecided[dst]
    src, dst = src[live].tolist(), dst[live].tolist()
    children: dict[int, list[int]] = {}
    for s, d in zip(src, dst):
        children.setdefault(s, []).append(d)
    out, open_ = kept.tolist(), undecided.tolist()
    for v in range(len(out)):  # rank order: every parent is final before its child
        if open_[v]:
            out[v], open_[v] = True, False
        if out[v]:
            for d in children.get(v, ()):
                open_[d] = False
    return torch.tensor(out, dtype=torch.bool, device=kept.device)


def non_max_suppression(
    preds: Tensor,
    conf_thres: float = 0.001,
    iou_thres: float = 0.7,
    max_det: int = 300,
    max_nms: int = 30000,
    agnostic: bool = False,
    multi_label: bool = False,
    nc: int | None = None,
) -> list[Tensor]:
    """Decoded predictions [B, 4+nc, A] (cx, cy, w, h px; class probs) -> per image [n,6] (x1, y1, x2, y2, conf, cls).

    Each anchor contributes one box, for its best class, or with
    `multi_label` one box per class scoring above conf_thres (as ultralytics
    validates); NMS runs per class via the class-offset trick unless agnostic.
    With `nc`, the rows after the nc class scores (a segmenter's mask
    coefficients) follow each kept box: [n, 6 + extra].
    """
    return [_nms_image(p.transpose(0, 1), conf_thres, iou_thres, max_det, max_nms, agnostic, multi_label, nc)
            for p in preds]


def _nms_image(x: Tensor, conf_thres: float, iou_thres: float, max_det: int, max_nms: int, agnostic: bool,
               multi_label: bool = False, nc: int | None = None) -> Tensor:
    """NMS for one image's predictions [A, 4+nc(+extra)]."""
    end = x.shape[1] if nc is None else 4 + nc
    extra = x[:, end:]
    if multi_label:
        anchor, cls = (x[:, 4:end] > conf_thres).nonzero(as_tuple=True)
        x, conf, extra = x[anchor], x[anchor, 4 + cls], extra[anchor]
    else:
        conf, cls = x[:, 4:end].max(1)
        ok = conf > conf_thres
        x, conf, cls, extra = x[ok], conf[ok], cls[ok], extra[ok]
    if len(conf) > max_nms:  # bound NMS cost: keep only the most confident
        top = conf.topk(max_nms).indices
        x, conf, cls, extra = x[top], conf[top], cls[top], extra[top]
    boxes = xywh2xyxy(x[:, :4])
    kept = nms(_class_shifted(boxes, cls) if not agnostic else boxes.float(), conf, iou_thres)[:max_det]
    return torch.cat((boxes[kept], conf[kept, None], cls[kept, None].to(boxes.dtype), extra[kept]), 1)


def _class_shifted(boxes: Tensor, cls: Tensor) -> Tensor:
    """Boxes moved to a separate region per class, so one NMS call is a per-class NMS."""
    # The offset is the boxes' own coordinate span rather than a fixed large
    # constant: float32 keeps sub-pixel precision at 80 classes (a fixed 7680
    # puts coordinates near 6e5, where float32 steps by 1/16 px), and
    # images larger than any constant still work. float32, as fp16 overflows.
    boxes = boxes.float()
    span = (boxes.max() - boxes.min() + 1) if len(boxes) else boxes.new_ones(())
    return boxes + cls[:, None].float() * span
