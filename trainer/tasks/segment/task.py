"""Segmentation's parts, handed to the run as one `Task` (see __init__.py).
What detection already does the same way (the per-image boxes of a
validation batch, its plots) is detection's own function."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...data.dataset import YoloDataset
from ...eval.evaluate import ValBatches, evaluate, segment_batch_stats, validate
from ...eval.metrics import SegStats
from ...eval.export import export_onnx
from ...eval.predict import predict
from ...model.segment import build_model
from ...optim.segment_loss import EndToEndSegmentationLoss, SegmentationLoss
from ..detect import task as detect
from ..task import Task

# ultralytics' columns (B) and (M), epoch line and per-class table of the boxes, then of the masks
METRICS, describe, per_class = detect.with_second_kind("_mask", "M", "mask", "masks")


def train_set(cfg, files, nc: int, *, cache_dir: Path, hsv_on_device: bool, checked, names=None) -> YoloDataset:
    """The training images with their polygons, augmented as detection's
    (every augmentation moves the outlines with the boxes), each item's
    masks rasterised as cfg.mask_ratio and cfg.overlap_mask say."""
    return YoloDataset(files, cfg.imgsz, augment=cfg.augment, hyp=detect.augment_hyp(cfg), seed=cfg.seed,
                       cache=cfg.cache, cache_dir=cache_dir, names_count=nc, rect_batch=cfg.batch if cfg.rect else 0,
                       hsv_on_device=hsv_on_device, checked=checked, segments=True, mask_ratio=cfg.mask_ratio,
                       overlap_mask=cfg.overlap_mask)


def val_batches(files, nc: int, imgsz: int, batch: int, *, cache_dir: Path | None, checked,
                names=None) -> ValBatches:
    return ValBatches(files, nc, imgsz, batch, cache_dir=cache_dir, checked=checked, segments=True)


def loss(model, nc: int, world_size: int, cfg) -> SegmentationLoss | EndToEndSegmentationLoss:
    """ultralytics 8.4's segmentation loss of `model` with cfg's gains and
    overlap_mask, scaled for the world size: v8SegmentationLoss (its
    assignment detection's) for YOLOv8 and YOLO11; for YOLO26 (end2end),
    E2ELoss of SegmentLoss26, both heads' (their weights change over
    cfg.epochs), the assignment mask-aware, the semantic map's term too."""
    strides, gains = tuple(model.stride.tolist()), dict(box=cfg.box, cls=cfg.cls, dfl=cfg.dfl)
    if model.end2end:
        return EndToEndSegmentationLoss(nc, cfg.epochs, strides=strides, world_size=world_size,
                                        overlap=cfg.overlap_mask, **gains)
    return SegmentationLoss(nc, reg_max=model.reg_max, strides=strides, world_size=world_size, min_side=strides[1],
                            assign_ciou=True, overlap=cfg.overlap_mask, **gains)


def seg_validate(*args, **kwargs) -> dict | None:
    return validate(*args, measure=segment_batch_stats, **kwargs)


def draw_train_batch(imgs, targets, names: list[str], path: Path) -> None:
    """A training batch as loaded (ultralytics' train_batchN.jpg), with its
    boxes and masks (targets: the loader's (rows, masks), in either layout)."""
    from ...report.plots import batch_grid

    rows, masks = targets
    h, w = imgs.shape[2:]
    # One map per image (overlap_mask) unless there is one mask per object; where the counts agree, a map
    # marks a second object with 2, and maps of one object each are those objects' masks.
    maps = masks.shape[0] != len(rows) or masks.max(initial=0) > 1
    drawn, first = [], 0
    for k in range(len(imgs)):
        mine = rows[rows[:, 0] == k]
        cx, cy, bw, bh = mine[:, 2] * w, mine[:, 3] * h, mine[:, 4] * w, mine[:, 5] * h
        if not len(mine):
            own = None
        elif maps:
            own = np.stack([masks[k] == j + 1 for j in range(len(mine))])
        else:
            own = masks[first:first + len(mine)]
        first += len(mine)
        drawn.append((np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1), mine[:, 1].astype(int), None,
                      own))
    batch_grid(imgs, drawn, names, path)


def seg_evaluate(*args, **kwargs) -> dict | None:
    return evaluate(*args, segments=True, **kwargs)


TASK = Task(
    name="segment",
    train_set=train_set, val_batches=val_batches,
    build_model=build_model, saved_classes=detect.saved_classes,
    loss=loss,
    validate=seg_validate,
    metrics=METRICS,
    fitness=SegStats.fitness, describe=describe, per_class=per_class,
    draw_train_batch=draw_train_batch, draw_predictions=detect.draw_predictions, val_plots=detect.write_val_plots,
    batch_drawer=detect.batch_drawer,
    evaluate=seg_evaluate, predict=predict, export=export_onnx,
    draw_labels=detect.plot_labels,
)
