"""What an epoch leaves for users: results.csv's row, the weights (last.pt,
best.pt, epochN.pt), the validation's drawings, the numbers TensorBoard and
the trackers show."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..common import rundir
from ..common.settings import TrainConfig
from . import checkpoint as ckpt
from .inputs import ignore_signals


def epoch_metrics(r, plots: bool = False, interrupted=None) -> dict:
    """The epoch's validation of the EMA model (the task's, as `hpcyolo val`
    measures); rank 0 also draws the first cfg.val_images images with their
    predictions, and with `plots` (every rank alike) its first batches as
    val_batchN_labels.jpg and val_batchN_pred.jpg, on its plot thread (the
    metrics then hold what the other plots show)."""
    cfg, task, names, drawings = r.cfg, r.task, r.data.names, r.side.drawings
    drawn = 0
    batch_plots = task.batch_drawer(names, r.folder, run=drawings.submit) if plots and drawings is not None else None

    def draw(imgs, metas, preds) -> None:
        nonlocal drawn
        if drawn < cfg.val_images:
            drawn += task.draw_predictions(imgs, preds, names, r.folder, drawn, cfg.val_images - drawn)
        if batch_plots is not None:
            batch_plots(imgs, metas, preds)

    # The validation's loss, as ultralytics' val/ columns: each batch's items alone (one rank's loss), averaged.
    loss_fn = task.loss(r.parts.ema.module, r.data.nc, 1, cfg)
    loss_fn.set_epoch(r.pos.epoch, r.pos.epochs)
    metrics = task.validate(r.d, r.parts.ema.module, r.data.val_batches, workers=cfg.workers,
                            on_batch=draw if r.d.is_main else None,
                            worker_init=functools.partial(ignore_signals, (cfg.signal, "TERM")), end2end=cfg.end2end,
                            plots=plots, interrupted=interrupted, loss_fn=loss_fn)
    return metrics or task.not_validated


def write_results(run: Path, epoch: int, loss: torch.Tensor, losses: tuple[str, ...], task, metrics: dict,
                  lrs: list[float], seconds: float, speed: tuple[float, float, float | None]) -> dict[str, str]:
    """The epoch's row of results.csv (rundir.results_columns; `losses`:
    the loss items' names, the task's metrics, the validation's loss items,
    each parameter group's learning rate); returns it, by column."""
    rate, wait, memory = speed
    columns = rundir.results_columns(losses, tuple(column for _, column in task.metrics), len(lrs))
    val_losses = metrics.get("val_losses") or [0.0] * len(losses)  # none: not validated, 0 as ultralytics writes
    values = (epoch + 1, f"{seconds:.1f}", *(f"{value:.5f}" for value in loss[:len(losses)]),
              *(f"{metrics[key]:.5f}" for key, _ in task.metrics), *(f"{value:.5f}" for value in val_losses),
              *(f"{lr:.6g}" for lr in lrs), f"{rate:.1f}", f"{wait:.3f}", "n/a" if memory is None else f"{memory:.3f}")
    row = dict(zip(columns, values, strict=True))
    rundir.write_result(run, tuple(row.values()), columns)
    return row


def numbers(row: dict[str, str]) -> dict[str, float]:
    """A results.csv row's numeric cells but the epoch, as floats."""
    out = {}
    for column, text in row.items():
        try:
            out[column] = float(text)
        except ValueError:
            pass  # n/a
    del out["epoch"]
    return out


def save_weights(path: Path, model, cfg: TrainConfig, names: list[str]) -> None:
    """Inference weights: the EMA model and what is needed to rebuild it."""
    saved = {"model": model.state_dict(), "scale": model.arch, "names": list(names), "imgsz": cfg.imgsz,
             "task": cfg.task}
    if getattr(model, "kpt_shape", None):  # a keypoint model's: how its head's keypoint rows split
        saved["kpt_shape"] = list(model.kpt_shape)
    ckpt.save(saved, path)
