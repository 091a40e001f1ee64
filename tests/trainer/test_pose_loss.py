"""The keypoint loss against ultralytics' v8PoseLoss and YOLO26's
PoseLoss26 (each head's, E2ELoss's, validation's) on the same inputs
(tests/reference/ultralytics/loss.json `pose` and `pose26`, written by
benchmarks/ultralytics_reference.py from seeded inputs it rebuilds here):
COCO's [17, 3] with its OKS sigmas, [5, 3] and [4, 2] with 1/K sigmas,
keypoints visible, occluded and unlabelled; every item within 1e-5."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO
from test_task_models import reference_script

from hpcyolo_trainer.model.pose import keypoint_sigmas
from hpcyolo_trainer.optim.pose_loss import EndToEndPoseLoss, PoseLoss

LOSSES = json.loads((REPO / "tests" / "reference" / "ultralytics" / "loss.json").read_text())
REFERENCE, REFERENCE26 = LOSSES["pose"], LOSSES["pose26"]


def as_maps(flat: torch.Tensor, hw: tuple[int, int], strides=(8, 16, 32)) -> list[torch.Tensor]:
    """[B, C, anchors] as ultralytics flattens the levels -> per level [B, C, H, W]."""
    sizes = [(hw[0] // s, hw[1] // s) for s in strides]
    parts = flat.split([h * w for h, w in sizes], dim=2)
    return [p.reshape(*flat.shape[:2], h, w) for p, (h, w) in zip(parts, sizes)]


CASES = ["coco17", "five-with-visibility", "four-without", "five-own-sigmas"]


@pytest.mark.parametrize("case", CASES)
def test_pose_loss_equals_ultralytics(case):
    script = reference_script()
    ref = REFERENCE[case]
    x = script.pose_loss_inputs(case)
    kpt_shape, own = tuple(ref["kpt_shape"]), script.POSE_LOSS_SIGMAS.get(case)
    assert keypoint_sigmas(kpt_shape, own).tolist() == pytest.approx(ref["sigmas"], rel=1e-6)
    hw = script.LOSS_HW
    maps = as_maps(torch.cat([x["boxes"], x["scores"]], 1), hw)
    kpts = as_maps(x["kpts"], hw)
    targets = torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1)
    hyp = ref["hyp"]
    # ultralytics 8.4's assignment, as the detect and segment tasks make it: STAL (16 px) and CIoU alignment
    loss_fn = PoseLoss(3, strides=script.LOSS_STRIDES, kpt_shape=kpt_shape, sigmas=own, min_side=16,
                       assign_ciou=True, box=hyp["box"], cls=hyp["cls"], dfl=hyp["dfl"], pose=hyp["pose"],
                       kobj=hyp["kobj"])
    loss, items = loss_fn((maps, kpts), targets, x["keypoints"])
    theirs = ref["items"]
    assert loss_fn.names == tuple(theirs)
    worst = 0.0
    for name, ours in zip(loss_fn.names, items.tolist()):
        assert ours == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), name
        worst = max(worst, abs(ours - theirs[name]) / max(abs(theirs[name]), 1e-12))
    assert float(loss.detach()) == pytest.approx(ref["total"], rel=1e-5)
    print(f"{case}: max relative difference of the items {worst:.1e}")
    if kpt_shape[1] == 3:  # a case with visibility: the terms are not zero
        assert theirs["pose_loss"] > 0 and theirs["kobj_loss"] > 0


def test_pose_loss_without_objects_is_zero_and_reaches_every_keypoint_output():
    """An empty batch: zero keypoint terms, still attached to the keypoint maps (DDP)."""
    torch.manual_seed(0)
    maps = [torch.randn(1, 64 + 2, s, s, requires_grad=True) for s in (8, 4, 2)]
    kpts = [torch.randn(1, 5 * 3, s, s, requires_grad=True) for s in (8, 4, 2)]
    loss, items = PoseLoss(2, kpt_shape=(5, 3))((maps, kpts), torch.zeros(0, 6), torch.zeros(0, 5, 3))
    loss.backward()
    assert items[1] == 0 and items[2] == 0
    assert all(k.grad is not None for k in kpts)


def _split_batch_rank(rank: int, world: int, port: int, kind: str, out: str) -> None:
    """One rank of a gloo group: the loss over its image of the batch."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        heads, targets, keypoints, loss_fn = _batch(kind, world)
        heads = [[[m[rank:rank + 1].detach().requires_grad_() for m in maps] for maps in head] for head in heads]
        mine = targets[:, 0] == rank
        rows = targets[mine].clone()
        rows[:, 0] = 0
        loss, items = loss_fn(_preds(kind, heads), (rows, keypoints[mine]))
        loss.backward()
        torch.save({"items": items, "grads": [[[m.grad for m in maps] for maps in head] for head in heads],
                    "flow": [p.grad for p in _flow(loss_fn).parameters()] if kind == "yolo26" else []},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


SPLIT_CASE = "five-with-visibility"


def _batch(kind: str, world_size: int):
    """(per head: its maps, keypoint maps[, sigma maps]), targets, keypoints and the loss of `kind`."""
    script = reference_script()

    def targets_of(x):
        return torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1)

    kpt_shape = tuple(REFERENCE[SPLIT_CASE]["kpt_shape"])
    if kind == "yolov8":
        x = script.pose_loss_inputs(SPLIT_CASE)
        heads = [[as_maps(torch.cat([x["boxes"], x["scores"]], 1), script.LOSS_HW), as_maps(x["kpts"], script.LOSS_HW)]]
        loss_fn = PoseLoss(3, kpt_shape=kpt_shape, min_side=16, assign_ciou=True, world_size=world_size)
        return heads, targets_of(x), x["keypoints"], lambda preds, t: loss_fn(preds, t)
    x = script.pose26_loss_inputs(SPLIT_CASE)
    heads = [list(h) for h in heads26(x, script, sigmas=True)]
    loss_fn = EndToEndPoseLoss(3, epochs=10, kpt_shape=kpt_shape, flow=flow_of(script, kpt_shape),
                               world_size=world_size)
    return heads, targets_of(x), x["keypoints"], loss_fn


def _preds(kind: str, heads):
    return heads[0] if kind == "yolov8" else tuple(heads)


def _flow(loss_fn):
    return loss_fn.one2one.flow


@pytest.mark.parametrize("kind", ["yolov8", "yolo26"])
def test_two_ranks_with_an_image_each_give_one_process_gradient(kind, tmp_path):
    """The reference batch (2 images) on one process, and split over 2 gloo
    ranks: each rank's gradient, averaged as DDP averages, is the one
    process's gradient of its image (the flow's too: DDP averages the ranks'
    gradients of a parameter); the ranks' mean items are its items."""
    import torch.multiprocessing as mp

    from hpcyolo.node.local import free_port

    heads, targets, keypoints, loss_fn = _batch(kind, 1)
    heads = [[[m.detach().requires_grad_() for m in maps] for maps in head] for head in heads]
    loss, items = loss_fn(_preds(kind, heads), (targets, keypoints))
    loss.backward()
    mp.start_processes(_split_batch_rank, args=(2, free_port(), kind, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert torch.allclose((ranks[0]["items"] + ranks[1]["items"]) / 2, items, rtol=1e-5, atol=1e-6)
    for h, head in enumerate(heads):
        for o, maps in enumerate(head):
            for level, whole in enumerate(maps):
                split = torch.cat([ranks[r]["grads"][h][o][level] for r in range(2)]) / 2  # DDP's average
                assert torch.allclose(split, whole.grad, rtol=1e-4, atol=1e-7), (h, o, level)
    assert heads[0][1][0].grad.abs().sum() > 0  # the keypoint terms reach the keypoint maps
    if kind == "yolo26":
        assert heads[0][2][0].grad.abs().sum() > 0  # and RLE the sigma maps
        # The flow's gradient sums every keypoint's: where the two ranks' parts
        # cancel (-36.8 and 16.7 for -10.08), float32 rounding of the parts
        # (1e-7 of them) is the bound, not 1e-4 of the small sum.
        for p, a, b in zip(_flow(loss_fn).parameters(), ranks[0]["flow"], ranks[1]["flow"]):
            bound = 1e-4 * p.grad.abs() + 1e-6 * (a.abs() + b.abs())
            assert ((a + b) / 2 - p.grad).abs().le(bound).all(), ((a + b) / 2 - p.grad).abs().max()


def flow_of(script, kpt_shape):
    """A RealNVP with the reference's weights: `fill` of ultralytics' names (model.23.flow_model....)."""
    from hpcyolo_trainer.model.pose import RealNVP

    flow = RealNVP()
    with torch.no_grad():
        for name, value in flow.state_dict().items():
            value.copy_(script.fill(f"model.23.flow_model.{name}", tuple(value.shape)))
    return flow


def heads26(x, script, sigmas: bool):
    def head(name):
        h = x[name]
        maps = as_maps(torch.cat([h["boxes"], h["scores"]], 1), script.LOSS_HW)
        return maps, as_maps(h["kpts"], script.LOSS_HW), as_maps(h["kpts_sigma"], script.LOSS_HW) if sigmas else None
    return head("one2many"), head("one2one")


def close_items(ours: torch.Tensor, names, theirs: dict, what: str) -> float:
    assert tuple(names) == tuple(theirs), what
    worst = 0.0
    for name, value in zip(names, ours.tolist()):
        assert value == pytest.approx(theirs[name], rel=1e-5, abs=1e-6), (what, name)
        worst = max(worst, abs(value - theirs[name]) / max(abs(theirs[name]), 1e-12))
    return worst


@pytest.mark.parametrize("case", CASES)
def test_yolo26_pose_loss_equals_ultralytics(case):
    """Each head's PoseLoss26 (OKS assignment gated by level, the RLE term
    with the flow), E2ELoss's weighting of both, and validation's (no sigma
    maps: no RLE term)."""
    script = reference_script()
    ref = REFERENCE26[case]
    x = script.pose26_loss_inputs(case)
    kpt_shape, own = tuple(ref["kpt_shape"]), script.POSE_LOSS_SIGMAS.get(case)
    flow = flow_of(script, kpt_shape)
    hyp = ref["hyp"]
    gains = dict(box=hyp["box"], cls=hyp["cls"], dfl=hyp["dfl"], pose=hyp["pose"], kobj=hyp["kobj"], rle=hyp["rle"])
    targets = (torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1),
               x["keypoints"])
    many, one = heads26(x, script, sigmas=True)
    common = dict(reg_max=1, strides=script.LOSS_STRIDES, kpt_shape=kpt_shape, sigmas=own, pose26=True, flow=flow,
                  min_side=16, assign_ciou=True, **gains)
    worst = {}
    for name, preds, topk in (("one2many", many, dict(topk=10)), ("one2one", one, dict(topk=7, topk2=1))):
        loss_fn = PoseLoss(3, **topk, **common)
        total, items = loss_fn(preds, targets)
        worst[name] = close_items(items, loss_fn.names, ref[name]["items"], name)
        assert float(total.detach()) == pytest.approx(ref[name]["total"], rel=1e-5)
    e2e = EndToEndPoseLoss(3, epochs=100, strides=script.LOSS_STRIDES, kpt_shape=kpt_shape, sigmas=own, flow=flow,
                           **gains)
    assert e2e.one2many_share == ref["end2end"]["one2many_share"]
    for key, sigmas in (("end2end", True), ("validation", False)):
        total, items = e2e(heads26(x, script, sigmas), targets)
        worst[key] = close_items(items, e2e.names, ref[key]["items"], key)
        assert float(total.detach()) == pytest.approx(ref[key]["total"], rel=1e-5)
    assert ref["end2end"]["items"]["rle_loss"] > 0 and ref["validation"]["items"]["rle_loss"] == 0
    print(f"{case}: max relative difference of the items {max(worst.values()):.1e}")


def test_own_sigmas_must_be_one_positive_value_per_keypoint():
    with pytest.raises(ValueError, match="kpt_oks_sigmas must be 5 positive values"):
        keypoint_sigmas((5, 3), [0.1, 0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="kpt_oks_sigmas must be 3 positive values"):
        keypoint_sigmas((3, 2), [0.1, 0.0, 0.1])
