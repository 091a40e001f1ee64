"""Validation: the metrics of a model on a dataset split, as ultralytics'
`model.val()` computes them, in one process or distributed. One function,
`validate`, measures for both users of it: the trainer's per-epoch row of
results.csv (the EMA weights) and `hpcyolo val` (`evaluate`: weights from a
file), so the two agree on the same weights and settings.

Ultralytics' validation protocol, followed here so that the numbers compare:
- rectangular batches: images sorted by aspect ratio (h/w), batched in that
  order, each batch letterboxed (centred, grey) to one shape, its sides
  ceil(imgsz * ratio / 32 + 0.5) * 32, the ratio (h, w) of the batch's
  flattest or tallest image; a square 160 px image at imgsz 160 sits on a
  192 x 192 canvas;
- images resized so their long side is imgsz (never padded up in scale);
- NMS with conf 0.001, IoU 0.7, one box per class above conf per anchor
  (multi-label), at most 300 per image;
- matched in the letterboxed input's pixels, as ultralytics 8.4 does: the
  labels resized and padded as the image was (each axis by its own resize,
  which rounds), the predictions as the model gave them, not clipped to the
  image (a box running into the padding overlaps its object less); matching
  and AP as `metrics.DetStats(method="ultralytics")`.

Distributed: every rank computes the same batch layout over the whole split
and validates every world_size-th batch; rank 0 gathers the per-batch states
and merges them in batch order, so any number of ranks reports the numbers
one process does.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..common.datayaml import check_labels
from ..common.errors import HpcyoloError
from ..common.polygon import xyxyxyxy2xywhr
from ..data import index as dataindex
from ..data.augment import PAD_VALUE, letterbox_to, rect_batches
from ..data.dataset import (
    ImageCache,
    cache_digest,
    check_files,
    decode_resized,
    OBB_POINTS,
    load_data_spec,
    obb_corners,
    open_cache,
    polygons_only,
    pose_keypoints,
    sift,
)
from ..data.masks import instance_masks, overlap_masks, resampled
from ..model.boxes import non_max_suppression, xywh2xyxy, xyxy2xywh
from ..model.detector import check_end2end, confident, detections
from ..model.rboxes import non_max_suppression_obb, xywhr2xyxyxyxy
from ..model.pose import keypoint_sigmas
from ..model.segment import predicted_masks
from ..model.weights import Weights, as_weights, build_from
from ..parallel.workers import loader_context
from ..parallel.dist import Dist, gather_objects
from .metrics import ConfusionMatrix, DetStats, OBBStats, SegStats, curves
from .pose_metrics import PoseStats

MASK_RATIO = 4  # ultralytics validates masks at the prototypes' resolution, a quarter of the input


def resized(shape: tuple[int, int], imgsz: int) -> tuple[tuple[int, int], float]:
    """((h, w), gain) of an image resized so its long side is imgsz, as ultralytics' loader (ceil)."""
    h0, w0 = shape
    r = imgsz / max(h0, w0)
    if r == 1:
        return (h0, w0), 1.0
    return (min(math.ceil(h0 * r), imgsz), min(math.ceil(w0 * r), imgsz)), r


class ValBatches(Dataset):
    """The rectangular batches of one split; item k is batch k, read from
    disk (a DataLoader with batch_size=None runs them in its workers)."""

    def __init__(self, files: list[Path], nc: int, imgsz: int, batch: int, rect: bool = True,
                 cache_dir: Path | None = None, checked=None, segments: bool = False, overlap_mask: bool = True,
                 obb: bool = False, kpt_shape: tuple[int, int] | None = None, sigmas: torch.Tensor | None = None):
        # `checked`: the check's results for `files` from the dataset's index (dataindex).
        items, self.problems, _ = sift(checked) if checked is not None else check_files(list(files), nc, kpt_shape)
        self.paths, self.shapes, self.labels = items.paths, items.shapes, items.labels
        # A segmentation's polygons, for its ground-truth masks, or oriented boxes' corners (see __getitem__).
        self.outlines = polygons_only(items, nc) if segments else obb_corners(items, nc) if obb else None
        # A keypoint dataset's keypoints (kpt_shape, the data YAML's), measured by OKS with `sigmas` (PoseStats).
        self.keypoints = pose_keypoints(items, self.problems, kpt_shape) if kpt_shape is not None else None
        self.kpt_shape, self.sigmas = kpt_shape, sigmas
        self.overlap_mask, self.obb = overlap_mask, obb
        # what validate() gathers
        self.stats = SegStats if segments else OBBStats if obb else PoseStats if kpt_shape is not None else DetStats
        self.nc = nc
        self.imgsz = imgsz
        self.batches = rect_batches(self.shapes, batch, imgsz) if len(items) else []
        if not rect:  # the same batches, each on an imgsz x imgsz canvas
            self.batches = [(indices, (imgsz, imgsz)) for indices, _ in self.batches]
        # The training's image cache (data.cache), for the split validated
        # every epoch: its images resized as below, decoded once per run.
        self.cache: ImageCache | None = None
        if cache_dir is not None and len(items):
            sizes = [resized(s, imgsz)[0] for s in self.shapes]
            self.cache, _, why_not = open_cache(cache_dir, cache_digest(items, imgsz), self.paths, sizes)
            if why_not:
                self.problems.append(why_not)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int):
        """(uint8 [B, 3, H, W], per image ((left, top) padding, labels [n, 5] normalised,
        (h, w) of the image on the canvas)). A segmentation's images have a
        fourth part, their ground-truth masks as ultralytics validates them:
        rasterised at a quarter of the canvas, from one overlap map (the
        labels then in its order, largest first) with overlap_mask, uint8
        [n, H/4, W/4]. Oriented boxes' images have theirs, xywhr [n, 5] in
        the canvas's pixels, as ultralytics' OBB validator prepares them: the
        minimum-area rectangle of the corners (resampled as loaded) moved as
        the image was. A keypoint dataset's images have theirs, float32 [n,
        K, 3] (x, y in the canvas's pixels, visibility), moved as the boxes."""
        indices, shape = self.batches[k]
        canvases, metas = [], []
        for i in indices:
            (h, w), _ = resized(self.shapes[i], self.imgsz)
            if self.cache is not None:
                img = self.cache.get(i) if self.cache.ok(i) else None
            else:
                img = decode_resized(self.paths[i], (h, w))
            if img is None:  # no longer decodes: a blank image, its labels still count as missed
                img = np.full((h, w, 3), PAD_VALUE, np.uint8)
            canvas, gain, offset = letterbox_to(img, shape)
            canvases.append(canvas)
            on_canvas = (img.shape[0] * gain, img.shape[1] * gain)  # ultralytics scales labels by the float gain
            if self.keypoints is not None:
                points = torch.from_numpy(np.array(self.keypoints[i], dtype=np.float32).reshape(-1, self.kpt_shape[0], 3))
                points[..., 0] = points[..., 0] * on_canvas[1] + offset[0]
                points[..., 1] = points[..., 1] * on_canvas[0] + offset[1]
                metas.append((offset, self.labels[i], on_canvas, points))
            elif self.outlines is None:
                metas.append((offset, self.labels[i], on_canvas))
            elif self.obb:
                metas.append((offset, self.labels[i], on_canvas, self._rboxes(i, offset, on_canvas)))
            else:
                metas.append((offset, *self._masks(i, offset, on_canvas, shape)))
        x = torch.from_numpy(np.ascontiguousarray(np.stack(canvases).transpose(0, 3, 1, 2)))
        return x, metas


    def _rboxes(self, i: int, offset: tuple[int, int], on_canvas: tuple[float, float]) -> torch.Tensor:
        """Image i's oriented boxes, xywhr [n, 5] in the canvas's pixels: see __getitem__."""
        scale = np.array([on_canvas[1], on_canvas[0]], np.float32)
        corners = [resampled(o, OBB_POINTS) * scale + offset for o in self.outlines[i]]
        return torch.from_numpy(xyxyxyxy2xywhr(np.stack(corners)).astype(np.float32) if corners else
                                np.zeros((0, 5), np.float32))

    def _masks(self, i: int, offset: tuple[int, int], on_canvas: tuple[float, float], canvas: tuple[int, int]):
        """(labels, on_canvas, masks) of image i: see __getitem__."""
        scale = np.array([on_canvas[1], on_canvas[0]], np.float32)
        outlines = [resampled(o) * scale + offset for o in self.outlines[i]]  # as ultralytics loads them
        labels = self.labels[i]
        if self.overlap_mask:
            overlap, order = overlap_masks(canvas, outlines, MASK_RATIO)
            masks = (overlap[None] == np.arange(1, len(order) + 1).reshape(-1, 1, 1)).astype(np.uint8)
            labels = np.asarray(labels)[order]
        else:
            masks = instance_masks(canvas, outlines, MASK_RATIO)
        return labels, on_canvas, torch.from_numpy(masks)


def batch_stats(model, x: torch.Tensor, metas, device: torch.device, conf: float, iou: float,
                end2end: bool = False, confusion: ConfusionMatrix | None = None, loss_fn=None):
    """(DetStats, predictions, loss items or None): one batch predicted and
    matched against its labels in canvas pixels (and counted in `confusion`,
    where given); with `loss_fn`, the loss of the model's raw maps on it too."""
    stats = DetStats(method="ultralytics")
    x = x.to(device).float() / 255
    if loss_fn is None:
        preds, items = detections(model, x, conf=conf, iou=iou, end2end=end2end, multi_label=True), None
    else:
        out = model(x)  # the maps the loss reads, decoded as predict decodes them
        items = loss_fn(out, loss_targets(metas, x.shape[2:]))[1]
        if end2end:
            preds = confident(model.decode_end2end(out[1]), conf)
        else:
            preds = non_max_suppression(model.decode(out[0] if model.end2end else out), conf_thres=conf,
                                        iou_thres=iou, multi_label=True)
    for det, meta in zip(preds, metas):
        det = det.float().cpu()
        lab, gt = canvas_labels(meta)
        stats.update(det, gt, lab[:, 0])
        if confusion is not None:
            confusion.update(det, gt, lab[:, 0])
    return stats, preds, items


def segment_batch_stats(model, x: torch.Tensor, metas, device: torch.device, conf: float, iou: float,
                        end2end: bool = False, confusion: ConfusionMatrix | None = None, loss_fn=None):
    """batch_stats of a segmenter: (SegStats, predictions (each image's
    [n, 6] and its masks [n, h/4, w/4]), loss items or None). Its masks as
    ultralytics' process_mask makes them
    (model/segment.py predicted_masks), matched by mask IoU against the
    ground truth's at a quarter of the canvas."""
    stats, drawn = SegStats(method="ultralytics"), []
    x = x.to(device).float() / 255
    if loss_fn is None:
        (raw, proto), items = model.predict(x, end2end=end2end), None
    else:
        out = model(x)  # YOLO26's: both heads', without the semantic map (eval), as ultralytics validates
        maps, coefficients, proto = (out[0] if model.end2end else out)[:3]
        items = loss_fn(out, (loss_targets(metas, x.shape[2:]), loss_masks(metas, loss_fn.overlap)))[1]
        if end2end:  # the one-to-one head's maps and coefficients
            one2one_maps, one2one_coefficients = out[1][:2]
            raw = model.decode_end2end(one2one_maps, extra=torch.cat([c.flatten(2) for c in one2one_coefficients], 2))
        else:
            raw = torch.cat([model.decode(maps), torch.cat([c.flatten(2) for c in coefficients], 2)], 1)
    if end2end:  # the one-to-one head's 300, no NMS (ultralytics' nms=False)
        preds = confident(raw, conf)
    else:
        preds = non_max_suppression(raw, conf_thres=conf, iou_thres=iou, multi_label=True, nc=model.nc)
    for det, prototypes, meta in zip(preds, proto, metas):
        det = det.float()
        masks = predicted_masks(prototypes, det[:, 6:], det[:, :4], tuple(x.shape[2:])).cpu()
        lab, gt = canvas_labels(meta)
        det = det[:, :6].cpu()
        stats.update(det, masks, gt, lab[:, 0], meta[3])
        if confusion is not None:
            confusion.update(det, gt, lab[:, 0])
        drawn.append((det, masks))
    return stats, drawn, items


def obb_batch_stats(model, x: torch.Tensor, metas, device: torch.device, conf: float, iou: float,
                    end2end: bool = False, confusion: ConfusionMatrix | None = None, loss_fn=None):
    """batch_stats of an oriented-box detector: (OBBStats, predictions (each
    image's [n, 7]: cx, cy, w, h, conf, cls, angle in canvas pixels), loss
    items or None), as ultralytics' OBB validator: rotated NMS by ProbIoU
    (multi-label), or the one-to-one head's picks; matched by ProbIoU."""
    stats = OBBStats(method="ultralytics")
    x = x.to(device).float() / 255
    if loss_fn is None:
        raw, items = model.predict(x, end2end=end2end), None
    else:
        out = model(x)
        items = loss_fn(out, obb_loss_targets(metas, x.shape[2:]))[1]
        raw = model.decode_end2end(*out[1]) if end2end else model.decode(*(out[0] if model.end2end else out))
    preds = confident(raw, conf) if end2end else \
        non_max_suppression_obb(raw, conf_thres=conf, iou_thres=iou, multi_label=True)
    for det, meta in zip(preds, metas):
        det = det.float().cpu()
        cls = torch.from_numpy(np.array(meta[1], dtype=np.float32).reshape(-1, 5)[:, 0])
        stats.update(det, meta[3], cls)
        if confusion is not None:
            confusion.update(det, meta[3], cls)
    return stats, preds, items


def pose_batch_stats(model, x: torch.Tensor, metas, device: torch.device, conf: float, iou: float,
                     end2end: bool = False, confusion: ConfusionMatrix | None = None, loss_fn=None, *,
                     sigmas: torch.Tensor):
    """batch_stats of a keypoint model: (PoseStats, predictions (each
    image's [n, 6 + K*D]: box, conf, class, then its keypoints x, y in
    canvas pixels (and visibility)), loss items or None), as ultralytics'
    pose validator: NMS (multi-label) carrying each box's keypoints, or the
    one-to-one head's picks (YOLO26, end2end); boxes matched by IoU, keypoints
    by OKS with `sigmas`."""
    stats = PoseStats(sigmas, method="ultralytics")
    x = x.to(device).float() / 255
    if loss_fn is None:
        raw, items = model.predict(x, end2end=end2end), None
    else:
        out = model(x)  # YOLO26's: both heads' (no sigma maps in eval mode), as ultralytics validates
        items = loss_fn(out, (loss_targets(metas, x.shape[2:]), pose_loss_keypoints(metas, x.shape[2:])))[1]
        if end2end:
            maps, keypoints = out[1][:2]
            raw = model.decode_end2end(maps, extra=model.decode_keypoints(keypoints))
        else:
            maps, keypoints = (out[0] if model.end2end else out)[:2]
            raw = torch.cat([model.decode(maps), model.decode_keypoints(keypoints)], 1)
    preds = confident(raw, conf) if end2end else \
        non_max_suppression(raw, conf_thres=conf, iou_thres=iou, multi_label=True, nc=model.nc)
    k, dims = model.kpt_shape
    for det, meta in zip(preds, metas):
        det = det.float().cpu()
        lab, gt = canvas_labels(meta)
        stats.update(det[:, :6], det[:, 6:].reshape(len(det), k, dims), gt, lab[:, 0], meta[3])
        if confusion is not None:
            confusion.update(det[:, :6], gt, lab[:, 0])
    return stats, preds, items


def pose_loss_keypoints(metas, canvas: tuple[int, int]) -> torch.Tensor:
    """A validation batch's keypoints as the loss takes a training batch's:
    [M, K, 3], x, y as fractions of the canvas, in loss_targets' order."""
    h, w = canvas
    scale = torch.tensor([w, h, 1.0])
    return torch.cat([meta[3] / scale for meta in metas]) if metas else torch.zeros((0, 1, 3))


def obb_loss_targets(metas, canvas: tuple[int, int]) -> torch.Tensor:
    """A validation batch's oriented boxes as the loss takes a training
    batch's: [M, 7] (image, class, cx, cy, w, h as fractions of the canvas, r)."""
    h, w = canvas
    rows = [torch.cat([torch.full((len(meta[3]), 1), float(k)),
                       torch.from_numpy(np.array(meta[1], dtype=np.float32).reshape(-1, 5)[:, :1]),
                       meta[3] / torch.tensor([w, h, w, h, 1.0])], 1) for k, meta in enumerate(metas)]
    return torch.cat(rows) if rows else torch.zeros((0, 7))


def loss_targets(metas, canvas: tuple[int, int]) -> torch.Tensor:
    """A validation batch's labels as the loss takes a training batch's:
    [M, 6] (image, class, cx, cy, w, h as fractions of the canvas)."""
    h, w = canvas
    rows = []
    for k, meta in enumerate(metas):
        lab, xyxy = canvas_labels(meta)
        xywh = xyxy2xywh(xyxy) / torch.tensor([w, h, w, h], dtype=torch.float32)
        rows.append(torch.cat([torch.full((len(lab), 1), float(k)), lab[:, :1], xywh], 1))
    return torch.cat(rows) if rows else torch.zeros((0, 6))


def loss_masks(metas, overlap: bool) -> torch.Tensor:
    """A validation batch's ground-truth masks as the loss takes them: one
    overlap map per image (its k-th object k + 1, as its labels' order), or
    every object's mask in the labels' order."""
    if not overlap:
        return torch.cat([meta[3] for meta in metas])
    maps = []
    for meta in metas:
        masks = meta[3].long()
        index = torch.arange(1, len(masks) + 1).view(-1, 1, 1)
        maps.append((masks * index).amax(0) if len(masks) else torch.zeros(masks.shape[1:], dtype=torch.long))
    return torch.stack(maps)


def canvas_labels(meta) -> tuple[torch.Tensor, torch.Tensor]:
    """An image's labels [n, 5] (normalised) and their boxes [n, 4] xyxy in
    its canvas's pixels: scaled to the image's size there, shifted by its
    padding, as ultralytics' LetterBox moves them."""
    (left, top), labels, (h, w) = meta[:3]
    lab = torch.from_numpy(np.array(labels, dtype=np.float32)).reshape(-1, 5)  # the index's rows are read-only
    return lab, xywh2xyxy(lab[:, 1:5]) * torch.tensor([w, h, w, h], dtype=torch.float32) + \
        torch.tensor([left, top, left, top], dtype=torch.float32)


def as_is(item):
    """The validation loader's batches as ValBatches made them: torch's
    default would turn each image's labels (read-only views of the dataset
    index's rows) into tensors, warning that they are not writable."""
    return item


INTERRUPTED = {"interrupted": True}  # what validate() returns on every rank when a rank was asked to stop


def share_batches(d: Dist, batches, per_batch, *, workers: int = 0, worker_init=None, interrupted=None,
                  extra=None):
    """A validation's distribution, for every task: each rank runs
    `per_batch(*batch)` on every world_size-th batch of `batches` (read by a
    loader of `workers` processes) and rank 0 gets every rank's results in
    batch order, whatever the ranks: (results, [each rank's `extra()`,
    called after its last batch]) on rank 0, None on the others, INTERRUPTED
    on every rank where `interrupted()`, asked before each batch, said so."""
    mine = range(d.rank, len(batches), d.world_size)
    processes = min(workers, len(mine))  # a rank with no batch has no workers
    loader = DataLoader(batches, batch_size=None, sampler=mine, num_workers=processes,
                        worker_init_fn=worker_init, collate_fn=as_is,
                        multiprocessing_context=loader_context(processes))
    results, stopped = [], False
    for k, batch in zip(mine, loader):
        if interrupted is not None and interrupted():
            stopped = True
            break
        results.append((k, per_batch(*batch)))
    gathered = gather_objects(d, (results, None if extra is None else extra(), stopped))
    if any(s for _, _, s in gathered):
        return INTERRUPTED
    if not d.is_main:
        return None
    ordered = sorted((entry for rank, _, _ in gathered for entry in rank), key=lambda e: e[0])
    return [result for _, result in ordered], [x for _, x, _ in gathered]


def mean_items(items: list, names: tuple[str, ...]) -> list[float]:
    """ultralytics' val/ losses: each batch's loss items, added in batch order, over the batches."""
    return (sum(items, torch.zeros(len(names))) / max(len(items), 1)).tolist()


@torch.no_grad()
def validate(d: Dist, model, batches: ValBatches, *, conf: float = 0.001, iou: float = 0.7, workers: int = 0,
             worker_init=None, on_batch=None, end2end: bool = False, plots: bool = False,
             interrupted=None, measure=batch_stats, loss_fn=None) -> dict | None:
    """The metrics of `model` on `batches` (rank 0; None elsewhere), as
    ultralytics' validator computes them: every rank predicts every
    world_size-th batch, rank 0 merges the states in batch order. The one
    validation of hpcyolo: the trainer's per-epoch row and `hpcyolo val`.
    `on_batch(images, metas, predictions)` sees each of this rank's batches.
    `end2end`: the one-to-one head's detections, without NMS (YOLO26).
    `plots`: also what the plots show, `confusion` (ConfusionMatrix.matrix
    over all ranks' images) and `curves` (metrics.curves).
    `interrupted()`, asked before each batch: True stops this rank's share
    there (a preemption signal), and every rank then returns INTERRUPTED.
    `measure`: a batch's (stats, predictions, loss items), batch_stats or a
    task's (segment_batch_stats: its summary adds the masks' figures).
    `loss_fn` (a loss for one rank: each batch's own items): the summary's
    `val_losses`, its items averaged over the batches, as ultralytics' val/
    columns."""
    model.eval()
    confusion = ConfusionMatrix(batches.nc) if plots else None

    def one(x, metas):
        stats, preds, items = measure(model, x, metas, d.device, conf, iou, end2end, confusion, loss_fn)
        if on_batch is not None:
            on_batch(x, metas, preds)
        return stats.state(), None if items is None else items.cpu()

    shared = share_batches(d, batches, one, workers=workers, worker_init=worker_init, interrupted=interrupted,
                           extra=None if confusion is None else lambda: confusion.matrix)
    if shared is None or shared is INTERRUPTED:
        return shared
    ordered, matrices = shared
    kind = batches.stats
    merged = kind.merge([state for state, _ in ordered])
    summary = kind.summary(merged, batches.nc, method="ultralytics")
    if loss_fn is not None:
        summary["val_losses"] = mean_items([items for _, items in ordered], loss_fn.names)
    if plots:
        summary["confusion"] = sum(matrices)
        summary["curves"] = curves(merged["boxes"] if kind in (SegStats, PoseStats) else merged, batches.nc)
        if kind is SegStats:
            summary["mask_curves"] = curves(merged["masks"], batches.nc)
        if kind is PoseStats:
            summary["pose_curves"] = curves(merged["keypoints"], batches.nc)
    return summary


@torch.no_grad()
def evaluate(d: Dist, weights: str | Weights, data: str, *, imgsz: int | None = None, batch: int = 16, split: str = "val",
             conf: float = 0.001, iou: float = 0.7, rect: bool = True, end2end: bool = False,
             warn=print, plots: Path | None = None, workers: int = 0, segments: bool = False,
             obb: bool = False, keypoints: bool = False) -> dict | None:
    """The metrics of `weights` on `split` of `data` (rank 0; None elsewhere):
    map50, map50_95, precision, recall, images, instances, and `classes`: one
    row per class (name, images, instances, precision, recall, map50, map50_95).
    `rect=False` letterboxes every image to imgsz x imgsz (slower: more padding).
    `plots`: a folder for ultralytics' validation plots (plots.write_val_plots,
    val_batchN_labels.jpg and val_batchN_pred.jpg). `workers`: loader
    processes, at most the CPUs this process may use. `segments`: a
    segmentation's weights and polygons; `masks` then holds the masks'
    figures, as the boxes' are. `obb`: an oriented-box detector's weights
    and corners, measured by ProbIoU. `keypoints`: a keypoint model's weights
    and the data's keypoints (its kpt_shape the weights'), matched by OKS;
    `pose` then holds the keypoints' figures."""
    if split not in ("train", "val"):
        raise HpcyoloError(f"--split must be train or val, not {split!r}")
    w = as_weights(weights)
    weights = w.path
    spec = load_data_spec(data)
    if spec.folders:
        raise HpcyoloError(f"{data}: a folder of class folders is a classification dataset; {weights} holds a "
                           f"{w.task} model, measured on a data YAML")
    if len(spec.names) != w.nc:
        raise HpcyoloError(f"{weights}: has {w.nc} classes, {data} names {len(spec.names)}")
    kpt_shape = sigmas = None
    if keypoints:
        if spec.kpt_shape != w.kpt_shape:
            raise HpcyoloError(f"{weights}: a keypoint model of kpt_shape {list(w.kpt_shape or ())}; {data} has "
                               f"{'no kpt_shape' if spec.kpt_shape is None else f'kpt_shape {list(spec.kpt_shape)}'}")
        kpt_shape, sigmas = spec.kpt_shape, keypoint_sigmas(spec.kpt_shape, spec.kpt_oks_sigmas)
    size = imgsz or w.imgsz or 640
    model = build_from(w).to(d.device)
    check_end2end(model, end2end, weights)
    files = getattr(spec, split)
    if not files:
        raise HpcyoloError(f"{data}: split {split!r} has no images")
    labels = check_labels(spec, (split,))
    sets = ValBatches(files, w.nc, size, batch, rect,
                      checked=indexed_split(d, files, w.nc, spec.root, split, data, kpt_shape),
                      segments=segments, obb=obb, kpt_shape=kpt_shape, sigmas=sigmas)
    if d.is_main:
        for problem in labels + sets.problems:
            warn(f"warning: {problem}")
    workers = min(workers, len(os.sched_getaffinity(0)))
    s = validate(d, model, sets, conf=conf, iou=iou, end2end=end2end, plots=plots is not None, workers=workers,
                 on_batch=None if plots is None or not d.is_main else batch_drawer(spec.names, plots, rotated=obb,
                                                                                   kpt_shape=kpt_shape),
                 measure=segment_batch_stats if segments else obb_batch_stats if obb else
                 functools.partial(pose_batch_stats, sigmas=sigmas) if keypoints else batch_stats)
    if s is None:
        return None
    if plots is not None:
        from ..report.plots import write_val_plots

        write_val_plots(s, spec.names, plots)
    out = {"weights": str(weights), "data": str(data), "split": split, "imgsz": size,
           **report(s, sets.labels, spec.names)}
    if segments:
        out["masks"] = report({k[:-5]: v for k, v in s.items() if k.endswith("_mask")}, sets.labels, spec.names)
    if keypoints:
        out["pose"] = report({k[:-5]: v for k, v in s.items() if k.endswith("_pose")}, sets.labels, spec.names)
    return out


def indexed_split(d: Dist, files, nc: int, root: Path, split: str, yaml: str | Path | None = None,
                  kpt_shape: tuple[int, int] | None = None):
    """The check results of a split's images through the dataset's index in
    the user's cache (dataindex.shared_file: one file per dataset and split,
    which training runs share): a second `hpcyolo val` of the same data, or
    one after a run trained on it, reads one file and checks only the images
    that changed, as ultralytics reads its labels.cache. None (check every
    image) where the cache cannot be read or written."""
    file = dataindex.shared_file(root, split, yaml)
    if file is None:
        return None
    try:
        results, index, _, _ = dataindex.refresh(files, nc, root, file, kpt_shape=kpt_shape)
    except OSError:
        return None
    if index is not None and d.is_main:  # the other ranks of a distributed val check alike but leave it to rank 0
        try:
            dataindex.write(file, index)
        except OSError:
            pass  # a cache: the next val checks again
    return results


def report(s: dict, labels: list, names: list[str]) -> dict:
    """A validation's summary (validate) as `table` shows it: images,
    instances, precision, recall, map50, map50_95, and `classes`, one row per
    class (name, images holding it, instances, P, R, mAP50, mAP50-95)."""
    images = np.zeros(len(names), dtype=int)  # images holding the class
    for lb in labels:
        images[np.unique(np.asarray(lb).reshape(-1, 5)[:, 0].astype(int))] += 1
    classes = [{"class": name, "images": int(images[c]), "instances": s["per_class_instances"][c],
                "precision": s["per_class_precision"][c], "recall": s["per_class_recall"][c],
                "map50": s["per_class_ap50"][c], "map50_95": s["per_class_ap50_95"][c]}
               for c, name in enumerate(names)]
    return {"images": len(labels), "instances": int(sum(s["per_class_instances"])), "precision": s["precision"],
            "recall": s["recall"], "map50": s["map50"], "map50_95": s["map50_95"], "classes": classes}


def batch_drawer(names: list[str], folder: Path, batches: int = 3, run=None, rotated: bool = False,
                 kpt_shape: tuple[int, int] | None = None):
    """validate's on_batch that draws this rank's first `batches` batches as
    ultralytics' val_batchN_labels.jpg and val_batchN_pred.jpg (predictions
    above 0.25 confidence) in `folder`; `run(fn, *args)` draws (the trainer
    hands its plot thread's submit; default: at once). `rotated`: oriented
    boxes (obb_batch_stats' batches), drawn by their corners. `kpt_shape`: a
    keypoint model's (pose_batch_stats' batches), each box with its keypoints."""
    from ..report.plots import batch_grid

    drawn = 0
    run = run or (lambda fn, *args: fn(*args))

    def draw(imgs, metas, preds) -> None:
        nonlocal drawn
        if drawn >= batches:
            return
        labels = []
        for meta in metas:
            lab, xyxy = canvas_labels(meta)
            if rotated:
                labels.append((corners_of(meta[3]), lab[:, 0].numpy().astype(int), None))
                continue
            if kpt_shape is not None:
                labels.append((xyxy.numpy(), lab[:, 0].numpy().astype(int), None, None, meta[3].numpy()))
                continue
            masks = meta[3].numpy() if len(meta) > 3 else None  # a segmentation's
            labels.append((xyxy.numpy(), lab[:, 0].numpy().astype(int), None, masks))
        kept = [(corners_of(torch.from_numpy(det[:, [0, 1, 2, 3, 6]])) if rotated else det[:, :4],
                 det[:, 5].astype(int), det[:, 4], masks,
                 None if kpt_shape is None else det[:, 6:].reshape(len(det), *kpt_shape))
                for det, masks in map(drawn_prediction, preds)]
        x = imgs.numpy().copy()  # the loader's batch: drawn maybe later
        run(batch_grid, x, labels, names, Path(folder) / f"val_batch{drawn}_labels.jpg")
        run(batch_grid, x, kept, names, Path(folder) / f"val_batch{drawn}_pred.jpg")
        drawn += 1

    return draw


def corners_of(rboxes: torch.Tensor) -> np.ndarray:
    """xywhr [n, 5] -> their corners [n, 4, 2], numpy, as the plots draw them."""
    return xywhr2xyxyxyxy(rboxes.float().reshape(-1, 5)).numpy()


def drawn_prediction(pred, conf: float = 0.25) -> tuple[np.ndarray, np.ndarray | None]:
    """What the validation images show of one image's predictions, [n, 6]
    or a segmenter's ([n, 6], masks [n, h, w]): those above `conf`, as numpy
    (ultralytics draws those above 0.25), with their masks or None."""
    det, masks = pred if isinstance(pred, tuple) else (pred, None)
    sure = det[:, 4] > conf
    return det[sure].float().cpu().numpy(), None if masks is None else masks[sure].cpu().numpy()


def table(result: dict) -> str:
    """The human-readable report: one row for all classes, then one per class."""
    head = f"{'class':>16} {'images':>7} {'instances':>9} {'P':>7} {'R':>7} {'mAP50':>7} {'mAP50-95':>8}"
    rows = [head, f"{'all':>16} {result['images']:>7} {result['instances']:>9} {result['precision']:>7.3f} "
                  f"{result['recall']:>7.3f} {result['map50']:>7.3f} {result['map50_95']:>8.3f}"]
    for c in result["classes"]:
        if c["instances"] == 0:
            rows.append(f"{c['class']:>16} {c['images']:>7} {0:>9} {'-':>7} {'-':>7} {'-':>7} {'-':>8}")
            continue
        rows.append(f"{c['class']:>16} {c['images']:>7} {c['instances']:>9} {c['precision']:>7.3f} "
                    f"{c['recall']:>7.3f} {c['map50']:>7.3f} {c['map50_95']:>8.3f}")
    return "\n".join(rows)
