"""The oriented-box losses against ultralytics' own: v8OBBLoss (YOLOv8,
YOLO11: reg_max 16), and YOLO26's v8OBBLoss of each head and E2ELoss over
both, on the head outputs and rotated boxes benchmarks/ultralytics_reference.py
`obb_loss_inputs` makes from a seed; ultralytics' figures under `obb` in
tests/reference/ultralytics/loss.json (that script's `loss`, in the benchmark
venv). Every item within 1e-5 relative; and the world-size scaling."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO
from test_segment_loss import as_levels, close_to
from test_task_models import reference_script

from hpcyolo_trainer.optim.obb_loss import EndToEndOBBLoss, OBBLoss

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "loss.json").read_text())["obb"]
WORST: dict[str, float] = {}


def head_outputs(x: dict, head: str, script) -> tuple:
    """One head's outputs of `obb_loss_inputs` as OBBModel gives them: (maps, angles) per level."""
    maps = as_levels(torch.cat([x[head]["boxes"], x[head]["scores"]], 1), script.LOSS_HW, script.LOSS_STRIDES)
    return maps, as_levels(x[head]["angle"], script.LOSS_HW, script.LOSS_STRIDES)


def targets_of(x: dict) -> torch.Tensor:
    """[M, 7]: image, class, cx, cy, w, h, r."""
    return torch.cat([x["batch_idx"][:, None].float(), x["cls"][:, None].float(), x["rboxes"]], 1)


@pytest.mark.parametrize("case", sorted(REFERENCE))
def test_equals_ultralytics_v8_obb_loss(case, one_thread):
    script = reference_script()
    x, expected = script.obb_loss_inputs(case), REFERENCE[case]
    hyp = expected["hyp"]
    loss_fn = OBBLoss(3, reg_max=16, strides=script.LOSS_STRIDES, min_side=16, box=hyp["box"], cls=hyp["cls"],
                      dfl=hyp["dfl"], angle=hyp["angle"])
    assert loss_fn.names == ("box_loss", "cls_loss", "dfl_loss", "angle_loss")
    total, items = loss_fn(head_outputs(x, "v8", script), targets_of(x))
    WORST[f"v8 {case}"] = close_to(dict(zip(loss_fn.names, items.tolist())), expected["v8"]["items"], case)
    assert float(total) == pytest.approx(expected["v8"]["total"], rel=1e-5)
    if case != "empty":  # every term takes part
        assert all(v > 0 for v in expected["v8"]["items"].values())


@pytest.mark.parametrize("case", sorted(REFERENCE))
def test_equals_ultralytics_yolo26_obb_losses(case, one_thread):
    """Each head's loss alone (the one-to-one head's topk 7 then 1) and
    E2ELoss over both at its first epoch's weights (0.8 one-to-many)."""
    script = reference_script()
    x, expected = script.obb_loss_inputs(case), REFERENCE[case]
    hyp = expected["hyp"]
    gains = dict(box=hyp["box"], cls=hyp["cls"], dfl=hyp["dfl"], angle=hyp["angle"])
    e2e = EndToEndOBBLoss(3, epochs=100, strides=script.LOSS_STRIDES, **gains)
    assert e2e.names == ("box_loss", "cls_loss", "l1_loss", "angle_loss")
    assert e2e.one2many_share == pytest.approx(expected["end2end"]["one2many_share"])
    targets = targets_of(x)
    for head, loss_fn in (("one2many", e2e.one2many), ("one2one", e2e.one2one)):
        total, items = loss_fn(head_outputs(x, head, script), targets)
        WORST[f"26 {head} {case}"] = close_to(dict(zip(loss_fn.names, items.tolist())), expected[head]["items"],
                                              f"{head} {case}")
        assert float(total) == pytest.approx(expected[head]["total"], rel=1e-5)
    total, items = e2e((head_outputs(x, "one2many", script), head_outputs(x, "one2one", script)), targets)
    WORST[f"26 end2end {case}"] = close_to(dict(zip(e2e.names, items.tolist())), expected["end2end"]["items"], case)
    assert float(total) == pytest.approx(expected["end2end"]["total"], rel=1e-5)


def test_worst_relative_difference(one_thread):
    """Prints the largest relative difference per case (run with -s)."""
    print({k: f"{v:.1e}" for k, v in WORST.items()})


def test_without_a_foreground_the_box_terms_are_zero_but_attached(one_thread):
    maps = [torch.randn(1, 64 + 3, 8, 12, requires_grad=True)]
    angles = [torch.randn(1, 1, 8, 12, requires_grad=True)]
    total, items = OBBLoss(3, strides=(8,))((maps, angles), torch.zeros(0, 7))
    assert items[0] == items[2] == items[3] == 0 and items[1] > 0
    total.backward()
    assert angles[0].grad is not None and not angles[0].grad.any()


def _share(x: dict, head: str, script, image: int) -> tuple[tuple, torch.Tensor]:
    """One image's outputs of `head` (as leaves) and its targets, renumbered to image 0."""
    maps, angles = head_outputs(x, head, script)
    outputs = ([m[image:image + 1].clone().requires_grad_() for m in maps],
               [a[image:image + 1].clone().requires_grad_() for a in angles])
    rows = targets_of(x)
    rows = rows[rows[:, 0] == image]
    rows[:, 0] = 0
    return outputs, rows


def _loss_fn(world: int):
    return OBBLoss(3, strides=(8, 16, 32), min_side=16, world_size=world), \
        EndToEndOBBLoss(3, epochs=10, strides=(8, 16, 32), world_size=world)


def _rank_share(rank: int, world: int, port: int, out: str) -> None:
    """Rank `rank` takes image `rank` of the `objects` case; saves its items and output gradients."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    script, saved = reference_script(), {}
    x = script.obb_loss_inputs("objects")
    v8, e2e = _loss_fn(world)
    outputs, rows = _share(x, "v8", script, rank)
    total, items = v8(outputs, rows)
    total.backward()
    saved["v8"] = items, [t.grad for t in outputs[0] + outputs[1]]
    many, many_rows = _share(x, "one2many", script, rank)
    one, _ = _share(x, "one2one", script, rank)
    total, items = e2e((many, one), many_rows)
    total.backward()
    saved["e2e"] = items, [t.grad for t in many[0] + many[1] + one[0] + one[1]]
    torch.save(saved, f"{out}-{rank}.pt")
    dist.destroy_process_group()


def test_two_ranks_take_one_process_step(tmp_path, one_thread):
    """The `objects` case's two images on two ranks (world_size 2, the
    target-score mass summed over them): each rank's output gradients,
    averaged as DDP averages, are one process's on the whole batch, and the
    ranks' items average to its items (YOLOv8's loss and YOLO26's both heads)."""
    import torch.multiprocessing as mp
    from hpcyolo.node.local import free_port

    mp.spawn(_rank_share, args=(2, free_port(), str(tmp_path / "share")), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"share-{r}.pt") for r in range(2)]
    script = reference_script()
    x = script.obb_loss_inputs("objects")
    v8, e2e = _loss_fn(1)
    maps, angles = head_outputs(x, "v8", script)
    leaves = [t.clone().requires_grad_() for t in maps + angles]
    total, items = v8((leaves[:3], leaves[3:]), targets_of(x))
    total.backward()
    expected = {"v8": (items, [t.grad for t in leaves])}
    many = [t.clone().requires_grad_() for t in sum(head_outputs(x, "one2many", script), [])]
    one = [t.clone().requires_grad_() for t in sum(head_outputs(x, "one2one", script), [])]
    total, items = e2e(((many[:3], many[3:]), (one[:3], one[3:])), targets_of(x))
    total.backward()
    expected["e2e"] = items, [t.grad for t in many + one]
    for key, (items, grads) in expected.items():
        torch.testing.assert_close((ranks[0][key][0] + ranks[1][key][0]) / 2, items, rtol=1e-5, atol=1e-6)
        for k, grad in enumerate(grads):
            shared = torch.cat([ranks[0][key][1][k], ranks[1][key][1][k]]) / 2  # DDP's mean over the ranks
            torch.testing.assert_close(shared, grad, rtol=1e-4, atol=1e-7)
        # the maps and (where an anchor is foreground) the angles get gradients: the comparison is not of zeros
        assert all(g.abs().sum() > 0 for g in grads[:3]) and sum(g.abs().sum() for g in grads[3:6]) > 0
