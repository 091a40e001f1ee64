"""Oriented boxes' parts, handed to the run as one `Task` (see __init__.py).
What detection does the same way (its fitness, epoch line, per-class table,
plots of the last validation) is detection's own function."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from ...data.dataset import YoloDataset
from ...eval.evaluate import ValBatches, batch_drawer, corners_of, evaluate, obb_batch_stats, validate
from ...eval.export import export_onnx
from ...eval.predict import predict
from ...model.obb import build_model
from ...optim.obb_loss import EndToEndOBBLoss, OBBLoss
from ..detect import task as detect
from ..task import Task


def train_set(cfg, files, nc: int, *, cache_dir: Path, hsv_on_device: bool, checked, names=None) -> YoloDataset:
    """The training images with their oriented boxes' corners, augmented as
    detection's (every augmentation moves the corners with the boxes)."""
    return YoloDataset(files, cfg.imgsz, augment=cfg.augment, hyp=detect.augment_hyp(cfg), seed=cfg.seed,
                       cache=cfg.cache, cache_dir=cache_dir, names_count=nc, rect_batch=cfg.batch if cfg.rect else 0,
                       hsv_on_device=hsv_on_device, checked=checked, obb=True)


def val_batches(files, nc: int, imgsz: int, batch: int, *, cache_dir: Path | None, checked,
                names=None) -> ValBatches:
    return ValBatches(files, nc, imgsz, batch, cache_dir=cache_dir, checked=checked, obb=True)


def loss(model, nc: int, world_size: int, cfg) -> OBBLoss | EndToEndOBBLoss:
    """ultralytics 8.4's oriented-box loss of `model` with cfg's gains (its
    angle gain 1.0, ultralytics' default `angle`), scaled for the world
    size: v8OBBLoss for YOLOv8 and YOLO11; for YOLO26 (end2end), E2ELoss of
    it over both heads (their weights change over cfg.epochs)."""
    strides, gains = tuple(model.stride.tolist()), dict(box=cfg.box, cls=cfg.cls, dfl=cfg.dfl)
    if model.end2end:
        return EndToEndOBBLoss(nc, cfg.epochs, strides=strides, world_size=world_size, **gains)
    return OBBLoss(nc, reg_max=model.reg_max, strides=strides, world_size=world_size, min_side=strides[1],
                   assign_ciou=True, **gains)


def obb_validate(*args, **kwargs) -> dict | None:
    return validate(*args, measure=obb_batch_stats, **kwargs)


def draw_train_batch(imgs, targets, names: list[str], path: Path) -> None:
    """A training batch as loaded (ultralytics' train_batchN.jpg), each
    oriented box drawn by its corners (targets [M, 7]: index in batch,
    class, cx, cy, w, h as fractions of the image, r)."""
    from ...report.plots import batch_grid

    h, w = imgs.shape[2:]
    drawn = []
    for k in range(len(imgs)):
        rows = torch.as_tensor(targets[targets[:, 0] == k])
        pixels = rows[:, 2:7] * torch.tensor([w, h, w, h, 1.0])
        drawn.append((corners_of(pixels), rows[:, 1].numpy().astype(int), None))
    batch_grid(imgs, drawn, names, path)


def draw_predictions(imgs, preds, names, run: Path, offset: int, limit: int) -> int:
    """val_pred_N.jpg: up to `limit` images of a validation batch with their
    oriented boxes above 0.25 confidence; returns how many were drawn."""
    from ...report.plots import draw_detections, save_image

    count = min(limit, len(preds))
    for j in range(count):
        det = preds[j][preds[j][:, 4] > 0.25].float().cpu()
        img = np.ascontiguousarray(imgs[j].permute(1, 2, 0).numpy())
        save_image(draw_detections(img, corners_of(det[:, [0, 1, 2, 3, 6]]), det[:, 5].numpy().astype(int),
                                   det[:, 4].numpy(), names), run / f"val_pred_{offset + j}.jpg")
    return count


def obb_evaluate(*args, **kwargs) -> dict | None:
    return evaluate(*args, obb=True, **kwargs)


TASK = Task(
    name="obb",
    train_set=train_set, val_batches=val_batches,
    build_model=build_model, saved_classes=detect.saved_classes,
    loss=loss,
    validate=obb_validate,
    metrics=detect.TASK.metrics,  # ultralytics' OBB columns are detection's (B) ones
    fitness=detect.fitness, describe=detect.describe, per_class=detect.per_class,
    draw_train_batch=draw_train_batch, draw_predictions=draw_predictions, val_plots=detect.write_val_plots,
    batch_drawer=functools.partial(batch_drawer, rotated=True),
    evaluate=obb_evaluate, predict=predict, export=export_onnx,
    draw_labels=detect.plot_labels,
)
