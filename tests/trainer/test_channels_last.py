"""channels_last (NHWC), the trainer's memory format on a GPU (train.layout),
run through the trainer's own functions on the CPU, where torch computes in
that format too: a training step, the EMA's validation and a checkpoint of
the weights give what NCHW gives. The GPU suite trains in it for real."""

from __future__ import annotations

import io

import torch
from conftest import SHARED

from hpcyolo_trainer.parallel.dist import Dist
from hpcyolo_trainer.optim.ema import ModelEMA
from hpcyolo_trainer.eval.evaluate import ValBatches, validate
from hpcyolo_trainer.optim.loss import DetectionLoss
from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.common.settings import TrainConfig
from hpcyolo_trainer.run.step import layout, optimizer_step
from hpcyolo_trainer.run.setup import place_model

FIXTURE = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes"
CPU = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def test_layout_is_channels_last_on_a_gpu_only_and_only_where_asked():
    on, off = TrainConfig(run_dir="r", data="d"), TrainConfig(run_dir="r", data="d", channels_last=False)
    assert on.channels_last is True  # the default, as ultralytics trains on a GPU
    assert layout(on, torch.device("cuda", 0)) == torch.channels_last
    assert layout(off, torch.device("cuda", 0)) == torch.contiguous_format
    assert layout(on, torch.device("cpu")) == torch.contiguous_format


def step(memory_format):
    torch.manual_seed(0)
    model = place_model(build_model("yolov8n", 4), CPU, memory_format)
    ema = ModelEMA(model)
    loss_fn = DetectionLoss(4, reg_max=model.reg_max, strides=tuple(model.stride.tolist()))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    g = torch.Generator().manual_seed(1)
    imgs = torch.rand(4, 3, 96, 96, generator=g).contiguous(memory_format=memory_format)
    targets = torch.tensor([[i, i % 4, 0.5, 0.5, 0.3, 0.2] for i in range(4)])
    loss, _ = loss_fn(model(imgs), targets)
    loss.backward()
    optimizer_step(model, opt, scaler, ema, clip_norm=10.0)
    return model, ema, loss.detach()


def test_a_training_step_and_the_emas_validation_in_channels_last_equal_nchw():
    nhwc, ema_nhwc, loss_nhwc = step(torch.channels_last)
    nchw, ema_nchw, loss_nchw = step(torch.contiguous_format)
    conv = next(m for m in nhwc.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(loss_nhwc, loss_nchw, rtol=1e-4)
    for (k, a), b in zip(nhwc.state_dict().items(), nchw.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5), k
    # The trainer's validation of the EMA model, in the layout it trained in.
    from hpcyolo_trainer.common.datayaml import load_data_spec

    spec = load_data_spec(FIXTURE / "data.yaml")
    batches = ValBatches(spec.val, 4, 96, 8)
    got = [validate(CPU, ema.module, batches) for ema in (ema_nhwc, ema_nchw)]
    assert got[0]["map50_95"] == got[1]["map50_95"] or abs(got[0]["map50_95"] - got[1]["map50_95"]) < 1e-3
    # A checkpoint of weights in channels_last loads into an NCHW model as the same values.
    buf = io.BytesIO()
    torch.save(ema_nhwc.module.state_dict(), buf)
    fresh = build_model("yolov8n", 4)
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    for (k, a), b in zip(fresh.state_dict().items(), ema_nhwc.module.state_dict().values()):
        assert torch.equal(a, b), k
