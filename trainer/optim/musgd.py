"""MuSGD, ultralytics' optimizer for YOLO26 (its `optimizer=MuSGD`),
written from its description, with its constants.

Groups marked `use_muon` (matrices and conv filters) get two updates a step:
a Muon one (Jordan et al., 2024: the Nesterov momentum of the gradient,
orthogonalised by five Newton-Schulz iterations, so that every direction of
the matrix moves about as far) at `muon` x the learning rate, and an SGD one
with its own momentum buffer and the weight decay at `sgd` x the learning
rate. Every other group gets SGD alone, exactly as torch.optim.SGD with
Nesterov momentum steps it.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The quintic's coefficients: they push every singular value of a matrix
# scaled to norm 1 towards 1 fast (to about 0.5 .. 1.5 in five steps).
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)


def orthogonalise(g: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """[k, rows, cols] -> about U V^T of each matrix's SVD, in bfloat16 as
    ultralytics computes it (the iteration needs no more precision)."""
    x = g.bfloat16()
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)  # every singular value <= 1
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT  # iterate on the smaller Gram matrix
    a, b, c = NEWTON_SCHULZ
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class MuSGD(torch.optim.Optimizer):
    """torch.optim.Optimizer; param groups take lr, momentum, weight_decay,
    nesterov and use_muon. `muon` and `sgd` weigh the two updates of a
    use_muon group (ultralytics' trainer: 0.2 and 1.0)."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, use_muon: bool = False, muon: float = 0.2, sgd: float = 1.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                                      use_muon=use_muon))
        self.muon, self.sgd = muon, sgd

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            lr = group["lr"]
            if group["use_muon"]:
                self._muon_step(params, lr * self.muon, group["momentum"], group["nesterov"])
                self._sgd_step(params, lr * self.sgd, group, "momentum_buffer_SGD")
            else:
                self._sgd_step(params, lr, group, "momentum_buffer")
        return loss

    def _muon_step(self, params: list[Tensor], lr: float, beta: float, nesterov: bool) -> None:
        """The orthogonalised momentum, matrices of one shape in one batch."""
        by_shape: dict[tuple, list[tuple[Tensor, Tensor]]] = {}
        for p in params:
            buf = self._buffer(p, "momentum_buffer")
            buf.mul_(beta).add_(p.grad, alpha=1 - beta)
            update = buf * beta + p.grad * (1 - beta) if nesterov else buf
            matrix = update.reshape(update.shape[0], -1)  # a conv's filters flattened: [out, in * k * k]
            by_shape.setdefault(tuple(matrix.shape), []).append((p, matrix))
        for pairs in by_shape.values():
            ortho = orthogonalise(torch.stack([m for _, m in pairs]))
            for (p, _), o in zip(pairs, ortho):
                # sqrt(rows / cols) of the parameter's last two dimensions, at
                # least 1 (ultralytics' rule: 1 for a square conv kernel)
                scale = max(1.0, p.shape[-2] / p.shape[-1]) ** 0.5
                p.add_(o.reshape(p.shape).to(p.dtype), alpha=-lr * scale)

    def _sgd_step(self, params: list[Tensor], lr: float, group: dict, buffer: str) -> None:
        """torch.optim.SGD's step (dampening 0), on `buffer` of each parameter's state."""
        momentum, decay = group["momentum"], group["weight_decay"]
        for p in params:
            grad = p.grad.add(p, alpha=decay) if decay else p.grad
            if momentum:
                buf = self._buffer(p, buffer)
                buf.mul_(momentum).add_(grad)
                grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
            p.add_(grad, alpha=-lr)

    def _buffer(self, p: Tensor, name: str) -> Tensor:
        state = self.state[p]
        if name not in state:
            state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state[name]
