"""Keypoints' parts, handed to the run as one `Task` (see __init__.py).
What detection does the same way (its plots of the last validation, labels.jpg)
is detection's own function; what the data YAML's kpt_shape, flip_idx and
kpt_oks_sigmas decide, `for_data` binds into the parts."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ...common.datayaml import need_keypoints
from ...data.dataset import YoloDataset
from ...eval.evaluate import ValBatches, batch_drawer, evaluate, pose_batch_stats, validate
from ...eval.export import export_onnx
from ...eval.pose_metrics import PoseStats
from ...eval.predict import predict
from ...model.pose import KPT_SHAPE, build_model, keypoint_sigmas
from ...optim.pose_loss import EndToEndPoseLoss, PoseLoss
from ..detect import task as detect
from ..task import Task

# ultralytics' columns (B) and (P), epoch line and per-class table of the boxes, then of the keypoints
METRICS, describe, per_class = detect.with_second_kind("_pose", "P", "pose", "keypoints")


def train_set(cfg, files, nc: int, *, cache_dir: Path, hsv_on_device: bool, checked, names=None,
              kpt_shape: tuple[int, int] = KPT_SHAPE, flip_idx: tuple[int, ...] | None = None) -> YoloDataset:
    """The training images with their boxes and keypoints, augmented as
    detection's (every augmentation moves the keypoints with the boxes;
    flips reorder them by flip_idx, and without one neither flip is used)."""
    return YoloDataset(files, cfg.imgsz, augment=cfg.augment, hyp=detect.augment_hyp(cfg), seed=cfg.seed,
                       cache=cfg.cache, cache_dir=cache_dir, names_count=nc, rect_batch=cfg.batch if cfg.rect else 0,
                       hsv_on_device=hsv_on_device, checked=checked, kpt_shape=kpt_shape, flip_idx=flip_idx)


def val_batches(files, nc: int, imgsz: int, batch: int, *, cache_dir: Path | None, checked, names=None,
                kpt_shape: tuple[int, int] = KPT_SHAPE, sigmas: torch.Tensor | None = None) -> ValBatches:
    return ValBatches(files, nc, imgsz, batch, cache_dir=cache_dir, checked=checked, kpt_shape=kpt_shape,
                      sigmas=keypoint_sigmas(kpt_shape) if sigmas is None else sigmas)


def loss(model, nc: int, world_size: int, cfg, sigmas: tuple[float, ...] | None = None
         ) -> PoseLoss | EndToEndPoseLoss:
    """ultralytics 8.4's keypoint loss of `model` with cfg's gains (box, cls,
    dfl, pose, kobj; YOLO26's rle), the OKS sigmas the
    data YAML's kpt_oks_sigmas (else COCO's for [17, 3], else 1/K), scaled
    for the world size: v8PoseLoss for YOLOv8 and YOLO11; for YOLO26
    (end2end), E2ELoss of PoseLoss26 over both heads (their weights change
    over cfg.epochs), with the head's RealNVP flow for the RLE term."""
    strides = tuple(model.stride.tolist())
    gains = dict(box=cfg.box, cls=cfg.cls, dfl=cfg.dfl, pose=cfg.pose, kobj=cfg.kobj, rle=cfg.rle)
    if model.end2end:
        return EndToEndPoseLoss(nc, cfg.epochs, strides=strides, world_size=world_size, kpt_shape=model.kpt_shape,
                                sigmas=sigmas, flow=model.head.flow, **gains)
    return PoseLoss(nc, reg_max=model.reg_max, strides=strides, world_size=world_size, min_side=strides[1],
                    assign_ciou=True, kpt_shape=model.kpt_shape, sigmas=sigmas, **gains)


def pose_validate(d, model, batches: ValBatches, **kwargs) -> dict | None:
    return validate(d, model, batches, measure=functools.partial(pose_batch_stats, sigmas=batches.sigmas), **kwargs)


def draw_train_batch(imgs, targets, names: list[str], path: Path) -> None:
    """A training batch as loaded (ultralytics' train_batchN.jpg), with its
    boxes and their keypoints (targets: the loader's (rows [M, 6], keypoints
    [M, K, 3]), x, y as fractions of the image)."""
    from ...report.plots import batch_grid

    rows, keypoints = (np.asarray(t) for t in targets)
    h, w = imgs.shape[2:]
    drawn = []
    for k in range(len(imgs)):
        mine = rows[:, 0] == k
        r = rows[mine]
        cx, cy, bw, bh = r[:, 2] * w, r[:, 3] * h, r[:, 4] * w, r[:, 5] * h
        points = keypoints[mine] * np.array([w, h, 1.0], np.float32)
        drawn.append((np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1), r[:, 1].astype(int), None,
                      None, points))
    batch_grid(imgs, drawn, names, path)


def draw_predictions(imgs, preds, names, run: Path, offset: int, limit: int, *,
                     kpt_shape: tuple[int, int] = KPT_SHAPE) -> int:
    """val_pred_N.jpg: up to `limit` images of a validation batch with their
    detections above 0.25 and their keypoints; returns how many were drawn."""
    from ...report.plots import draw_detections, save_image, with_keypoints

    count = min(limit, len(preds))
    for j in range(count):
        det = preds[j][preds[j][:, 4] > 0.25].float().cpu().numpy()
        img = draw_detections(imgs[j].permute(1, 2, 0).numpy(), det[:, :4], det[:, 5].astype(int), det[:, 4], names)
        save_image(with_keypoints(img, det[:, 6:].reshape(len(det), *kpt_shape)), run / f"val_pred_{offset + j}.jpg")
    return count


def pose_evaluate(*args, **kwargs) -> dict | None:
    return evaluate(*args, keypoints=True, **kwargs)


def for_data(task: Task, spec) -> Task:
    """The task for a data YAML's keypoints: its kpt_shape (the model's
    keypoint rows, the label rows), flip_idx (the flips) and kpt_oks_sigmas
    (the loss and OKS); a data YAML without kpt_shape is one line."""
    if spec.folders:
        return task  # a folder of class folders: the run refuses it for every task but classify (check_task_layout)
    need_keypoints(spec)
    shape, sigmas = spec.kpt_shape, spec.kpt_oks_sigmas
    return replace(task, train_set=functools.partial(train_set, kpt_shape=shape, flip_idx=spec.flip_idx),
                   val_batches=functools.partial(val_batches, kpt_shape=shape,
                                                 sigmas=keypoint_sigmas(shape, sigmas)),
                   build_model=functools.partial(build_model, kpt_shape=shape),
                   loss=functools.partial(loss, sigmas=sigmas),
                   draw_predictions=functools.partial(draw_predictions, kpt_shape=shape),
                   batch_drawer=functools.partial(batch_drawer, kpt_shape=shape),
                   unresumable=functools.partial(other_kpt_shape, kpt_shape=shape))


def other_kpt_shape(state: dict, kpt_shape) -> str | None:
    """Why a keypoint run's checkpoint cannot go on with data of `kpt_shape` (another shape), or None."""
    held = state.get("kpt_shape")
    if held is not None and tuple(held) != tuple(kpt_shape):
        return f"holds a keypoint model for kpt_shape {list(held)}, but the data's kpt_shape is {list(kpt_shape)}"
    return None


TASK = Task(
    name="pose",
    train_set=train_set, val_batches=val_batches,
    build_model=build_model, saved_classes=detect.saved_classes,
    loss=loss,
    validate=pose_validate,
    metrics=METRICS,
    fitness=PoseStats.fitness, describe=describe, per_class=per_class,
    draw_train_batch=draw_train_batch, draw_predictions=draw_predictions, val_plots=detect.write_val_plots,
    batch_drawer=functools.partial(batch_drawer, kpt_shape=KPT_SHAPE),
    evaluate=pose_evaluate, predict=predict, export=export_onnx,
    draw_labels=detect.plot_labels, for_data=for_data,
)
