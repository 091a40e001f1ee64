"""Box geometry and NMS (hpcyolo_trainer.model.boxes) on hand-made cases and against a brute-force reference."""

from __future__ import annotations

import math

import pytest
import torch

from hpcyolo_trainer.model import boxes as B


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def reference_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """The textbook greedy loop, for comparison."""
    order = scores.argsort(descending=True, stable=True)
    iou = B.box_iou(boxes[order], boxes[order])
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if not suppressed[i]:
            keep.append(int(order[i]))
            suppressed |= iou[i] > iou_thres
    return torch.tensor(keep, dtype=torch.long)


def random_boxes(n: int, seed: int, size: float = 200.0) -> tuple[torch.Tensor, torch.Tensor]:
    """n random xyxy boxes in a size x size image and distinct scores."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size / 4 + 2
    return torch.cat((xy, xy + wh), 1), torch.randperm(n, generator=g).float() / n


def test_format_conversions_round_trip():
    xywh = torch.tensor([[10.0, 20.0, 4.0, 6.0]])
    xyxy = B.xywh2xyxy(xywh)
    assert torch.equal(xyxy, torch.tensor([[8.0, 17.0, 12.0, 23.0]]))
    assert torch.equal(B.xyxy2xywh(xyxy), xywh)
    batched = torch.rand(2, 3, 4)
    assert torch.allclose(B.xyxy2xywh(B.xywh2xyxy(batched)), batched, atol=1e-6)


def test_box_iou_known_values():
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 6.0, 6.0], [1.0, 0.0, 3.0, 2.0]])
    iou = B.box_iou(a, b)
    assert iou.shape == (1, 3)
    assert torch.allclose(iou, torch.tensor([[1.0, 0.0, 1 / 3]]), atol=1e-6)


def test_bbox_iou_plain_matches_box_iou_and_xywh():
    a, _ = random_boxes(6, seed=1)
    b, _ = random_boxes(6, seed=2)
    plain = B.bbox_iou(a, b, ciou=False)
    assert plain.shape == (6, 1)
    assert torch.allclose(plain[:, 0], B.box_iou(a, b).diagonal(), atol=1e-6)
    assert torch.allclose(B.bbox_iou(B.xyxy2xywh(a), B.xyxy2xywh(b), xywh=True, ciou=False), plain, atol=1e-5)


def test_ciou_penalises_centre_offset_and_aspect():
    gt = torch.tensor([0.0, 0.0, 4.0, 4.0])
    shifted = torch.tensor([1.0, 1.0, 5.0, 5.0])  # same shape, centre moved
    flat = torch.tensor([-1.0, 1.0, 5.0, 3.0])  # same centre, other aspect
    for box in (shifted, flat):
        iou, ciou = B.bbox_iou(box, gt, ciou=False), B.bbox_iou(box, gt)
        assert ciou.item() < iou.item()
    assert B.bbox_iou(gt, gt).item() == pytest.approx(1.0, abs=1e-6)
    far = torch.tensor([10.0, 10.0, 14.0, 14.0])
    assert -1.0 < B.bbox_iou(far, gt).item() < 0.0  # CIoU still ranks disjoint boxes by distance


def test_ciou_gradient_is_finite():
    box = torch.tensor([[1.0, 1.0, 5.0, 6.0]], requires_grad=True)
    B.bbox_iou(box, torch.tensor([[0.0, 0.0, 4.0, 4.0]])).sum().backward()
    assert torch.isfinite(box.grad).all() and box.grad.abs().sum() > 0


def test_make_anchors_tiny_maps():
    feats = [torch.zeros(1, 3, 2, 3, dtype=torch.float64), torch.zeros(1, 3, 1, 2, dtype=torch.float64)]
    points, strides = B.make_anchors(feats, (8, 16))
    expected = [[0.5, 0.5], [1.5, 0.5], [2.5, 0.5], [0.5, 1.5], [1.5, 1.5], [2.5, 1.5], [0.5, 0.5], [1.5, 0.5]]
    assert points.dtype == torch.float64 and strides.dtype == torch.float64
    assert points.tolist() == expected
    assert strides.tolist() == [[8.0]] * 6 + [[16.0]] * 2
    assert B.make_anchors(feats[:1], (8,), offset=0.0)[0][:2].tolist() == [[0.0, 0.0], [1.0, 0.0]]


def test_anchor_order_matches_flattened_maps():
    feat = torch.arange(6.0).view(1, 1, 2, 3)  # value = y * 3 + x
    points, _ = B.make_anchors([feat], (8,))
    flat = feat.flatten(2)[0, 0]
    assert torch.equal(flat, (points[:, 1] - 0.5) * 3 + (points[:, 0] - 0.5))


def test_dist2bbox_bbox2dist_round_trip():
    points = torch.tensor([[3.5, 3.5], [10.5, 2.5]])
    dist = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.25, 0.5, 6.0, 1.0]])
    xyxy = B.dist2bbox(dist, points, xywh=False)
    assert torch.equal(xyxy[0], torch.tensor([2.5, 1.5, 6.5, 7.5]))
    assert torch.allclose(B.bbox2dist(points, xyxy, reg_max=15), dist)
    assert torch.allclose(B.dist2bbox(dist, points), B.xyxy2xywh(xyxy))


def test_bbox2dist_clamps_to_bin_range():
    points = torch.tensor([[5.0, 5.0]])
    far = torch.tensor([[-100.0, 6.0, 100.0, 7.0]])  # left/right far away, top below the point
    dist = B.bbox2dist(points, far, reg_max=15)
    assert dist.tolist()[0] == pytest.approx([14.99, 0.0, 14.99, 2.0])


# Both NMS paths, each on the CPU: the sparse one (the CPU's) and the dense one
# (a GPU's, tests/gpu runs it there too).
DENSE = pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])


@DENSE
def test_nms_hand_case(dense):
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [50.0, 50.0, 60.0, 60.0]])
    scores = torch.tensor([0.8, 0.9, 0.7])
    assert B.nms(boxes, scores, 0.5, dense).tolist() == [1, 2]
    assert B.nms(boxes, scores, 0.9, dense).tolist() == [1, 0, 2]  # IoU 0.68 is below 0.9: all kept, by score
    assert B.nms(boxes[:0], scores[:0], 0.5, dense).tolist() == []


@DENSE
@pytest.mark.parametrize("iou_thres", [0.0, 0.3, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nms_matches_reference(seed, iou_thres, dense):
    boxes, scores = random_boxes(300, seed)
    assert torch.equal(B.nms(boxes, scores, iou_thres, dense), reference_nms(boxes, scores, iou_thres))


def test_dense_nms_in_blocks_of_top_boxes_with_small_overlap_blocks(monkeypatch):
    # Decided 64 boxes at a time, each block's overlaps built a few rows at a
    # time, crowds around a few objects: the suppressed boxes of each block
    # must be dropped before the next.
    monkeypatch.setattr(B, "_NMS_DENSE_TOP", 64)
    monkeypatch.setattr(B, "_NMS_PAIR_CHUNK", 500)
    boxes, scores = crowds(500, seed=5)
    assert torch.equal(B.nms(boxes, scores, 0.6, dense=True), reference_nms(boxes, scores, 0.6))
    boxes, scores = random_boxes(1000, seed=6)
    assert torch.equal(B.nms(boxes, scores, 0.3, dense=True), reference_nms(boxes, scores, 0.3))


def test_the_cpu_takes_the_sparse_nms_unless_told(monkeypatch):
    # (tests/gpu: a GPU takes the dense one)
    calls = []
    dense = B._dense_nms
    monkeypatch.setattr(B, "_dense_nms", lambda *a: calls.append(a[0].device.type) or dense(*a))
    boxes, scores = random_boxes(50, seed=7)
    B.nms(boxes, scores, 0.5)
    assert calls == []
    B.nms(boxes, scores, 0.5, dense=True)
    assert calls == ["cpu"]


def test_nms_small_chunks_and_loop_fallback(monkeypatch):
    # Force many pair chunks and an early switch to the row-by-row loop.
    monkeypatch.setattr(B, "_NMS_PAIR_CHUNK", 499)
    monkeypatch.setattr(B, "_NMS_ROUNDS", 1)
    boxes, scores = random_boxes(200, seed=3, size=100.0)
    assert torch.equal(B.nms(boxes, scores, 0.4), reference_nms(boxes, scores, 0.4))


def crowds(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n candidate boxes crowding around 5 objects, random scores."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(5, 2, generator=g) * 300
    which = torch.randint(0, 5, (n,), generator=g)
    xy = centres[which] + torch.randn(n, 2, generator=g) * 3
    return torch.cat((xy, xy + 40 + 4 * torch.randn(n, 2, generator=g)), 1), torch.rand(n, generator=g)


def test_nms_settles_crowded_top_boxes_first(monkeypatch):
    # Crowds of candidates around a few objects: the path that settles the
    # best boxes block by block before building the overlap graph.
    monkeypatch.setattr(B, "_NMS_SETTLE_MIN", 50)
    monkeypatch.setattr(B, "_NMS_SETTLE_TOP", 16)
    monkeypatch.setattr(B, "_NMS_SETTLE_PAIRS", 2)
    calls = []
    settle = B._settle_top
    monkeypatch.setattr(B, "_settle_top", lambda *a: calls.append(1) or settle(*a))
    boxes, scores = crowds(500, seed=4)
    assert torch.equal(B.nms(boxes, scores, 0.7), reference_nms(boxes, scores, 0.7))
    assert calls


@DENSE
def test_nms_long_suppression_chain(dense, monkeypatch):
    # Each box overlaps the next few, scores fall along the chain: greedy keeps
    # every few boxes and needs many rounds, so the loop fallback decides.
    calls = []
    rows = B._greedy_rows
    monkeypatch.setattr(B, "_greedy_rows", lambda *a: calls.append(1) or rows(*a))
    x = torch.arange(200.0) * 3
    boxes = torch.stack((x, torch.zeros_like(x), x + 100, torch.full_like(x, 100.0)), 1)
    scores = torch.linspace(1, 0, len(x))
    assert torch.equal(B.nms(boxes, scores, 0.5, dense), reference_nms(boxes, scores, 0.5))
    assert calls


@DENSE
def test_nms_degenerate_and_duplicate_boxes(dense):
    boxes = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 5.0, 5.0], [0.0, 0.0, 5.0, 5.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    assert B.nms(boxes, scores, 0.5, dense).tolist() == reference_nms(boxes, scores, 0.5).tolist() == [0, 1, 2]


def predictions(rows: list[list[float]], nc: int) -> torch.Tensor:
    """[1, 4+nc, A] from rows (cx, cy, w, h, cls, conf)."""
    out = torch.zeros(1, 4 + nc, len(rows))
    for a, (cx, cy, w, h, cls, conf) in enumerate(rows):
        out[0, :4, a] = torch.tensor([cx, cy, w, h])
        out[0, 4 + int(cls), a] = conf
    return out


def test_non_max_suppression_per_class():
    rows = [[50, 50, 20, 20, 0, 0.9], [51, 51, 20, 20, 0, 0.8], [50, 50, 20, 20, 1, 0.7], [200, 200, 10, 10, 2, 0.0005]]
    out = B.non_max_suppression(predictions(rows, nc=3), conf_thres=0.001, iou_thres=0.5)
    assert len(out) == 1 and out[0].shape == (2, 6)
    assert torch.allclose(out[0][0], torch.tensor([40.0, 40.0, 60.0, 60.0, 0.9, 0.0]))
    assert out[0][1, 4:].tolist() == pytest.approx([0.7, 1.0])  # same box, other class: kept
    agnostic = B.non_max_suppression(predictions(rows, nc=3), iou_thres=0.5, agnostic=True)[0]
    assert agnostic[:, 4].tolist() == pytest.approx([0.9])


def test_non_max_suppression_format_limits_and_empty():
    g = torch.Generator().manual_seed(0)
    preds = torch.rand(2, 4 + 5, 500, generator=g)
    preds[:, :2] *= 640
    preds[:, 2:4] = preds[:, 2:4] * 50 + 5
    preds[1, 4:] = 0.0  # second image: nothing above the threshold
    out = B.non_max_suppression(preds, conf_thres=0.25, iou_thres=0.7, max_det=7)
    assert [o.shape for o in out] == [(7, 6), (0, 6)]
    det = out[0]
    assert (det[:, 4] > 0.25).all() and torch.all(det[:-1, 4] >= det[1:, 4])
    assert (det[:, 2] > det[:, 0]).all() and (det[:, 5] == det[:, 5].round()).all()
    capped = B.non_max_suppression(preds, conf_thres=0.0, max_nms=10, max_det=300)[0]
    assert len(capped) <= 10


def test_non_max_suppression_half_precision():
    rows = [[50, 50, 20, 20, 79, 0.9], [51, 51, 20, 20, 79, 0.8]]
    out = B.non_max_suppression(predictions(rows, nc=80).half(), iou_thres=0.5)[0]
    assert out.dtype == torch.float16 and out.shape == (1, 6) and math.isfinite(out.float().sum().item())
