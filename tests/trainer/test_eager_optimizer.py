"""The trainer's optimizers (schedule.build_optimizer) without torch's
wrappers that import torch._dynamo at their first call (schedule.eager):
the same steps, bit for bit, as torch's own classes, the same state dict,
the caller's grad mode kept, and no torch._dynamo imported by a step."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

from hpcyolo_trainer.optim.musgd import MuSGD
from hpcyolo_trainer.optim.schedule import build_optimizer, eager

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 4))


@pytest.mark.parametrize("cls, kwargs", [
    (torch.optim.AdamW, {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 5e-4}),
    (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}),
    (MuSGD, {"lr": 0.01, "momentum": 0.9, "nesterov": True}),
])
def test_steps_and_state_are_bit_identical_to_torchs_class(cls, kwargs):
    ours_model, ref_model = _model(0), _model(0)
    ours, ref = eager(cls)(ours_model.parameters(), **kwargs), cls(ref_model.parameters(), **kwargs)
    assert isinstance(ours, cls) and type(ours).__name__ == cls.__name__ and type(ours) is not cls
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        for model, opt in ((ours_model, ours), (ref_model, ref)):
            with torch.enable_grad():
                model(x * (step + 1)).square().mean().backward()
            opt.step()
            assert torch.is_grad_enabled()  # the caller's grad mode, back after the step
            opt.zero_grad()
        for a, b in zip(ours_model.parameters(), ref_model.parameters()):
            assert torch.equal(a, b), step
    a, b = ours.state_dict(), ref.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for k in b["state"]:
        for name, value in b["state"][k].items():
            assert torch.equal(a["state"][k][name], value), (k, name)
    # A state dict of torch's class loads into ours (a checkpoint of an earlier start), and back.
    ref.load_state_dict(a)
    ours.load_state_dict(b)


def test_the_step_runs_without_grad_where_the_optimizer_is_not_differentiable(monkeypatch):
    seen = []
    module = importlib.import_module("torch.optim.sgd")  # torch.optim deletes its name there
    update = module.sgd

    def spy(*args, **kwargs):
        seen.append(torch.is_grad_enabled())
        return update(*args, **kwargs)

    monkeypatch.setattr(module, "sgd", spy)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    opt = eager(torch.optim.SGD)([p], lr=0.1)
    with torch.enable_grad():
        opt.step()
        assert torch.is_grad_enabled()
    with torch.no_grad():
        opt.step()
        assert not torch.is_grad_enabled()
    assert seen == [False, False]
    assert torch.allclose(p.data, torch.full((3,), 0.8))


def test_a_training_step_of_the_trainers_optimizers_imports_no_dynamo():
    code = """
import sys, torch
from hpcyolo_trainer.optim.schedule import build_optimizer
for name in ("adamw", "sgd", "musgd"):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    opt = build_optimizer(model, name, 0.01, 0.9, 5e-4)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    # ... where torch's own class imports it at its first step (else this test proves nothing).
    plain = subprocess.run([sys.executable, "-c", code.replace("build_optimizer(model, name, 0.01, 0.9, 5e-4)",
                                                               "torch.optim.SGD(model.parameters(), lr=0.01)")],
                           capture_output=True, text=True, check=True).stdout
    assert plain.strip() == "True"


def test_build_optimizer_gives_the_eager_classes():
    model = _model(0)
    for name, cls in (("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD), ("musgd", MuSGD)):
        opt = build_optimizer(model, name, 0.01, 0.9, 5e-4)
        assert isinstance(opt, cls) and type(opt) is not cls
