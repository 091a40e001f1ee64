"""Classification's parts, handed to the run as one `Task` (see __init__.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...common import rundir
from ...common.errors import HpcyoloError
from ...data.classify import ClassifyBatches, ClassifyDataset, ClassifyHyp
from ...eval import classify
from ...eval.export import export_onnx
from ...model.classify import build_classifier
from ...optim.classify_loss import ClassificationLoss
from ..task import Task

CLASS_BIAS = "head.linear.bias"  # the linear layer's bias: one value per class


def hyp(cfg) -> ClassifyHyp:
    """The augmentation strengths of `cfg` (ClassifyHyp's fields are settings of the same names)."""
    return ClassifyHyp(scale=cfg.scale, fliplr=cfg.fliplr, flipud=cfg.flipud, hsv_h=cfg.hsv_h, hsv_s=cfg.hsv_s,
                       hsv_v=cfg.hsv_v, erasing=cfg.erasing, auto_augment=cfg.auto_augment)


def train_set(cfg, files, nc: int, *, cache_dir: Path, hsv_on_device: bool, checked, names=None) -> ClassifyDataset:
    """The training images, each with its folder's class, augmented as
    ultralytics' classify_augmentations where cfg.augment (else the
    validation transform). Colour jitter runs in the loader, never on the device."""
    if cfg.rect:
        raise HpcyoloError("rect (train.rect, --rect): rectangular batches are for detection; a classifier "
                           "trains on imgsz x imgsz crops")
    if cfg.classes is not None:
        raise HpcyoloError("classes (train.classes, --classes) keeps some classes' labels in detection; a "
                           "classifier trains on its dataset's class folders: remove the others' folders")
    return ClassifyDataset(files, names, cfg.imgsz, augment=cfg.augment, hyp=hyp(cfg), seed=cfg.seed,
                           checked=checked, cache=cfg.cache, cache_dir=cache_dir)


def val_batches(files, nc: int, imgsz: int, batch: int, *, cache_dir: Path | None, checked,
                names=None) -> ClassifyBatches:
    """The validation images in batches of `batch`, as ultralytics' classify_transforms make them."""
    return ClassifyBatches(files, names, imgsz, batch, checked=checked)


def build_model(arch: str, nc: int):
    return build_classifier(arch, nc)


def saved_classes(state: dict) -> int | None:
    """The classes a model's state dict was trained on (None: no classifier head in it)."""
    bias = state.get(CLASS_BIAS)
    return None if bias is None else int(bias.shape[0])


def loss(model, nc: int, world_size: int, cfg) -> ClassificationLoss:
    """ultralytics' v8ClassificationLoss, scaled for the world size."""
    return ClassificationLoss(world_size)


def evaluate(*args, **kwargs) -> dict | None:
    """`hpcyolo val`: top-1, top-5 and the loss ultralytics' validator logs as val/loss."""
    return classify.evaluate(*args, loss_fn=ClassificationLoss(), **kwargs)


def per_class(metrics: dict, labels: list, names: list[str]) -> str:
    """What ultralytics prints at a classifier's end: top-1 and top-5 over all classes."""
    return classify.table(metrics)


def _boxes(n: int, h: int, w: int) -> np.ndarray:
    """One box around each whole image: where a class name is drawn."""
    return np.tile(np.array([[0, 0, w - 1, h - 1]], np.float32), (n, 1))


def draw_train_batch(imgs: np.ndarray, targets: np.ndarray, names: list[str], path: Path) -> None:
    """A training batch as loaded (train_batchN.jpg), each image with its class."""
    from ...report.plots import batch_grid

    h, w = imgs.shape[2:]
    drawn = [(_boxes(1, h, w), targets[targets[:, 0] == k][:, 1].astype(int), None) for k in range(len(imgs))]
    batch_grid(imgs, drawn, names, path)


def draw_predictions(imgs, probs, names, run: Path, offset: int, limit: int) -> int:
    """val_pred_N.jpg: up to `limit` validation images, each with its most likely class."""
    from ...report.plots import draw_detections, save_image

    count = min(limit, len(probs))
    for j in range(count):
        conf, cls = probs[j].max(0)
        img = imgs[j].permute(1, 2, 0).numpy()
        save_image(draw_detections(img, _boxes(1, *img.shape[:2]), np.array([int(cls)]), np.array([float(conf)]),
                                   names), run / f"val_pred_{offset + j}.jpg")
    return count


def batch_drawer(names: list[str], folder: Path, batches: int = 3, run=None):
    """validate's on_batch drawing the first `batches` batches as
    val_batchN_labels.jpg (true classes) and val_batchN_pred.jpg (top-1 class)."""
    from ...report.plots import batch_grid

    drawn = 0
    run = run or (lambda fn, *args: fn(*args))

    def draw(imgs, classes, probs) -> None:
        nonlocal drawn
        if drawn >= batches:
            return
        x = imgs.numpy().copy()
        h, w = x.shape[2:]
        conf, top = probs.max(1)
        run(batch_grid, x, [(_boxes(1, h, w), np.array([int(c)]), None) for c in classes], names,
            Path(folder) / f"val_batch{drawn}_labels.jpg")
        run(batch_grid, x, [(_boxes(1, h, w), np.array([int(c)]), np.array([float(p)])) for c, p in zip(top, conf)],
            names, Path(folder) / f"val_batch{drawn}_pred.jpg")
        drawn += 1

    return draw


def val_plots(metrics: dict, names: list[str], folder: Path) -> list[Path]:
    """The last validation's confusion matrices, as ultralytics names them (no background row for a classifier)."""
    from ...report.plots import plot_confusion

    paths = [Path(folder) / "confusion_matrix.png", Path(folder) / "confusion_matrix_normalized.png"]
    for path, normalize in zip(paths, (False, True)):
        plot_confusion(metrics["confusion"], names, path, normalize, background=False)
    return paths


TASK = Task(
    name="classify",
    train_set=train_set, val_batches=val_batches,
    build_model=build_model, saved_classes=saved_classes,
    loss=loss,
    validate=classify.validate,
    metrics=(("top1", rundir.TOP1), ("top5", rundir.TOP5)),
    fitness=classify.fitness, describe=classify.describe, per_class=per_class,
    draw_train_batch=draw_train_batch, draw_predictions=draw_predictions, val_plots=val_plots,
    batch_drawer=batch_drawer,
    evaluate=evaluate, predict=classify.predict, export=export_onnx,
    folders=True, nms_free=False,
)
