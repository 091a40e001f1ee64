"""Instance masks from polygon labels, as ultralytics rasterises them for
its segmentation loss (ultralytics.data.utils polygon2mask,
polygons2masks, polygons2masks_overlap):

- a polygon (pixel coordinates of the image it belongs to, truncated to
  integers) is filled at the image's full size, then the mask is resized to
  1 / `ratio` of it (ultralytics' mask_ratio, 4 by default) with bilinear
  interpolation and rounded to 0 or 1 by the uint8 cast;
- overlapping (overlap_mask, ultralytics' default): one map per image, the
  instances sorted by their mask's area, largest first, the k-th drawn as
  k + 1 over the ones before it (a running maximum), so that a small object
  on a large one keeps its pixels; the order is returned, for the labels to
  follow it;
- otherwise one 0/1 mask per instance, in the labels' order.

The semantic map YOLO26's loss also reads is each pixel's instance class
(`semantic`)."""

from __future__ import annotations

import cv2
import numpy as np


def polygon_mask(hw: tuple[int, int], polygon: np.ndarray, ratio: int = 1) -> np.ndarray:
    """One polygon ([k, 2] x, y pixels of an image of size `hw`) filled, as
    uint8 0/1 of shape (h // ratio, w // ratio)."""
    h, w = hw
    full = np.zeros((h, w), np.uint8)
    cv2.fillPoly(full, [np.asarray(polygon, dtype=np.float64).astype(np.int32).reshape(-1, 2)], color=1)
    return cv2.resize(full, (w // ratio, h // ratio))


def instance_masks(hw: tuple[int, int], polygons: list[np.ndarray], ratio: int = 1) -> np.ndarray:
    """[N, h // ratio, w // ratio] uint8: one mask per polygon, in order."""
    h, w = hw
    if not polygons:
        return np.zeros((0, h // ratio, w // ratio), np.uint8)
    return np.stack([polygon_mask(hw, p, ratio) for p in polygons])


def overlap_masks(hw: tuple[int, int], polygons: list[np.ndarray], ratio: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(one map (h // ratio, w // ratio) whose value k + 1 marks the k-th
    instance in `order`, 0 the background; `order`: the polygons' indices
    by mask area, largest first). uint8 up to 255 instances, else int32."""
    h, w = hw
    dtype = np.int32 if len(polygons) > 255 else np.uint8
    out = np.zeros((h // ratio, w // ratio), dtype)
    if not polygons:
        return out, np.zeros(0, np.int64)
    masks = instance_masks(hw, polygons, ratio).astype(dtype)
    # Areas as unsigned, negated as ultralytics does: largest first, and an instance whose mask
    # vanished (area 0, whose negation stays 0) before all of them: the same order as its.
    order = np.argsort(-masks.sum(axis=(1, 2), dtype=np.uint64))
    for k, i in enumerate(order):
        np.maximum(out, masks[i] * dtype(k + 1), out=out)
    return out, order


def semantic(overlap: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Each pixel's class from an overlap map and its instances' classes (in
    the map's order); pixels of no instance are left to the loss to ignore
    (it reads `overlap != 0`)."""
    if not len(classes):
        return np.zeros(overlap.shape, np.float32)
    return np.asarray(classes, np.float32)[overlap.astype(np.int64) - 1]


RESAMPLED = 1000  # points of a polygon as ultralytics loads it (YOLODataset: resample_segments)


def resampled(polygon: np.ndarray, n: int = RESAMPLED) -> np.ndarray:
    """A polygon [k, 2] as ultralytics resamples a segment on loading: closed,
    its vertices kept and n - k - 1 more points spread over its edges by
    index (each edge the same share, whatever its length); n points in all
    (a polygon of n points as it is; of more: k + 1). The outline is the same; its
    rasterised mask differs where the truncation to whole pixels does."""
    polygon = np.asarray(polygon, np.float32).reshape(-1, 2)
    if len(polygon) == n:
        return polygon
    n = max(n, len(polygon) + 1)
    closed = np.concatenate([polygon, polygon[:1]])
    at = np.arange(len(closed))
    x = np.linspace(0, len(closed) - 1, n - len(closed))
    x = np.insert(x, np.searchsorted(x, at), at)
    return np.stack([np.interp(x, at, closed[:, i]) for i in range(2)], axis=1).astype(np.float32)
