"""The trainer's mixed-precision step, run on the CPU's autocast: the same
model, loss, gradient scaler, clipping, optimizer and EMA sequence as the
training loop on a GPU (bf16, or fp16 with the scaler), so that dtype slips
in the loss or the scaler's use show here and not on a user's first GPU job.
The CUDA kernels themselves are tests/gpu's; without CUDA the trainer's
choice is AMP off (mixed_precision), checked here too."""

from __future__ import annotations

import math

import pytest
import torch

from hpcyolo_trainer.model.boxes import non_max_suppression
from hpcyolo_trainer.optim.ema import ModelEMA
from hpcyolo_trainer.optim.loss import DetectionLoss
from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.run.setup import mixed_precision
from hpcyolo_trainer.run.step import optimizer_step

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_step_keeps_the_loss_in_float32_and_trains(dtype):
    torch.manual_seed(0)
    model = build_model("yolov8n", 3)
    loss_fn = DetectionLoss(3, reg_max=model.reg_max, strides=tuple(model.stride.tolist()))
    ema = ModelEMA(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    targets = torch.tensor([[i, i % 3, 0.5, 0.5, 0.3, 0.2] for i in range(4)])
    for _ in range(3):
        with torch.autocast("cpu", dtype=dtype):
            loss, items = loss_fn(model(torch.rand(4, 3, 96, 96)), targets)
        # The loss is summed in float32 whatever the activations' dtype.
        assert loss.dtype == items.dtype == torch.float32
        assert math.isfinite(loss.item()) and torch.isfinite(items).all()
        scaler.scale(loss).backward()
        optimizer_step(model, opt, scaler, ema, clip_norm=10.0)  # the trainer's own step
    moved = [k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert len(moved) > 100, "the optimizer steps changed no weights"
    # What a checkpoint keeps: the scaler's state exactly where it is on (fp16).
    state = scaler.state_dict()
    assert bool(state) == (dtype == torch.float16)
    if state:
        assert math.isfinite(state["scale"]) and state["scale"] > 0
    assert ema.updates == 3


def test_prediction_under_autocast_goes_through_nms():
    torch.manual_seed(0)
    model = build_model("yolov8n", 3).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        preds = model.predict(torch.rand(2, 3, 96, 96))
    dets = non_max_suppression(preds.float(), conf_thres=0.001, iou_thres=0.7)
    assert len(dets) == 2 and all(d.shape[1] == 6 and d.dtype == torch.float32 for d in dets)


def test_without_cuda_the_trainer_trains_in_float32():
    amp, _, scaler = mixed_precision(torch.device("cpu"), wanted=True)
    assert not amp and not scaler.is_enabled()


def test_the_arithmetic_line_says_what_the_process_computes_with():
    from hpcyolo_trainer.run.setup import arithmetic

    torch.backends.cudnn.benchmark = False
    threads = torch.get_num_threads()
    assert arithmetic(False, torch.float16) == f"fp32, NCHW, cudnn.benchmark off, deterministic off, {threads} torch " \
        "threads"
    assert arithmetic(True, torch.bfloat16, torch.channels_last).startswith("AMP bf16, channels_last, ")
    assert arithmetic(True, torch.float16).startswith("AMP fp16 with the gradient scaler, ")
    torch.use_deterministic_algorithms(True)
    try:
        assert "deterministic on" in arithmetic(True, torch.bfloat16)
    finally:
        torch.use_deterministic_algorithms(False)
