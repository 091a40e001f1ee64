"""The classification loss, as ultralytics' v8ClassificationLoss: the cross
entropy of the logits against each image's class, the batch's mean; the
item it logs as train/loss and val/loss is that mean, detached.

Scaled for the world size as DetectionLoss is (optim/loss.py): over a global
batch split across N ranks the step equals one process's on the whole batch.
Each rank's loss is the sum of its images' terms over the global batch's
image count (one all-reduce of a detached count: the shares may differ, as
in an epoch's short last batch), times N because DDP averages the ranks'
gradients; its item alike, so that the ranks' items average to one
process's mean."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ClassificationLoss:
    """loss, items = ClassificationLoss()(logits [B, nc], targets [B, 2] (index in batch, class))."""

    names = ("loss",)  # ultralytics' train/loss, val/loss

    def __init__(self, world_size: int = 1):
        self.world_size = world_size

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        classes = targets[:, -1].to(logits.device, non_blocking=True).long()
        terms = F.cross_entropy(logits.float(), classes, reduction="sum")
        count = torch.tensor(float(len(classes)), device=logits.device)
        if self.world_size > 1:
            torch.distributed.all_reduce(count)
        loss = terms / count.clamp(min=1) * self.world_size
        return loss, loss.detach().reshape(1)

    def set_epoch(self, epoch: int, epochs: int | None = None) -> None:
        """Nothing here changes with the epoch."""

    def example_targets(self, imgsz: int, device: torch.device) -> torch.Tensor:
        """Targets of a throwaway batch of two images (run/step.py settle_buckets): class 0 each."""
        return torch.tensor([[0.0, 0.0], [1.0, 0.0]], device=device)
