"""The keypoint loss against ultralytics' v8PoseLoss on the same inputs
(tests/reference/ultralytics/loss.json `pose`, written by
benchmarks/ultralytics_reference.py from seeded inputs it rebuilds here):
COCO's [17, 3] with its OKS sigmas, [5, 3] and [4, 2] with 1/K sigmas,
keypoints visible, occluded and unlabelled; every item within 1e-5."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO

from hpcyolo_trainer.optim.pose_loss import PoseLoss, keypoint_sigmas

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "loss.json").read_text())["pose"]


def reference_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ultralytics_reference", REPO / "benchmarks" /
                                                  "ultralytics_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_maps(flat: torch.Tensor, hw: tuple[int, int], strides=(8, 16, 32)) -> list[torch.Tensor]:
    """[B, C, anchors] as ultralytics flattens the levels -> per level [B, C, H, W]."""
    sizes = [(hw[0] // s, hw[1] // s) for s in strides]
    parts = flat.split([h * w for h, w in sizes], dim=2)
    return [p.reshape(*flat.shape[:2], h, w) for p, (h, w) in zip(parts, sizes)]


@pytest.mark.parametrize("case", ["coco17", "five-with-visibility", "four-without"])
def test_pose_loss_equals_ultralytics(case):
    script = reference_script()
    ref = REFERENCE[case]
    x = script.pose_loss_inputs(case)
    kpt_shape = tuple(ref["kpt_shape"])
    assert keypoint_sigmas(kpt_shape).tolist() == pytest.approx(ref["sigmas"], rel=1e-6)
    hw = script.LOSS_HW
    maps = as_maps(torch.cat([x["boxes"], x["scores"]], 1), hw)
    kpts = as_maps(x["kpts"], hw)
    targets = torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1)
    hyp = ref["hyp"]
    # ultralytics 8.4's assignment, as the detect and segment tasks make it: STAL (16 px) and CIoU alignment
    loss_fn = PoseLoss(3, strides=script.LOSS_STRIDES, kpt_shape=kpt_shape, min_side=16, assign_ciou=True,
                       box=hyp["box"], cls=hyp["cls"], dfl=hyp["dfl"], pose=hyp["pose"], kobj=hyp["kobj"])
    loss, items = loss_fn((maps, kpts), targets, x["keypoints"])
    theirs = ref["items"]
    assert loss_fn.names == tuple(theirs)
    worst = 0.0
    for name, ours in zip(loss_fn.names, items.tolist()):
        assert ours == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), name
        worst = max(worst, abs(ours - theirs[name]) / max(abs(theirs[name]), 1e-12))
    assert float(loss) == pytest.approx(ref["total"], rel=1e-5)
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


def _split_batch_rank(rank: int, world: int, port: int, case: str, out: str) -> None:
    """One rank of a gloo group: PoseLoss over its image of the batch."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        maps, kpts, targets, keypoints = _batch(case)
        maps = [m[rank:rank + 1].detach().requires_grad_() for m in maps]
        kpts = [k[rank:rank + 1].detach().requires_grad_() for k in kpts]
        mine = targets[:, 0] == rank
        rows = targets[mine].clone()
        rows[:, 0] = 0
        loss, items = _loss(case, world)((maps, kpts), rows, keypoints[mine])
        loss.backward()
        torch.save({"items": items, "maps": [m.grad for m in maps], "kpts": [k.grad for k in kpts]},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _batch(case: str):
    script = reference_script()
    x = script.pose_loss_inputs(case)
    maps = as_maps(torch.cat([x["boxes"], x["scores"]], 1), script.LOSS_HW)
    kpts = as_maps(x["kpts"], script.LOSS_HW)
    targets = torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["bboxes"]], 1)
    return maps, kpts, targets, x["keypoints"]


def _loss(case: str, world_size: int) -> PoseLoss:
    return PoseLoss(3, kpt_shape=tuple(REFERENCE[case]["kpt_shape"]), min_side=16, assign_ciou=True,
                    world_size=world_size)


def test_two_ranks_with_an_image_each_give_one_process_gradient(tmp_path):
    """The reference batch (2 images) on one process, and split over 2 gloo
    ranks: each rank's gradient, averaged as DDP averages, is the one
    process's gradient of its image; the ranks' mean items are its items."""
    import torch.multiprocessing as mp

    from hpcyolo.node.local import free_port

    case = "five-with-visibility"
    maps, kpts, targets, keypoints = _batch(case)
    maps = [m.detach().requires_grad_() for m in maps]
    kpts = [k.detach().requires_grad_() for k in kpts]
    loss, items = _loss(case, 1)((maps, kpts), targets, keypoints)
    loss.backward()
    mp.start_processes(_split_batch_rank, args=(2, free_port(), case, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert torch.allclose((ranks[0]["items"] + ranks[1]["items"]) / 2, items, rtol=1e-5, atol=1e-7)
    for key, ours in (("maps", maps), ("kpts", kpts)):
        for level, whole in enumerate(ours):
            split = torch.cat([ranks[r][key][level] for r in range(2)]) / 2  # DDP's average over the ranks
            assert torch.allclose(split, whole.grad, rtol=1e-4, atol=1e-8), (key, level)
    assert kpts[0].grad.abs().sum() > 0  # the keypoint terms reach the keypoint maps
