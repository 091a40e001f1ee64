"""Detection's parts, handed to the run as one `Task` (see __init__.py)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np

from ...common import rundir
from ...data.dataset import AugmentHyp, YoloDataset
from ...eval.evaluate import ValBatches, batch_drawer, drawn_prediction, evaluate, report, table, validate
from ...eval.export import export_onnx
from ...eval.predict import predict
from ...model.detector import build_model
from ...optim.loss import DetectionLoss, EndToEndLoss
from ...report.plots import plot_labels, write_val_plots
from ..task import Task

CLASS_BIAS = "head.cls.0.2.bias"  # the last class conv's bias: one value per class


def augment_hyp(cfg) -> AugmentHyp:
    """The augmentation strengths of `cfg` (every AugmentHyp field is a setting of the same name)."""
    return AugmentHyp(**{f.name: getattr(cfg, f.name) for f in fields(AugmentHyp) if f.name != "close_mosaic"})


def train_set(cfg, files, nc: int, *, cache_dir: Path, hsv_on_device: bool, checked, names=None) -> YoloDataset:
    """The training images of `files` with their boxes, augmented as cfg says
    (mosaic, affine, flips, mixup, cutmix, copy-paste; HSV on the device
    where `hsv_on_device`), rectangular batches with cfg.rect."""
    return YoloDataset(files, cfg.imgsz, augment=cfg.augment, hyp=augment_hyp(cfg), seed=cfg.seed, cache=cfg.cache,
                       cache_dir=cache_dir, names_count=nc, rect_batch=cfg.batch if cfg.rect else 0,
                       hsv_on_device=hsv_on_device, checked=checked)


def val_batches(files, nc: int, imgsz: int, batch: int, *, cache_dir: Path | None, checked,
                names=None) -> ValBatches:
    """The validation images in rectangular batches of `batch`, letterboxed to `imgsz`."""
    return ValBatches(files, nc, imgsz, batch, cache_dir=cache_dir, checked=checked)


def saved_classes(state: dict) -> int | None:
    """The classes a model's state dict was trained on (None: no detection head in it)."""
    bias = state.get(CLASS_BIAS)
    return None if bias is None else int(bias.shape[0])


def loss(model, nc: int, world_size: int, cfg) -> DetectionLoss | EndToEndLoss:
    """The loss of `model`'s head with cfg's gains (both heads of an end2end
    one: their weights change over cfg.epochs), scaled for the world size
    (DetectionLoss). Every family's anchors are assigned as ultralytics 8.4
    assigns them: aligned by CIoU, gt sides under the middle stride (16 px)
    counted as 16 px when candidates are chosen (STAL)."""
    strides, gains = tuple(model.stride.tolist()), dict(box=cfg.box, cls=cfg.cls, dfl=cfg.dfl)
    if model.end2end:
        return EndToEndLoss(nc, cfg.epochs, strides=strides, world_size=world_size, **gains)
    return DetectionLoss(nc, reg_max=model.reg_max, strides=strides, world_size=world_size, min_side=strides[1],
                         assign_ciou=True, **gains)


def fitness(metrics: dict) -> float:
    return rundir.fitness(metrics["map50"], metrics["map50_95"])


BOX = ("precision", "recall", "map50", "map50_95")
BOX_COLUMNS = (rundir.PRECISION, rundir.RECALL, rundir.MAP50, rundir.MAP50_95)  # (B): the boxes'


def describe(m: dict) -> str:
    return f"P {m['precision']:.3f} R {m['recall']:.3f} mAP50 {m['map50']:.3f} mAP50-95 {m['map50_95']:.3f}"


def per_class(metrics: dict, labels: list, names: list[str]) -> str:
    """The per-class table a run ends with, as ultralytics prints it."""
    return table(report(metrics, labels, names))


def with_second_kind(suffix: str, letter: str, word: str, title: str):
    """(metrics, describe, per_class) of a task measured on its boxes and on a
    second kind of output (segment's masks, pose's keypoints): the second's
    figures are the boxes' keys + `suffix` ("_mask"), its results.csv columns
    the boxes' with (`letter`) for (B), its epoch line and per-class table
    after the boxes' (`word`: "mask", `title`: "masks")."""
    metrics = tuple(zip(BOX, BOX_COLUMNS)) + \
        tuple((key + suffix, column.replace("(B)", f"({letter})")) for key, column in zip(BOX, BOX_COLUMNS))

    def describe_both(m: dict) -> str:
        return f"box {describe(m)}; {word} " + describe({k: m[k + suffix] for k in BOX})

    def per_class_both(m: dict, labels: list, names: list[str]) -> str:
        second = {k[:-len(suffix)]: v for k, v in m.items() if k.endswith(suffix)}
        return "boxes\n" + table(report(m, labels, names)) + f"\n{title}\n" + table(report(second, labels, names))

    return metrics, describe_both, per_class_both


def draw_train_batch(imgs: np.ndarray, targets: np.ndarray, names: list[str], path: Path) -> None:
    """A training batch as the loader made it (uint8 [B, 3, H, W]; targets
    [M, 6]: index in batch, class, normalised cx, cy, w, h), with its boxes."""
    from ...report.plots import batch_grid

    h, w = imgs.shape[2:]
    drawn = []
    for k in range(len(imgs)):
        rows = targets[targets[:, 0] == k]
        cx, cy, bw, bh = rows[:, 2] * w, rows[:, 3] * h, rows[:, 4] * w, rows[:, 5] * h
        drawn.append((np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1), rows[:, 1].astype(int), None))
    batch_grid(imgs, drawn, names, path)


def draw_predictions(imgs, preds, names, run: Path, offset: int, limit: int) -> int:
    """val_pred_N.jpg: up to `limit` images of a validation batch with their
    detections above 0.25 (a segmenter's with their masks); returns how many were drawn."""
    from ...report.plots import draw_detections, save_image, with_masks

    count = min(limit, len(preds))
    for j in range(count):
        det, masks = drawn_prediction(preds[j])
        img = imgs[j].permute(1, 2, 0).numpy()
        if masks is not None:
            img = with_masks(img, masks, det[:, 5].astype(int))
        save_image(draw_detections(img, det[:, :4], det[:, 5].astype(int), det[:, 4], names),
                   run / f"val_pred_{offset + j}.jpg")
    return count


TASK = Task(
    name="detect",
    train_set=train_set, val_batches=val_batches,
    build_model=build_model, saved_classes=saved_classes,
    loss=loss,
    validate=validate,
    metrics=tuple(zip(BOX, BOX_COLUMNS)),
    fitness=fitness, describe=describe, per_class=per_class,
    draw_train_batch=draw_train_batch, draw_predictions=draw_predictions, val_plots=write_val_plots,
    batch_drawer=batch_drawer,
    evaluate=evaluate, predict=predict, export=export_onnx, draw_labels=plot_labels,
)
