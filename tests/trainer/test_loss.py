"""Task-aligned assignment and the detection loss (hpcyolo_trainer.optim.loss)."""

from __future__ import annotations

import math

import pytest
import torch

from hpcyolo_trainer.model.boxes import bbox2dist, bbox_iou, make_anchors
from hpcyolo_trainer.optim.loss import DetectionLoss, TaskAlignedAssigner

NC, REG_MAX, STRIDES = 2, 16, (8, 16, 32)
NO = 4 * REG_MAX + NC


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def level_shapes(h: int, w: int) -> list[tuple[int, int]]:
    """Feature map sizes for an h x w (pixels) input."""
    return [(h // s, w // s) for s in STRIDES]


def to_feats(flat: torch.Tensor, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """[B, A, NO] anchor-major predictions -> the head's per-level [B, NO, H, W] maps."""
    sizes = [h * w for h, w in shapes]
    return [
        part.transpose(1, 2).reshape(flat.shape[0], NO, h, w).contiguous()
        for part, (h, w) in zip(flat.split(sizes, dim=1), shapes)
    ]


def two_hot_logits(dist: torch.Tensor) -> torch.Tensor:
    """Bin logits [..., REG_MAX] whose softmax expectation is dist (split over the two nearest bins)."""
    left = dist.floor().long()
    w_right = dist - left
    logits = torch.full((*dist.shape, REG_MAX), -30.0)
    logits.scatter_(-1, left[..., None], (1 - w_right).clamp(min=1e-12).log()[..., None])
    logits.scatter_(-1, (left + 1)[..., None], w_right.clamp(min=1e-12).log()[..., None])
    return logits


def perfect_feats(target: torch.Tensor, h: int, w: int) -> list[torch.Tensor]:
    """Maps that decode to the (single) target box everywhere inside it, with its class confident only there."""
    shapes = level_shapes(h, w)
    points, strides = make_anchors([torch.zeros(1, 1, *s) for s in shapes], STRIDES)
    cls, cx, cy, bw, bh = target[1:].tolist()
    box = torch.tensor([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h])
    dist = bbox2dist(points, box / strides, REG_MAX - 1)  # exact for anchors inside the box
    px = points * strides
    inside = ((px > box[:2]) & (px < box[2:])).all(-1)
    flat = torch.full((len(points), NO), -12.0)
    flat[:, : 4 * REG_MAX] = two_hot_logits(dist).view(len(points), -1)
    flat[inside, 4 * REG_MAX + int(cls)] = 12.0
    return to_feats(flat[None], shapes)


def random_feats(h: int, w: int, batch: int = 1, seed: int = 0, requires_grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, NO, *s, generator=g).requires_grad_(requires_grad) for s in level_shapes(h, w)]


# -- assigner ---------------------------------------------------------------


def grid_points(step: float = 10.0, n: int = 10) -> torch.Tensor:
    """Anchor points (x, y) at step/2 + k*step, n x n, row-major."""
    c = torch.arange(n) * step + step / 2
    gy, gx = torch.meshgrid(c, c, indexing="ij")
    return torch.stack((gx, gy), -1).view(-1, 2)


def assign(points, gt_boxes, gt_labels, pd_scores, pd_boxes, mask=None, topk=10):
    """Run the assigner on one image (adds the batch dim)."""
    m = len(gt_boxes)
    mask = torch.ones(m, 1, dtype=torch.bool) if mask is None else mask
    labels = torch.tensor(gt_labels, dtype=torch.float32).view(m, 1)
    assigner = TaskAlignedAssigner(topk=topk)
    out = assigner(pd_scores[None], pd_boxes[None], points, labels[None], gt_boxes[None], mask[None])
    return [t[0] for t in out]


def boxes_around(points: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return torch.cat((points - half, points + half), -1)


@pytest.mark.parametrize("topk", [3, 10])
def test_assigner_picks_topk_inside_gt_by_alignment(topk):
    points = grid_points()
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(len(points), NC, generator=g)
    pd_boxes = boxes_around(points, 5 + 15 * torch.rand(len(points), 2, generator=g))
    gt = torch.tensor([[20.0, 20.0, 60.0, 60.0]])  # 16 anchor points inside
    boxes, tscores, fg = assign(points, gt, [1], scores, pd_boxes, topk=topk)
    inside = ((points > gt[0, :2]) & (points < gt[0, 2:])).all(-1)
    assert inside.sum() == 16 and fg.sum() == topk and not (fg & ~inside).any()
    align = scores[:, 1].sqrt() * bbox_iou(gt, pd_boxes, ciou=False)[:, 0].clamp(min=0) ** 6
    expected = align.masked_fill(~inside, -1).topk(topk).indices
    assert set(fg.nonzero()[:, 0].tolist()) == set(expected.tolist())
    assert torch.equal(boxes[fg], gt.expand(topk, 4)) and (boxes[~fg] == 0).all()
    assert (tscores[:, 0] == 0).all() and (tscores[~fg] == 0).all()


def test_assigner_score_normalisation():
    points = grid_points()
    scores = torch.full((len(points), NC), 0.5)
    pd_boxes = boxes_around(points, torch.rand(len(points), 2, generator=torch.Generator().manual_seed(1)) * 20 + 2)
    gt = torch.tensor([[10.0, 10.0, 70.0, 50.0]])
    _, tscores, fg = assign(points, gt, [0], scores, pd_boxes)
    ious = bbox_iou(gt, pd_boxes, ciou=False)[:, 0]
    # TOOD: the best positive's target equals the gt's best IoU among positives.
    assert tscores[fg, 0].max().item() == pytest.approx(ious[fg].max().item(), rel=1e-5)
    assert (tscores[fg, 0] <= ious[fg].max() + 1e-6).all()


def test_assigner_fewer_candidates_than_topk():
    points = grid_points()
    scores = torch.full((len(points), NC), 0.5)
    gt = torch.tensor([[20.0, 20.0, 40.0, 40.0]])  # 4 points inside
    _, _, fg = assign(points, gt, [0], scores, boxes_around(points, torch.full((len(points), 2), 10.0)))
    assert fg.sum() == 4
    assert ((points[fg] > 20) & (points[fg] < 40)).all()


def test_assigner_anchor_in_two_gts_keeps_higher_iou():
    points = torch.tensor([[5.0, 5.0]])
    pd_boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    scores = torch.full((1, NC), 0.5)
    gts = torch.tensor([[0.0, 0.0, 12.0, 12.0], [0.0, 0.0, 10.0, 10.0]])  # second one matches the prediction
    boxes, tscores, fg = assign(points, gts, [0, 1], scores, pd_boxes)
    assert fg.tolist() == [True]
    assert torch.equal(boxes[0], gts[1]) and tscores[0, 0] == 0 and tscores[0, 1] > 0


def test_assigner_ignores_padded_gts_and_empty_batches():
    points = grid_points()
    scores = torch.full((len(points), NC), 0.5)
    pd_boxes = boxes_around(points, torch.full((len(points), 2), 10.0))
    gt = torch.tensor([[20.0, 20.0, 60.0, 60.0]])
    _, tscores, fg = assign(points, gt, [0], scores, pd_boxes, mask=torch.zeros(1, 1, dtype=torch.bool))
    assert not fg.any() and (tscores == 0).all()
    boxes, tscores, fg = assign(points, gt[:0], [], scores, pd_boxes)
    assert boxes.shape == (100, 4) and tscores.shape == (100, NC) and not fg.any()


# -- loss ---------------------------------------------------------------------


# A 24 x 24 px box centred in the image: 8 anchors inside it (4 on stride 8,
# 4 on stride 16), fewer than topk, so every one of them is a positive.
@pytest.mark.parametrize("h, w", [(64, 64), (64, 96)])
def test_perfect_prediction_has_near_zero_box_loss(h, w):
    target = torch.tensor([0.0, 1.0, 0.5, 0.5, 24 / w, 24 / h])
    loss_fn = DetectionLoss(NC)
    perfect, items = loss_fn(perfect_feats(target, h, w), target[None])
    random, _ = loss_fn(random_feats(h, w), target[None])
    assert items[0].item() < 1e-4  # CIoU: decoded boxes equal the gt
    assert items[1].item() < 1e-2
    assert perfect.item() < random.item() / 20


def test_loss_total_is_gained_items_times_batch():
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 0, 0.3, 0.6, 0.2, 0.2], [1, 1, 0.7, 0.3, 0.4, 0.2]])
    loss, items = DetectionLoss(NC)(random_feats(64, 64, batch=2), targets)
    assert loss.shape == () and items.shape == (3,) and not items.requires_grad
    assert loss.item() == pytest.approx(items.sum().item() * 2, rel=1e-5)
    assert (items > 0).all()


def test_empty_targets_give_finite_loss_and_zero_box_terms():
    feats = random_feats(64, 64, batch=2, requires_grad=True)
    loss, items = DetectionLoss(NC)(feats, torch.zeros(0, 6))
    assert math.isfinite(loss.item()) and items[0] == 0 and items[2] == 0 and items[1] > 0
    loss.backward()
    # Every map still receives a (zero for the box bins) gradient: DDP needs it.
    assert all(f.grad is not None and torch.isfinite(f.grad).all() for f in feats)
    assert (feats[0].grad[:, : 4 * REG_MAX] == 0).all()


def test_image_without_targets_in_batch():
    targets = torch.tensor([[1.0, 0.0, 0.5, 0.5, 0.4, 0.4]])  # image 0 has none
    loss, items = DetectionLoss(NC)(random_feats(64, 64, batch=2), targets)
    assert math.isfinite(loss.item()) and (items > 0).all()


def test_gradient_reaches_box_and_class_channels():
    feats = random_feats(64, 64, requires_grad=True)
    loss, _ = DetectionLoss(NC)(feats, torch.tensor([[0.0, 1.0, 0.5, 0.5, 0.5, 0.5]]))
    loss.backward()
    grad = torch.cat([f.grad.flatten(2) for f in feats], 2)[0]
    assert torch.isfinite(grad).all()
    assert grad[: 4 * REG_MAX].abs().sum() > 0 and grad[4 * REG_MAX :].abs().sum() > 0


def test_loss_is_learnable():
    # Free logits shaped like the head's output, optimised directly.
    torch.manual_seed(0)
    params = [torch.nn.Parameter(0.5 * torch.randn(1, NO, hh, ww)) for hh, ww in level_shapes(64, 64)]
    loss_fn = DetectionLoss(NC)
    target = torch.tensor([[0.0, 1.0, 0.45, 0.55, 0.4, 0.3]])
    opt = torch.optim.Adam(params, lr=0.1)
    first = last = None
    for _ in range(100):
        loss, _ = loss_fn(params, target)
        first = loss.item() if first is None else first
        last = loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert last < first / 5


def test_wrong_channel_count_is_rejected():
    feats = [torch.zeros(1, NO + 1, hh, ww) for hh, ww in level_shapes(64, 64)]
    with pytest.raises(AssertionError, match="channels"):
        DetectionLoss(NC)(feats, torch.zeros(0, 6))


@pytest.mark.parametrize("case,topk,topk2", [("v8", 10, None), ("one2one", 7, 1)])
def test_the_assignment_of_crowded_boxes_is_ultralytics(case, topk, topk2):
    """On crowded seeded boxes (many anchors picked by several boxes), the
    assignment equals ultralytics' TaskAlignedAssigner's as v8DetectionLoss
    builds it (strides 8/16/32; YOLO26's one-to-one head's topk 7 then 1):
    the foreground, each anchor's box (an anchor several boxes pick goes to
    the box it overlaps most among all it lies in, as ultralytics'
    select_highest_overlaps), its target boxes and scores
    (tests/reference/ultralytics/assigner.npz, made by ultralytics)."""
    from pathlib import Path

    import numpy as np

    ref = np.load(Path(__file__).resolve().parent.parent / "reference" / "ultralytics" / "assigner.npz")
    assert int(ref[f"{case}_outside"]) >= 2  # anchors where the two rules for a shared anchor differ
    t = {k: torch.from_numpy(ref[k]) for k in ("pd_scores", "pd_bboxes", "anchors", "gt_labels", "gt_bboxes", "mask_gt")}
    boxes, scores, fg, gt_idx = TaskAlignedAssigner(topk=topk, topk2=topk2, min_side=16.0, ciou=True).assign(
        t["pd_scores"], t["pd_bboxes"], t["anchors"], t["gt_labels"], t["gt_bboxes"], t["mask_gt"])
    want_fg = torch.from_numpy(ref[f"{case}_fg"]).bool()
    assert torch.equal(fg, want_fg)
    assert torch.equal(gt_idx[fg], torch.from_numpy(ref[f"{case}_gt_idx"])[want_fg])
    assert torch.allclose(boxes[fg], torch.from_numpy(ref[f"{case}_boxes"])[want_fg], atol=1e-5)  # background: 0
    assert torch.allclose(scores, torch.from_numpy(ref[f"{case}_scores"]), atol=1e-6)
