"""One training step's pieces: the batch on the device, forward and
backward under DDP, the optimizer step; DDP itself (without the import of
torch._dynamo it does not need) and the buckets a resumed run settles."""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager, nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..common.settings import TrainConfig
from ..data.multiscale import rescale, step_size
from ..data.photometric import gains_of, hsv_jitter_batch
from ..optim.ema import ModelEMA
from ..optim.schedule import not_traced_inner
from ..parallel.dist import Dist


def layout(cfg: TrainConfig, device: torch.device) -> torch.memory_format:
    """The memory format of the model's weights and batches: channels_last
    (NHWC) on a GPU where cfg.channels_last, as ultralytics trains there (on an
    H200 it doubled the model step's images/s: benchmarks/bench_gpu.py);
    NCHW otherwise, and always on the CPU (no gain there, as in ultralytics)."""
    if cfg.channels_last and device.type == "cuda":
        return torch.channels_last
    return torch.contiguous_format


def device_batch(cfg: TrainConfig, d: Dist, imgs: torch.Tensor, metas, step: int) -> torch.Tensor:
    """A batch of uint8 images as the model trains on it: on the device, in
    [0, 1], HSV-jittered where the loader left that to the device, resized
    for multi-scale training (the same size on every rank: seeded by step)."""
    imgs = imgs.to(d.device, non_blocking=True).float() / 255
    if (gains := gains_of(metas)) is not None:
        imgs = hsv_jitter_batch(imgs, gains)
    if cfg.multi_scale:
        imgs = rescale(imgs, step_size(cfg.imgsz, cfg.multi_scale, cfg.seed, step), cfg.imgsz)
    return imgs.contiguous(memory_format=layout(cfg, d.device))


def forward_backward(net, loss_fn, imgs, targets, amp: bool, amp_dtype, scaler, reduce: bool = True,
                     span=nullcontext()) -> torch.Tensor:
    """Forward and backward of this rank's share of one global batch; the
    gradients add up until the optimizer step. `reduce=False` (a batch that
    is not the last one before the step) keeps DDP from all-reducing them
    yet. Returns the loss items (box, cls, dfl)."""
    sync = nullcontext() if reduce or not isinstance(net, DDP) else net.no_sync()
    with sync:
        with span, torch.autocast(imgs.device.type, dtype=amp_dtype, enabled=amp):
            loss, items = loss_fn(net(imgs), targets)
        scaler.scale(loss).backward()
    return items


def optimizer_step(model, optimizer, scaler, ema: ModelEMA, clip_norm: float) -> torch.Tensor | None:
    """One optimizer step on the summed gradients: unscale (a no-op without
    fp16), clip (unless clip_norm is 0), step (the scaler skips it on
    inf/nan), zero, update the EMA. Returns the gradients' norm before
    clipping (None when not clipping), a tensor: reading it waits for the device."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm) if clip_norm > 0 else None
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    ema.update(model)
    return norm


def data_parallel(model, d: Dist):
    """`model` under DDP where there are several ranks, else as it is."""
    if not d.distributed:
        return model
    # No buffer broadcast before each forward pass (the straggler report times
    # the forward): rank 0's buffers, the ones checkpointed and validated
    # (end_epoch broadcasts its EMA), are the same either way, as DDP
    # broadcast them from rank 0. torch 2.13 names it forward_sync_buffers.
    device_ids = [d.device.index] if d.device.type == "cuda" else None
    quiet = {"forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
             else "broadcast_buffers": False}
    with dynamo_stand_in():
        return EAGER_DDP(model, device_ids=device_ids, **quiet)


def eager_ddp() -> type:
    """DDP without torch's torch._disable_dynamo wrapper around its
    _inside_ddp_forward, which imports torch._dynamo at the first forward
    (what it adds matters only under torch.compile, which the trainer never
    uses); DDP itself where torch's method is other than that."""
    wrapped = getattr(vars(DDP).get("_inside_ddp_forward"), "__wrapped__", None)  # under @contextmanager
    inner = not_traced_inner(wrapped)
    if inner is None:
        return DDP
    return type(DDP.__name__, (DDP,), {"_inside_ddp_forward": contextmanager(inner), "__module__": DDP.__module__,
                                       "__qualname__": DDP.__qualname__, "__doc__": DDP.__doc__})


EAGER_DDP = eager_ddp()


@contextmanager
def dynamo_stand_in():
    """Around DDP's constructor: it asks torch._dynamo which reducer to use,
    and that import costs each rank about a second of CPU at every start
    (with 4 ranks on 2 CPUs, 2 s of a 8 s start), though the trainer never
    compiles. Where torch._dynamo is not imported yet, a stand-in gives
    dynamo's default answer (optimize_ddp True: "ddp_optimizer", DDP's own
    C++ reducer) and leaves afterwards; a later use imports the real one."""
    if "torch._dynamo" in sys.modules or "_dynamo" in vars(torch):
        yield
        return
    utils = type(sys)("torch._dynamo.utils (hpcyolo's stand-in)")
    utils.get_optimize_ddp_mode = lambda: "ddp_optimizer"
    stand_in = type(sys)("torch._dynamo (hpcyolo's stand-in)")
    stand_in.utils = utils
    torch._dynamo = stand_in
    try:
        yield
    finally:
        if vars(torch).get("_dynamo") is stand_in:
            del torch._dynamo


def settle_buckets(net, model, loss_fn, imgsz: int, device, amp: bool, amp_dtype) -> None:
    """One throwaway forward and backward through DDP, so that every real step
    all-reduces with the same gradient buckets.

    Why: DDP's first backward all-reduces all gradients as one bucket in
    parameter order; the next forward rebuilds the buckets in the order the
    gradients became ready. A ring all-reduce adds a value's per-rank terms in
    an order set by the value's position in its bucket, and with more than two
    ranks float addition is not associative: the first step after a resume
    (old layout) rounded differently from the same step of an uninterrupted
    run (rebuilt layout), and the runs drifted apart. Doing the first backward
    here, in a start that resumes after the run's first optimizer step,
    leaves weights, buffers, gradients and RNG state as they were. A start
    at the run's first step (a new run, or one stopped before its first
    step) needs none: its first backward is the uninterrupted run's first,
    in the same layout.

    BatchNorm layers run in eval mode here: across ranks (SyncBatchNorm,
    CrossRankBatchNorm2d) each would add a collective to the forward and one
    to the backward, over a hundred before the first step for nothing, since
    only the order of the gradients matters here."""
    buffers = [b.detach().clone() for b in model.buffers()]
    imgs = torch.zeros(2, 3, imgsz, imgsz, device=device)
    targets = loss_fn.example_targets(imgsz, device)
    net.train()
    for m in net.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
            loss, _ = loss_fn(net(imgs), targets)
        loss.backward()
    net.train()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)
