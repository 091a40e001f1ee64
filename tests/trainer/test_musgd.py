"""MuSGD (hpcyolo_trainer.optim.musgd), checked against outside references:
torch.optim.SGD for everything that is not a matrix, the SVD's polar factor
for the Newton-Schulz orthogonalisation, and ultralytics' parameter groups."""

from __future__ import annotations

import pytest
import torch

from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.optim.musgd import MuSGD, orthogonalise
from hpcyolo_trainer.optim.schedule import Schedule, build_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize("shape", [(64, 64), (32, 96), (96, 32), (16, 72)])
def test_orthogonalise_is_close_to_the_polar_factor_of_the_svd(shape):
    g = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u, _, vh = torch.linalg.svd(g[0], full_matrices=False)
    polar = u @ vh  # the exact orthogonalisation: every singular value 1
    o = orthogonalise(g)[0]
    assert o.dtype == torch.bfloat16 and o.shape == shape  # ultralytics' precision for it
    o = o.double()
    cosine = (o * polar).sum() / (o.norm() * polar.norm())
    assert cosine > 0.95, cosine
    # Five quintic steps bring singular values to about 0.6 .. 1.2, not to 1;
    # only the few smallest of the gradient's stay below.
    sv = torch.linalg.svdvals(o)
    assert sv.max() < 1.3 and (sv > 0.5).double().mean() > 0.9, sv
    # The gradient's scale does not matter: it is normalised away (by a power of 2: exactly).
    assert torch.equal(orthogonalise(g * 1024), orthogonalise(g))


def test_groups_without_muon_step_exactly_as_torch_sgd_with_nesterov():
    torch.manual_seed(0)
    ours, ref = torch.nn.Parameter(torch.randn(20)), torch.nn.Parameter(torch.randn(20))
    ref.data.copy_(ours.data)
    a = MuSGD([{"params": [ours], "use_muon": False}], lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True)
    b = torch.optim.SGD([ref], lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True)
    for step in range(4):
        grad = torch.randn(20, generator=torch.Generator().manual_seed(step))
        ours.grad, ref.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
        assert torch.equal(ours.data, ref.data), step


def test_a_muon_group_adds_the_orthogonalised_momentum_to_the_sgd_step():
    """First step from zero buffers: Nesterov momentum of g is (1 - b)(1 + b) g,
    whose orthogonalisation is g's (scale-free); the SGD part is torch's."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4, 3, 3))  # a conv: filters flattened to [8, 36]
    start = w.detach().clone()
    lr, beta, decay = 0.01, 0.9, 5e-4
    opt = MuSGD([{"params": [w], "use_muon": True, "weight_decay": decay}], lr=lr, momentum=beta, nesterov=True,
                muon=0.2, sgd=1.0)
    w.grad = torch.randn(8, 4, 3, 3)
    opt.step()
    ortho = orthogonalise(((1 - beta) * (1 + beta) * w.grad).reshape(1, 8, 36))[0].reshape(w.shape).float()
    sgd = w.grad + decay * (start - lr * 0.2 * ortho)  # the decay sees the weight after the Muon update
    expected = start - lr * 0.2 * ortho - lr * (sgd + beta * sgd)
    torch.testing.assert_close(w.detach(), expected, rtol=0, atol=1e-7)
    state = opt.state[w]
    assert set(state) == {"momentum_buffer", "momentum_buffer_SGD"}


def test_parameter_groups_are_ultralytics_ones_and_the_class_branches_learn_three_times_faster():
    model = build_model("yolo26n", 3)
    opt = build_optimizer(model, "musgd", 0.01, 0.937, 5e-4)
    groups = {(g["name"], g["lr_scale"]): g for g in opt.param_groups}
    assert set(groups) == {(n, s) for n in ("muon", "norm", "bias") for s in (1.0, 3.0)}
    names = {id(p): n for n, p in model.named_parameters()}
    for (name, scale), g in groups.items():
        for p in g["params"]:
            assert (".cls." in names[id(p)] or ".one2one_cls." in names[id(p)]) == (scale == 3.0), names[id(p)]
            assert (p.ndim in (2, 4)) == (name == "muon") == g["use_muon"]
        assert g["weight_decay"] == (5e-4 if name == "muon" else 0.0)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    schedule = Schedule(lr0=0.01, lrf=0.01, momentum=0.937, epochs=10, batches_per_epoch=10, warmup_batches=0)
    schedule.apply(opt, 0)
    assert groups["muon", 3.0]["lr"] == pytest.approx(3 * groups["muon", 1.0]["lr"]) == pytest.approx(0.03)
    # The other optimizers' groups are as they were: no scale, no Muon.
    assert all("lr_scale" not in g for g in build_optimizer(model, "sgd", 0.01, 0.937, 5e-4).param_groups)


def test_a_model_trains_with_it():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = build_optimizer(net, "musgd", 0.02, 0.9, 0.0)
    x = torch.randn(256, 8)
    y = x[:, :1] * 2 - x[:, 1:2]
    first = None
    for _ in range(100):
        loss = torch.nn.functional.mse_loss(net(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first
