"""One rank against many: the optimizer step of a global batch does not
depend on how the batch is split over ranks.

Real gloo process groups (the trainer's own dist.setup), ultralytics' own
yolov8n checkpoint read by our loader, its 160 px images (at imgsz 96), and the trainer's
own pieces for everything between the batch and the new weights: the model
as the trainer places it, the loss, DDP's reduction, accumulation to nbs,
the weight-decay scaling, the warm-up and schedule, clipping and the SGD
step. Twice: with BatchNorm frozen (eval mode), where the split cannot
change the maths, and in training mode, where the ranks normalise over the
global batch together (syncbn.py: torch's SyncBatchNorm is GPU-only). And
once for ultralytics' YOLO26n checkpoint: both heads' losses (EndToEndLoss).
And once for ultralytics' yolo11n-seg trained on a shapes set with polygons
(tests/reference/ultralytics/trained): its loss's mask term too
(SegmentationLoss); and for its yolo26n-seg: both heads, the mask-aware
assignment and the semantic map's term (EndToEndSegmentationLoss). And for ultralytics' yolo11n-obb and yolo26n-obb
trained on a shapes set of oriented boxes: the rotated assignment, ProbIoU and angle terms (OBBLoss, and both heads'
EndToEndOBBLoss). And for ultralytics' yolo11n-pose and yolo26n-pose trained on a shapes set of keypoints: the
keypoint terms (PoseLoss: OKS location and visibility), and YOLO26's both heads with the OKS-aware assignment and
the RLE term through the head's flow (EndToEndPoseLoss). And once for a yolo11n classifier, freshly initialised,
on a shapes set of class folders, BatchNorm frozen: the cross entropy over
the global batch (ClassificationLoss).
"""

from __future__ import annotations

import os
from multiprocessing import forkserver
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import SHARED

from hpcyolo.login.shapes import make_shapes
from hpcyolo.node.local import free_port

FIXTURES = SHARED / "fixtures" / "ultralytics"
# (fixture, BatchNorm, clip_norm) of each step compared
# Not a fixture: ultralytics' yolo11n-seg trained on shapes (tests/reference), on the set `steps` writes (SEGMENT_DATA).
SEGMENT, SEGMENT26 = "yolo11n-segment-shapes", "yolo26n-segment-shapes"
SEGMENT_WEIGHTS = {name: Path(__file__).resolve().parent.parent / "reference" / "ultralytics" / "trained" / model /
                   "model.pt" for name, model in ((SEGMENT, "yolo11n-seg"), (SEGMENT26, "yolo26n-seg"))}
SEGMENT_DATA = "HPCYOLO_TEST_SEGMENT_DATA"
# Likewise ultralytics' yolo11n-obb and yolo26n-obb, on the oriented boxes `steps` writes (OBB_DATA).
OBB, OBB26 = "yolo11n-obb-shapes", "yolo26n-obb-shapes"
OBB_WEIGHTS = {name: SEGMENT_WEIGHTS[SEGMENT].parent.parent / model / "model.pt"
               for name, model in ((OBB, "yolo11n-obb"), (OBB26, "yolo26n-obb"))}
OBB_DATA = "HPCYOLO_TEST_OBB_DATA"
# Likewise ultralytics' yolo11n-pose and yolo26n-pose, on the keypoints `steps` writes (POSE_DATA). yolo26n-pose in
# float64, as the classifier: in float32 one rank's step and two ranks' differed by 1.4e-5 (relative; the largest
# gaps in stage 5's BatchNorm biases, 5 x 5 maps at imgsz 160 whose gradients cancel, reordered by the ranks' split;
# 1.8e-6 with BatchNorm frozen), in float64 by 3.1e-8 (the loss's own float32 terms): rounding, not the world size's
# scaling.
POSE, POSE26 = "yolo11n-pose-shapes", "yolo26n-pose-shapes"
POSE_WEIGHTS = {name: SEGMENT_WEIGHTS[SEGMENT].parent.parent / model / "model.pt"
                for name, model in ((POSE, "yolo11n-pose"), (POSE26, "yolo26n-pose"))}
POSE_DATA = "HPCYOLO_TEST_POSE_DATA"
# Not a fixture either: a yolo11n classifier from its seeded initialisation, on the class folders `steps` writes,
# its BatchNorm training, in float64: in float32 this fresh classifier's gradient is itself 2.2e-5 (relative) from
# float64's, and one rank's step and two ranks' differed by 8.4e-5 (rounding spread over every layer); in float64
# they agree to 1.6e-12, so the row holds the classifier's loss scaling and cross-rank BatchNorm, not its rounding.
CLASSIFY, CLASSIFY_DATA = "yolo11n-classify-shapes", "HPCYOLO_TEST_CLASSIFY_DATA"
CASES = [("yolov8n-shapes", bn, clip) for bn in ("frozen", "train") for clip in (10.0, 0.0)] + \
        [("yolo26n-shapes", "train", 10.0), (SEGMENT, "train", 10.0), (SEGMENT26, "train", 10.0),
         (OBB, "train", 10.0), (OBB26, "train", 10.0), (POSE, "train", 10.0), (POSE26, "train", 10.0),
         (CLASSIFY, "train", 0.0)]
GLOBAL_BATCH, NBS, IMGSZ = 8, 16, 96  # accumulate 2: one optimizer step sees 16 images
# imgsz 96, not 160: nothing in the split depends on the size, and the ranks' CPU time is a tenth lower; the
# largest update gap (yolo26n-obb, 4 ranks) was 8.5e-6 relative at 96 against 7.9e-6 (2 ranks) at 160.
STEP = 5  # an optimizer step at batch 5, inside the warm-up (18 batches here): warm-up LR and momentum apply


def _steps(rank: int, world: int, port: int, out: str) -> None:
    """Rank `rank` of `world`: for each of CASES, one optimizer step from the
    same weights on its share of two global batches (the cases that differ
    only in clip_norm share the model and its gradients: _one_step)."""
    from hpcyolo_trainer.parallel.dist import cleanup, setup
    from hpcyolo_trainer.common.rendezvous import JOB_ENV
    from hpcyolo_trainer.run.setup import loader_workers, say_ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), **{JOB_ENV: f"world-{world}"})
    torch.set_num_threads(1)
    d = setup(60)
    results = {}
    for fixture, batchnorm in dict.fromkeys(case[:2] for case in CASES):
        clips = [c for f, b, c in CASES if (f, b) == (fixture, batchnorm)]
        results.update({(fixture, batchnorm, clip): record
                        for clip, record in zip(clips, _one_step(d, fixture, batchnorm, clips))})
    everyone = say_ranks(d)
    results["layout"] = [(*r[:6], tuple(sorted(r[-1]))) for r in everyone]  # torch.load takes no frozenset
    results["workers"] = loader_workers(64, d, everyone)
    if rank == 0:
        torch.save(results, out)
    cleanup()


def _one_step(d, fixture: str, batchnorm: str, clips: list[float]) -> list[dict]:
    """One record per clip_norm in `clips`: the model read, placed and run
    forward and backward once (nothing before the optimizer step depends on
    clip_norm), then each optimizer step from the same weights and the same
    summed gradients, with an optimizer of its own."""
    from hpcyolo_trainer.data.dataset import AugmentHyp, YoloDataset, collate, load_data_spec
    from hpcyolo_trainer.optim.ema import ModelEMA
    from hpcyolo_trainer.common.settings import TrainConfig
    from hpcyolo_trainer.run.setup import build_optimization, initial_model, place_model
    from hpcyolo_trainer.run.step import data_parallel, forward_backward, optimizer_step
    from hpcyolo_trainer.model.weights import read_weights
    from hpcyolo_trainer.tasks.task import load

    segment, obb, pose = fixture in SEGMENT_WEIGHTS, fixture in OBB_WEIGHTS, fixture in POSE_WEIGHTS
    task = load("segment" if segment else "obb" if obb else "pose" if pose else "classify" if fixture == CLASSIFY
                else "detect")
    data = os.environ[SEGMENT_DATA] if segment else os.environ[OBB_DATA] if obb else os.environ[POSE_DATA] if pose \
        else os.environ[CLASSIFY_DATA] if fixture == CLASSIFY else str(FIXTURES / fixture / "data.yaml")
    cfg = TrainConfig(run_dir="unused", data=data, batch=GLOBAL_BATCH, nbs=NBS, task=task.name,
                      imgsz=IMGSZ, clip_norm=clips[0], epochs=10, optimizer="sgd")
    spec = load_data_spec(cfg.data)
    task = task.with_data(spec)  # pose: the data YAML's kpt_shape in the model, the dataset and the loss
    if fixture == CLASSIFY:
        from hpcyolo_trainer.data.classify import ClassifyDataset

        dataset = ClassifyDataset(spec.train, spec.names, IMGSZ)
        model, _ = initial_model("yolo11n", len(spec.names), cfg.seed, None, task.build_model)
    else:
        dataset = YoloDataset(spec.train, IMGSZ, augment=False, hyp=AugmentHyp(), names_count=len(spec.names),
                              segments=segment, obb=obb, kpt_shape=spec.kpt_shape if pose else None)
        weights = read_weights(SEGMENT_WEIGHTS[fixture] if segment else OBB_WEIGHTS[fixture] if obb
                               else POSE_WEIGHTS[fixture] if pose else FIXTURES / fixture / "model.pt")
        model, _ = initial_model(weights.arch, len(spec.names), cfg.seed, weights, task.build_model)
    model = place_model(model, d)
    dtype = torch.float64 if fixture in (CLASSIFY, POSE26) else torch.float32
    model = model.to(dtype)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    net = data_parallel(model, d)
    optimizer, schedule, accumulate = build_optimization(cfg, model, len(dataset) // GLOBAL_BATCH)
    assert accumulate == 2
    loss_fn = task.loss(model, len(spec.names), d.world_size, cfg)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    net.train()
    for m in model.modules():
        if batchnorm == "frozen" and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    rank, world = d.rank, d.world_size
    share = GLOBAL_BATCH // world
    items = []
    for k in range(accumulate):
        first = k * GLOBAL_BATCH + rank * share
        imgs, targets, _, _ = collate([dataset[i] for i in range(first, first + share)])
        items.append(forward_backward(net, loss_fn, imgs.to(dtype) / 255, targets, False, torch.float32, scaler,
                                      reduce=k == accumulate - 1))
    assert STEP < schedule.warmup_batches
    mean_items = torch.stack(items).mean(0)
    if d.distributed:
        torch.distributed.all_reduce(mean_items)
        mean_items /= world
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    records = []
    for n, clip in enumerate(clips):
        if n:  # the next clip_norm: back to the weights and gradients before the step, a fresh optimizer
            with torch.no_grad():
                for k, p in model.named_parameters():
                    p.copy_(before[k])
                    p.grad = grads[k].clone() if k in grads else None
            optimizer, schedule, _ = build_optimization(cfg, model, len(dataset) // GLOBAL_BATCH)
        schedule.apply(optimizer, STEP)
        norm = optimizer_step(model, optimizer, scaler, ModelEMA(model), clip)
        after = {k: p.detach().clone() for k, p in model.named_parameters()}
        records.append({"after": after, "delta": {k: p - before[k] for k, p in after.items()},
                        "buffers": {k: b.detach().clone() for k, b in model.named_buffers()},
                        "norm": None if norm is None else float(norm), "items": mean_items})
    return records


# What the ranks import, once, in the server they fork from (start): a fresh interpreter per rank spent about a
# CPU-second importing them.
PRELOAD = [__name__, "hpcyolo_trainer.parallel.dist", "hpcyolo_trainer.parallel.syncbn", "hpcyolo_trainer.run.setup",
           "hpcyolo_trainer.run.step", "hpcyolo_trainer.data.dataset", "hpcyolo_trainer.data.classify",
           "hpcyolo_trainer.model.weights", "hpcyolo_trainer.tasks.task", "hpcyolo_trainer.optim.ema"]


def start(fn, args: tuple, nprocs: int) -> None:
    """mp.spawn(fn, args, nprocs), each process forked from multiprocessing's
    fork server (a fresh process that imported PRELOAD and nothing else: no
    thread of this one's, no process group) instead of a fresh interpreter."""
    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


@pytest.fixture(scope="module", autouse=True)
def fork_server_down():
    """The fork server (start) ends with this module's tests, not with the session: its imports hold memory."""
    yield
    stop = getattr(forkserver._forkserver, "_stop", None)  # a later user starts another
    if stop is not None:
        stop()


def steps_of(world: int, tmp_path: Path) -> dict:
    """{case: the step's record} of rank 0 of `world` ranks."""
    out = str(tmp_path / f"steps-{world}.pt")
    start(_steps, (world, free_port(), out), world)
    return torch.load(out)


def relative(a: dict, b: dict) -> float:
    """|a - b| / |b| over all parameters' updates together: far stricter
    than comparing the parameters, whose updates are a small part of them."""
    diff = torch.cat([(a[k] - b[k]).flatten() for k in b]).double()
    ref = torch.cat([b[k].flatten() for k in b]).double()
    return float(diff.norm() / ref.norm())


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict:
    """{world size: {case: rank 0's record}} for 1, 2 and 4 ranks."""
    tmp = tmp_path_factory.mktemp("steps")
    os.environ[SEGMENT_DATA] = str(make_shapes(tmp / "segment", n_train=2 * GLOBAL_BATCH, n_val=2, imgsz=IMGSZ,
                                               task="segment", seed=4))
    os.environ[OBB_DATA] = str(make_shapes(tmp / "obb", n_train=2 * GLOBAL_BATCH, n_val=2, imgsz=IMGSZ, task="obb",
                                           seed=4))
    os.environ[POSE_DATA] = str(make_shapes(tmp / "pose", n_train=2 * GLOBAL_BATCH, n_val=2, imgsz=IMGSZ, task="pose",
                                            seed=4))
    os.environ[CLASSIFY_DATA] = str(make_shapes(tmp / "classify", n_train=2 * GLOBAL_BATCH, n_val=3, imgsz=IMGSZ,
                                                classes=3, task="classify", seed=4))
    try:
        return {world: steps_of(world, tmp) for world in (1, 2, 4)}
    finally:
        del os.environ[SEGMENT_DATA], os.environ[OBB_DATA], os.environ[POSE_DATA], os.environ[CLASSIFY_DATA]


def test_loader_workers_are_capped_at_the_cpus_a_rank_may_count_on(steps):
    from hpcyolo_trainer.run.setup import cpu_share

    mine = frozenset(os.sched_getaffinity(0))
    for world in (1, 2, 4):
        layout = [(*r[:6], frozenset(r[-1])) for r in steps[world]["layout"]]
        assert [r[0] for r in layout] == list(range(world)) and {r[-1] for r in layout} == {mine}
        assert steps[world]["workers"] == len(mine)  # CPU ranks: the whole affinity, as ultralytics on the CPU
        assert cpu_share(layout, 0) == max(1, len(mine) // world)  # GPU ranks: their share
    # Two hosts of 8 GPUs ranks: srun binding each task to 4 cores, or none binding them (32 cores shared).
    bound = [(r, r % 8, 8, 16, f"n{r // 8}", f"cuda:{r % 8}", frozenset(range(4 * (r % 8), 4 * (r % 8) + 4)))
             for r in range(16)]
    unbound = [(*r[:6], frozenset(range(32))) for r in bound]
    assert [cpu_share(bound, r) for r in (0, 9)] == [4, 4] and cpu_share(unbound, 9) == 4
    assert cpu_share(unbound[:9], 8) == 32  # alone on its host


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0][:-7]}-{c[1]}-{'clipped' if c[2] else 'not-clipped'}")
def test_one_optimizer_step_is_the_same_for_any_split_of_the_batch(steps, case):
    clip = case[2]
    one = steps[1][case]
    if clip:
        assert one["norm"] > clip  # the clip acts on this step
    for world in (2, 4):
        many = steps[world][case]
        rel = relative(many["delta"], one["delta"])
        length = float(torch.cat([v.flatten() for v in many["delta"].values()]).norm()
                       / torch.cat([v.flatten() for v in one["delta"].values()]).norm())
        assert rel < 1e-5, f"{world} ranks x {GLOBAL_BATCH // world}: update differs from 1 x {GLOBAL_BATCH} by " \
                           f"{rel:.2e} relative (its length is {length:.4f}x)"
        # Each parameter to within 1e-5 of itself or 2.5e-7 (two float32 steps at 1-2, the
        # largest parameters' own rounding): a gradient summed from terms that cancel, such
        # as a BatchNorm bias's, keeps the rounding of its terms, which the split reorders.
        for name, p in many["after"].items():
            torch.testing.assert_close(p, one["after"][name], rtol=1e-5, atol=2.5e-7,
                                       msg=lambda m, name=name: f"{name}: {m}")
        # BatchNorm's running statistics: those of the global batch (its unbiased variance), as one process's.
        for name, b in many["buffers"].items():
            torch.testing.assert_close(b, one["buffers"][name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m, name=name: f"{name}: {m}")
        # What the ranks log, averaged, is what one process logs.
        torch.testing.assert_close(many["items"], one["items"], rtol=1e-5, atol=0)
        if clip:
            assert many["norm"] == pytest.approx(one["norm"], rel=1e-5)


def _global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The images of one global batch (6 x 3 channels) and the weights of a loss on its output."""
    torch.manual_seed(0)
    return torch.randn(6, 3, 5, 4) * 3 + 2, torch.randn(6, 3, 5, 4)


def _affine(bn: torch.nn.BatchNorm2d) -> torch.nn.BatchNorm2d:
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 1.5, -1.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    return bn


# Ranks with uneven shares of one global batch of 6, one with none: {test id: each rank's first image, and the end}.
SPLITS = {"2+4": [0, 2, 6], "6+0": [0, 6, 6], "1+0+5": [0, 1, 1, 6]}


def _uneven_batchnorm(rank: int, world: int, ports: list[int], out: str) -> None:
    """For each of SPLITS with a rank `rank`: that rank normalises images
    bounds[rank]:bounds[rank + 1] of one global batch with
    CrossRankBatchNorm2d, in a process group of the split's own; saves its
    output, input gradient and buffers."""
    import torch.distributed as dist

    from hpcyolo_trainer.parallel.syncbn import CrossRankBatchNorm2d

    for port, (split, bounds) in zip(ports, SPLITS.items()):
        if rank >= len(bounds) - 1:
            continue
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(bounds) - 1)
        x_all, w_all = _global_batch()
        bn = _affine(CrossRankBatchNorm2d(3))
        x = x_all[bounds[rank]:bounds[rank + 1]].clone().requires_grad_()
        y = bn(x)
        (y * w_all[bounds[rank]:bounds[rank + 1]]).sum().backward()
        torch.save({"y": y.detach(), "grad": x.grad, "mean": bn.running_mean, "var": bn.running_var},
                   f"{out}-{split}-{rank}.pt")
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> dict:
    """{split: each rank's saved record} for every split of SPLITS, one
    after the other in the same processes (one start of them for all)."""
    out = tmp_path_factory.mktemp("uneven") / "bn"
    world = max(len(bounds) - 1 for bounds in SPLITS.values())
    ports: list[int] = []
    while len(ports) < len(SPLITS):  # a store of its own per split
        port = free_port()
        if port not in ports:
            ports.append(port)
    start(_uneven_batchnorm, (world, ports, str(out)), world)
    return {split: [torch.load(f"{out}-{split}-{r}.pt") for r in range(len(bounds) - 1)]
            for split, bounds in SPLITS.items()}


@pytest.mark.parametrize("split", list(SPLITS))
def test_cross_rank_batchnorm_is_one_batchnorm_of_the_global_batch_for_any_split(uneven, split):
    # Ranks with uneven shares, one with none: outputs, input gradients and running statistics are
    # those of torch's own BatchNorm2d over the whole batch in one process.
    parts = uneven[split]
    x_all, w_all = _global_batch()
    ref = _affine(torch.nn.BatchNorm2d(3))
    x = x_all.clone().requires_grad_()
    y = ref(x)
    (y * w_all).sum().backward()
    torch.testing.assert_close(torch.cat([p["y"] for p in parts]), y.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([p["grad"] for p in parts]), x.grad, rtol=1e-5, atol=1e-5)
    for p in parts:
        torch.testing.assert_close(p["mean"], ref.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p["var"], ref.running_var, rtol=1e-5, atol=1e-6)
