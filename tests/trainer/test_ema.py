"""The weights' moving average: the batched update computes what the textbook
formula does, and leaves the model alone."""

from __future__ import annotations

import copy

import torch

from hpcyolo_trainer.optim.ema import ModelEMA
from hpcyolo_trainer.model.detector import build_model


def test_ema_update_matches_the_formula_for_every_tensor():
    torch.manual_seed(0)
    model = build_model("yolov8n", 3)
    ema = ModelEMA(model, tau=3.0)
    want = {k: v.clone() for k, v in ema.module.state_dict().items()}
    for step in range(1, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
            for name, b in model.named_buffers():
                if b.dtype.is_floating_point:
                    b.mul_(1.5)
                else:
                    b.add_(step)
        before = copy.deepcopy(model.state_dict())
        ema.update(model)
        d = ema._decay()
        assert 0 < d < 1
        for name, value in model.state_dict().items():
            if value.dtype.is_floating_point:
                want[name] = d * want[name] + (1 - d) * value
            else:
                want[name] = value.clone()
        got = ema.module.state_dict()
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    assert ema.updates == 3
    first = next(k for k, v in got.items() if v.dtype.is_floating_point)
    assert not torch.equal(got[first], model.state_dict()[first])


def test_the_pairing_is_kept_for_the_model_and_made_again_for_another():
    """update() pairs the EMA's tensors with the model's once and keeps the
    pairs (the model's tensors change in place); another model object is
    paired anew, so the average follows that model's values."""
    torch.manual_seed(0)
    model = build_model("yolov8n", 3)
    ema = ModelEMA(model, tau=1e-9)  # decay 0.9999 from the first update on
    ema.update(model)
    pairs = ema._paired[1]
    ema.update(model)
    assert ema._paired[1] is pairs
    other = build_model("yolov8n", 3)
    with torch.no_grad():
        for p in other.parameters():
            p.fill_(1.0)
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    ema.update(other)
    d = ema._decay()
    name = next(n for n, _ in other.named_parameters())
    torch.testing.assert_close(ema.module.state_dict()[name], d * before[name] + (1 - d))
    assert ema._paired[0] is other
