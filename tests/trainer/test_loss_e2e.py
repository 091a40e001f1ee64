"""YOLO26's loss (hpcyolo_trainer.optim.loss): the L1 box term of a head without
bins, STAL's widened small boxes, the one-to-one assignment (topk2) and
EndToEndLoss's ProgLoss weighting of the two heads, with ultralytics 8.4's
constants."""

from __future__ import annotations

import pytest
import torch

from hpcyolo_trainer.optim.loss import DetectionLoss, EndToEndLoss, TaskAlignedAssigner
from hpcyolo_trainer.model.detector import build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def offset_maps(gt_px: tuple[float, float, float, float], h: int, w: int, offset: float) -> list[torch.Tensor]:
    """One stride-8 level [1, 4 + 1, h, w] for one class: at every cell the
    distances to the gt box's sides (grid units) plus `offset`, and a
    confident class logit. Every anchor inside the gt predicts the gt widened
    by `offset` cells a side: the same IoU everywhere."""
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    x1, y1, x2, y2 = (v / 8 for v in gt_px)
    ltrb = torch.stack([xs - x1, ys - y1, x2 - xs, y2 - ys]) + offset
    return [torch.cat([ltrb, torch.full((1, h, w), 5.0)])[None]]


@pytest.mark.parametrize("h,w", [(8, 8), (8, 16)])
def test_head_without_bins_has_l1_of_the_sides_over_the_image_in_place_of_dfl(h, w):
    """reg_max 1 (YOLO26): the third term is |predicted - target distance| in
    pixels over the image's width (left, right) or height (top, bottom),
    weighted like DFL. Each positive anchor is off by 0.5 cells a side, so
    the term is 0.5 x 8 px over the sides, times the gain 1.5, exactly."""
    img_h, img_w = 8 * h, 8 * w
    gt = (16.0, 16.0, 48.0, 48.0)
    targets = torch.tensor([[0, 0, 32 / img_w, 32 / img_h, 32 / img_w, 32 / img_h]])
    loss = DetectionLoss(nc=1, reg_max=1, strides=(8,))
    assert loss.names == ("box_loss", "cls_loss", "l1_loss")
    _, items = loss(offset_maps(gt, h, w, 0.5), targets)
    expected = 1.5 * 0.5 * 8 * (1 / img_w + 1 / img_h) / 2
    assert items[2].item() == pytest.approx(expected, rel=1e-5)
    _, exact = loss(offset_maps(gt, h, w, 0.0), targets)
    assert exact[2].item() == pytest.approx(0.0, abs=1e-6) and exact[0].item() == pytest.approx(0.0, abs=1e-5)
    assert DetectionLoss(nc=1).names[2] == "dfl_loss"


def grid(step: float = 8.0, n: int = 8) -> torch.Tensor:
    c = torch.arange(n) * step + step / 2
    gy, gx = torch.meshgrid(c, c, indexing="ij")
    return torch.stack((gx, gy), -1).view(-1, 2)


def assign(assigner: TaskAlignedAssigner, gt: torch.Tensor, scores: torch.Tensor | None = None):
    points = grid()
    scores = torch.full((len(points), 1), 0.5) if scores is None else scores
    pd_boxes = torch.cat([points - 6, points + 6], -1)
    boxes, tscores, fg = assigner(scores[None], pd_boxes[None], points, torch.zeros(1, len(gt), 1), gt[None],
                                  torch.ones(1, len(gt), 1, dtype=torch.bool))
    return boxes[0], tscores[0], fg[0]


def test_stal_gives_a_box_smaller_than_the_middle_stride_candidates_and_keeps_its_own_target():
    """A 4 x 4 px object between anchor centres (8 px apart) has no anchor
    inside it: no positives, it is never learnt. Widened to 16 px for the
    choice of candidates (ultralytics' stride_val, the middle stride) it gets
    the four around it; what they learn is still the 4 px box."""
    gt = torch.tensor([[6.0, 6.0, 10.0, 10.0]])
    assert assign(TaskAlignedAssigner(topk=10), gt)[2].sum() == 0
    boxes, _, fg = assign(TaskAlignedAssigner(topk=10, min_side=16), gt)
    assert fg.sum() == 4 and torch.equal(boxes[fg], gt.expand(4, 4))
    big = torch.tensor([[4.0, 4.0, 36.0, 36.0]])  # sides of 32 px: left as they are
    assert torch.equal(assign(TaskAlignedAssigner(topk=10, min_side=16), big)[2],
                       assign(TaskAlignedAssigner(topk=10), big)[2])


def test_one_to_one_assignment_keeps_each_objects_single_best_anchor():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(64, 1, generator=g)
    gt = torch.tensor([[4.0, 4.0, 44.0, 44.0], [36.0, 36.0, 60.0, 60.0]])
    _, _, many = assign(TaskAlignedAssigner(topk=7), gt, scores)
    _, tscores, one = assign(TaskAlignedAssigner(topk=7, topk2=1), gt, scores)
    assert many.sum() > 2 and one.sum() == 2 and not (one & ~many).any()
    # The one kept of each gt is its best by alignment: here, equal boxes, the best score.
    for x1, y1, x2, y2 in gt.tolist():
        points = grid()
        inside = many & (points[:, 0] > x1) & (points[:, 0] < x2) & (points[:, 1] > y1) & (points[:, 1] < y2)
        kept = one & inside
        assert kept.sum() == 1 and scores[kept].item() == scores[inside].max().item()
    assert (tscores[one] > 0).all() and (tscores[~one] == 0).all()


@pytest.mark.parametrize("epochs,shares", [(12, {0: 0.8, 11: 0.1, 5: 0.1 + 0.7 * (1 - 5 / 11), 20: 0.1}),
                                           (1, {0: 0.8})])
def test_progloss_moves_the_weight_from_the_one_to_many_head_to_the_one_to_one_head(epochs, shares):
    loss = EndToEndLoss(nc=2, epochs=epochs)
    for epoch, share in shares.items():
        loss.set_epoch(epoch)
        assert loss.one2many_share == pytest.approx(share, abs=1e-12)


def test_end_to_end_loss_is_the_weighted_sum_and_logs_the_one_to_one_items():
    torch.manual_seed(0)
    model = build_model("yolo26n", 2)
    maps, one2one_maps = model(torch.rand(2, 3, 64, 64))
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.4, 0.3], [1, 1, 0.3, 0.6, 0.2, 0.2]])
    loss = EndToEndLoss(nc=2, epochs=10)
    loss.set_epoch(3)
    total, items = loss((maps, one2one_maps), targets)
    many, _ = DetectionLoss(nc=2, reg_max=1, topk=10, min_side=16, assign_ciou=True)(maps, targets)
    one, one_items = DetectionLoss(nc=2, reg_max=1, topk=7, topk2=1, min_side=16, assign_ciou=True)(one2one_maps,
                                                                                                     targets)
    share = 0.1 + 0.7 * (1 - 3 / 9)
    assert total.item() == pytest.approx((share * many + (1 - share) * one).item(), rel=1e-6)
    assert torch.equal(items, one_items) and loss.names == ("box_loss", "cls_loss", "l1_loss")


def test_the_one_to_one_loss_trains_its_own_branches_only():
    """Ultralytics detaches the features the one-to-one head sees: its loss
    reaches its branches, never the body or the one-to-many head."""
    torch.manual_seed(0)
    model = build_model("yolo26n", 2)
    _, one2one_maps = model(torch.rand(1, 3, 64, 64))
    one, _ = DetectionLoss(nc=2, reg_max=1, topk=7, topk2=1)(one2one_maps, torch.tensor([[0, 0, .5, .5, .4, .4]]))
    one.backward()
    reached = {n.split(".")[0] + "." + n.split(".")[1] for n, p in model.named_parameters() if p.grad is not None}
    assert reached == {"head.one2one_box", "head.one2one_cls"}
