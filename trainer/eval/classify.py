"""A classifier judged and handed out: its validation (top-1 and top-5
accuracy as ultralytics' ClassifyMetrics, the confusion matrix of top-1
predictions, the mean of the batches' losses as val/loss), `hpcyolo val`,
`hpcyolo predict` (the five most likely classes of each image) and the
ONNX export (softmax probabilities [B, nc], ultralytics' classify output).

Distributed as detection's validation (eval/evaluate.py): every rank takes
every world_size-th batch, rank 0 merges them in batch order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ..common import rundir
from ..common.errors import HpcyoloError
from ..common.fsutil import write_atomic
from ..data.classify import ClassifyBatches, val_transform
from ..data.dataset import load_data_spec
from ..model.detector import check_end2end
from ..model.weights import Weights, as_weights, build_from
from ..parallel.dist import Dist
from .evaluate import INTERRUPTED, indexed_split, mean_items, share_batches
from .predict import read_image

TOP = 5  # ultralytics' top-5 accuracy, and the classes predict reports


def accuracy(top: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
    """(top-1, top-5) accuracy of each image's classes by falling
    probability (`top` [N, k]) against its class (`targets` [N]), as
    ultralytics' ClassifyMetrics: where fewer than 5 classes exist, top-5 is
    over them all."""
    if not len(targets):
        return 0.0, 0.0
    correct = top[:, :TOP] == targets[:, None]
    return float(correct[:, 0].mean()), float(correct.max(1).mean())


def fitness(metrics: dict) -> float:
    """Ultralytics' fitness of a classifier: the mean of top-1 and top-5."""
    return rundir.classify_fitness(metrics["top1"], metrics["top5"])


@torch.no_grad()
def validate(d: Dist, model, batches: ClassifyBatches, *, workers: int = 0, worker_init=None, on_batch=None,
             plots: bool = False, interrupted=None, loss_fn=None, **_) -> dict | None:
    """{top1, top5, images, val_losses (with loss_fn), confusion (with plots)}
    of `model` on `batches` (rank 0; None elsewhere; INTERRUPTED on every rank
    where `interrupted()` said so before a batch). `on_batch(images, classes,
    probabilities)` sees each of this rank's batches."""
    model.eval()
    device = next(model.parameters()).device

    def one(x, classes):
        logits = model(x.to(device).float() / 255)
        probs = logits.float().softmax(1)
        top = probs.argsort(1, descending=True)[:, :TOP].cpu().numpy()
        items = None if loss_fn is None else loss_fn(logits, torch.stack([torch.zeros_like(classes), classes], 1))[1]
        if on_batch is not None:
            on_batch(x, classes, probs.cpu())
        return top, classes.numpy(), None if items is None else items.cpu()

    shared = share_batches(d, batches, one, workers=workers, worker_init=worker_init, interrupted=interrupted)
    if shared is None or shared is INTERRUPTED:
        return shared
    ordered = shared[0]
    top = np.concatenate([t for t, _, _ in ordered]) if ordered else np.zeros((0, TOP), np.int64)
    targets = np.concatenate([c for _, c, _ in ordered]) if ordered else np.zeros(0, np.int64)
    top1, top5 = accuracy(top, targets)
    summary = {"top1": top1, "top5": top5, "images": int(len(targets))}
    if loss_fn is not None:  # ultralytics' val/loss: the batches' mean losses, averaged
        summary["val_losses"] = mean_items([items for *_, items in ordered], loss_fn.names)
    if plots:  # rows predicted (top-1), columns true, as ultralytics' classify confusion matrix
        matrix = np.zeros((batches.nc, batches.nc), np.int64)
        if len(targets):
            np.add.at(matrix, (top[:, 0], targets), 1)
        summary["confusion"] = matrix
    return summary


def describe(m: dict) -> str:
    return f"top1 {m['top1']:.3f} top5 {m['top5']:.3f}"


def table(result: dict) -> str:
    """The figures as ultralytics prints a classifier's validation."""
    return f"{'classes':>22} {'top1_acc':>11} {'top5_acc':>11}\n{'all':>22} {result['top1']:>11.3f} " \
           f"{result['top5']:>11.3f}"


@torch.no_grad()
def evaluate(d: Dist, weights: str | Weights, data: str, *, imgsz: int | None = None, batch: int = 16,
             split: str = "val", warn=print, plots: Path | None = None, workers: int = 0, loss_fn=None,
             end2end: bool = False, **_) -> dict | None:
    """`hpcyolo val` of a classifier: {weights, data, split, imgsz, images,
    top1, top5} of `weights` on `split` of the class-folder dataset `data`
    (rank 0; None elsewhere), and with `loss_fn` (a loss for one rank) `loss`,
    its batches' losses averaged as ultralytics' val/loss. `plots`:
    confusion_matrix(_normalized).png there."""
    if split not in ("train", "val"):
        raise HpcyoloError(f"--split must be train or val, not {split!r}")
    w = as_weights(weights)
    spec = load_data_spec(data)
    if not spec.folders:
        raise HpcyoloError(f"{data}: a classifier is measured on a class-folder dataset (train/CLASS/*.jpg, "
                           "val/CLASS/*.jpg), not a data YAML")
    if len(spec.names) != w.nc:
        raise HpcyoloError(f"{w.path}: has {w.nc} classes, {data} has {len(spec.names)} class folders")
    size = imgsz or w.imgsz or 224
    model = build_from(w).to(d.device)
    check_end2end(model, end2end, w.path)
    files = getattr(spec, split)
    sets = ClassifyBatches(files, spec.names, size, batch,
                           checked=indexed_split(d, files, len(spec.names), spec.root, split, data))
    if d.is_main:
        for problem in sets.problems:
            warn(f"warning: {problem}")
    s = validate(d, model, sets, workers=min(workers, len(os.sched_getaffinity(0))), plots=plots is not None,
                 loss_fn=loss_fn)
    if s is None:
        return None
    if plots is not None:
        from ..report.plots import plot_confusion

        for normalize, name in ((False, "confusion_matrix.png"), (True, "confusion_matrix_normalized.png")):
            plot_confusion(s["confusion"], spec.names, Path(plots) / name, normalize, background=False)
    out = {"weights": str(w.path), "data": str(data), "split": split, "imgsz": size, "images": s["images"],
           "top1": s["top1"], "top5": s["top5"]}
    if loss_fn is not None:
        out["loss"] = s["val_losses"][0]
    return out


@torch.no_grad()
def predict(weights: str | Weights, inputs: list[str], out: str, *, imgsz: int | None = None, fmt: str = "txt",
            device: str = "cpu", warn=print, end2end: bool = False, **_) -> list[dict]:
    """Each image's five most likely classes with their probabilities
    (ultralytics' Results.probs.top5), written to OUT: txt, one file per image
    of `probability name` lines as ultralytics' save_txt; json, one
    predictions.json. Returns [{image, top5: [{class, name, confidence}]}]."""
    w = as_weights(weights)
    dev = torch.device(device)
    model = build_from(w).to(dev).eval()
    check_end2end(model, end2end, w.path)
    size = imgsz or w.imgsz or 224
    out_dir = Path(out)
    (out_dir / "labels" if fmt == "txt" else out_dir).mkdir(parents=True, exist_ok=True)
    results = []
    for path in map(Path, inputs):
        try:
            img = read_image(path)
        except ValueError as e:
            warn(f"warning: {path}: corrupt image skipped ({e})")
            continue
        x = torch.from_numpy(np.ascontiguousarray(val_transform(img, size).transpose(2, 0, 1)))[None]
        probs = model.predict(x.to(dev).float() / 255)[0].float().cpu()
        conf, cls = probs.sort(descending=True)
        top = [{"class": int(c), "name": w.names[int(c)], "confidence": round(float(p), 6)}
               for c, p in zip(cls[:TOP], conf[:TOP])]
        results.append({"image": str(path), "top5": top})
        if fmt == "txt":
            text = "".join(f"{t['confidence']:.2f} {t['name']}\n" for t in top)
            write_atomic(out_dir / "labels" / f"{path.stem}.txt", text.encode())
    if fmt == "json":
        write_atomic(out_dir / "predictions.json", json.dumps(results, indent=1).encode())
    return results
