"""Optimizer and learning-rate schedule.

The schedule is a pure function of the run's batch index (epoch x batches
per epoch + batch), so resuming needs only the place in the run (no
scheduler object to save). It is ultralytics 8.4's: the learning rate holds
through an epoch at lr0 x lf(epoch), linear or cosine from 1 towards lrf, and
a warm-up over the first warmup_epochs' batches (at most all but the last
epoch) brings it there from 0 (biases: from warmup_bias_lr), the momentum
from warmup_momentum, and the batches an optimizer step sums from 1 to
nbs / batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.optim import optimizer as optimizer_module


@dataclass(frozen=True, kw_only=True)
class Schedule:
    lr0: float
    lrf: float  # final LR = lr0 * lrf
    momentum: float
    epochs: int
    batches_per_epoch: int  # global batches
    warmup_batches: int
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    cosine: bool = False
    warmup_epochs: float | None = None  # where given, planned() derives warmup_batches anew from it
    nominal: float = 1.0  # nbs / batch: the batches an optimizer step sums after the warm-up (rounded)

    def planned(self, epochs: int) -> Schedule:
        """The schedule for another number of epochs (`time`'s plan): the
        decay stretched to them, the warm-up as warmup_batches_for says."""
        batches = self.warmup_batches if self.warmup_epochs is None else \
            warmup_batches_for(self.warmup_epochs, epochs, self.batches_per_epoch)
        return replace(self, epochs=epochs, warmup_batches=batches)

    def accumulate(self, batch: int) -> int:
        """Batches whose gradients one optimizer step sums, at the run's
        batch `batch` (ultralytics' rule): from 1 at the start of the
        warm-up towards nbs / batch size at its end, rounded; after it, the
        warm-up's last value (round(nbs / batch size) unless the warm-up is
        a few batches long, as in ultralytics); without one, round(nbs / batch size)."""
        last = min(batch, self.warmup_batches - 1)
        if last < 0:
            return max(1, round(self.nominal))
        return max(1, round((self.nominal - 1) / self.warmup_batches * last + 1))  # np.interp's arithmetic

    def factor(self, batch: int) -> float:
        """lr0's multiplier in the epoch of the run's batch `batch`
        (ultralytics' lf): linear or cosine from 1 in the first epoch towards lrf."""
        t = min(batch // max(1, self.batches_per_epoch) / max(1, self.epochs), 1.0)
        if self.cosine:
            return self.lrf + (1 - self.lrf) * 0.5 * (1 + math.cos(math.pi * t))
        return (1 - t) * (1 - self.lrf) + self.lrf

    def apply(self, optimizer: torch.optim.Optimizer, batch: int) -> None:
        """Set LR (and SGD momentum) of every group for an optimizer step at
        the run's batch `batch`. During warm-up biases start high and come
        down, the rest start at 0. A group's `lr_scale` multiplies its LR
        (MuSGD's class branches: 3)."""
        for group in optimizer.param_groups:
            lr = target = self.lr0 * self.factor(batch) * group.get("lr_scale", 1.0)
            if batch < self.warmup_batches:
                w = batch / self.warmup_batches
                start = self.warmup_bias_lr if group["name"] == "bias" else 0.0
                lr = start + (target - start) * w
                if "momentum" in group:
                    group["momentum"] = self.warmup_momentum + (self.momentum - self.warmup_momentum) * w
            elif "momentum" in group:
                group["momentum"] = self.momentum
            group["lr"] = lr


def warmup_batches_for(warmup_epochs: float, epochs: int, batches_per_epoch: int) -> int:
    """Batches of warm-up: warmup_epochs' worth, but (ultralytics 8.4) at
    most all but the last epoch."""
    return round(min(warmup_epochs, max(epochs - 1, 0)) * batches_per_epoch)


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float):
    """Three groups: weights with decay, norm weights and biases without.
    MuSGD (ultralytics' groups for it): the matrices and conv filters in a
    fourth, Muon's, with decay; and the class branches' parameters of every
    group in groups of their own at 3 x the learning rate."""
    muon = name == "musgd"
    groups = {"decay": [], "norm": [], "bias": [], "muon": []}
    boosted = {id(p) for n, p in model.named_parameters() if ".cls." in n or ".one2one_cls." in n} if muon else set()
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if muon and p.ndim in (2, 4):
                groups["muon"].append(p)
            elif pname == "bias":
                groups["bias"].append(p)
            elif isinstance(module, nn.modules.batchnorm._BatchNorm):
                groups["norm"].append(p)
            else:
                groups["decay"].append(p)
    decays = {"decay": weight_decay, "norm": 0.0, "bias": 0.0, "muon": weight_decay}
    order = ("muon", "norm", "bias", "decay") if muon else ("decay", "norm", "bias")
    param_groups = []
    for scale in (1.0, 3.0) if muon else (1.0,):
        for group in order:
            params = [p for p in groups[group] if (id(p) in boosted) == (scale != 1.0)]
            if params or not muon:
                extra = {"lr_scale": scale, "use_muon": group == "muon"} if muon else {}
                param_groups.append({"params": params, "weight_decay": decays[group], "name": group, **extra})
    if name == "sgd":
        return eager(torch.optim.SGD)(param_groups, lr=lr, momentum=momentum, nesterov=True)
    if name == "adamw":
        return eager(torch.optim.AdamW)(param_groups, lr=lr, betas=(momentum, 0.999))
    if muon:
        from .musgd import MuSGD

        return eager(MuSGD)(param_groups, lr=lr, momentum=momentum, nesterov=True)
    raise ValueError(f"unknown optimizer {name!r}")


# The code of torch's wrappers that import torch._dynamo at their first call (a second of a start's time,
# CPU-bound, on every rank): the one that keeps torch.compile from tracing a method (torch._disable_dynamo),
# and the one around the optimizers' step that sets the grad mode (and breaks torch.compile's graph there).
_NOT_TRACED = torch._disable_dynamo(lambda: None).__code__
_use_grad = getattr(optimizer_module, "_use_grad_for_differentiable", None)
_GRAD_MODE = _use_grad(lambda self: None).__code__ if _use_grad is not None else None


def not_traced_inner(fn):
    """The function that torch's torch._disable_dynamo wrapper `fn` wraps;
    None where `fn` is not such a wrapper."""
    inner = getattr(fn, "__wrapped__", None)
    return inner if inner is not None and getattr(fn, "__code__", None) is _NOT_TRACED else None


def eager(cls: type) -> type:
    """`cls`, an optimizer class, without torch's wrappers that import
    torch._dynamo (a second before the first step of every start): the
    methods torch wraps in torch._disable_dynamo (the constructor's
    add_param_group, zero_grad, state_dict, load_state_dict) as they are
    unwrapped, and a step that sets the grad mode as torch's wrapper does
    (to the optimizer's `differentiable`, back afterwards). What the
    wrappers add beyond that matters only under torch.compile, which the
    trainer never uses. The same class otherwise (its name, its steps, its
    state dict, isinstance); where torch's wrappers are other than these,
    left as they are."""
    plain, seen = {}, set()
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if name in seen:  # a subclass's own method, as it is
                continue
            seen.add(name)
            while getattr(value, "hooked", False):  # torch's profiler hook around a step, made again on the new class
                value = value.__wrapped__
            code, inner = getattr(value, "__code__", None), getattr(value, "__wrapped__", None)
            if inner is not None and code is _NOT_TRACED:
                plain[name] = inner
            elif inner is not None and code is _GRAD_MODE and _GRAD_MODE is not None:
                plain[name] = _grad_mode(inner)
    return type(cls.__name__, (cls,), {**plain, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                       "__doc__": cls.__doc__})


def _grad_mode(step):
    """`step` run as torch.optim's wrapper runs it: grad mode on where the
    optimizer is `differentiable`, else off; the caller's mode back after."""
    @functools.wraps(step)
    def wrapped(self, *args, **kwargs):
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, *args, **kwargs)
    return wrapped
