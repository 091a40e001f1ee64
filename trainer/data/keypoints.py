"""Keypoint labels and flips, as ultralytics 8.4 reads and moves them
(data/utils.py verify_image_label, check_det_dataset; data/augment.py
RandomFlip, RandomPerspective.apply_keypoints, v8_transforms;
utils/instance.py Instances.clip):

- a pose label row is `cls cx cy w h` then K keypoints of D values (x, y in
  0..1 of the image and, for D 3, a visibility: 0 unlabelled, 1 occluded,
  2 visible); exactly 5 + K*D numbers, coordinates within 1% of [0, 1].
  For D 2 a keypoint with a (slightly) negative coordinate is unlabelled
  (visibility 0), the others labelled (1).
- a warp (the random affine or perspective of training) moves each keypoint
  by the matrix; one that lands outside the output image becomes unlabelled
  (visibility 0) and keeps its coordinates; clipping to an image (after a
  mosaic's crop) marks those outside unlabelled and clips their coordinates.
- a flip mirrors the keypoints' coordinates and reorders them by the data's
  `flip_idx` (a left eye becomes a right eye): ultralytics 8.4.190 reorders
  on the vertical flip as on the horizontal one. A data.yaml without
  flip_idx trains with neither flip (ultralytics turns fliplr and flipud
  off); one whose length is not K is an error.

Where ultralytics takes any number as a visibility and any list as a
flip_idx, hpcyolo refuses, in one line, a visibility outside {0, 1, 2} and a
flip_idx that is not a permutation of 0..K-1 (issue 50).
"""

from __future__ import annotations

import numpy as np

from ..common.datayaml import flip_idx_problem
from .labels import COORD_TOL, parse_label_row

VISIBILITY = (0.0, 1.0, 2.0)  # unlabelled, labelled but occluded, visible


def parse_pose_row(text: str, nc: int, kpt_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray] | str:
    """One row -> ((cls, cx, cy, w, h) as parse_label_row gives it,
    keypoints [K, 3]: x, y in 0..1 of the image and visibility), or the
    reason it is malformed."""
    k, dims = kpt_shape
    values = text.split()
    if len(values) != 5 + k * dims:
        return f"{len(values)} numbers (kpt_shape [{k}, {dims}]: 5 + {k * dims})"
    row = parse_label_row(" ".join(values[:5]), nc)
    if isinstance(row, str):
        return row
    try:
        points = np.array([float(v) for v in values[5:]], dtype=np.float32).reshape(k, dims)
    except ValueError:
        return "not all numbers"
    if not np.isfinite(points).all():
        return "not finite"
    if ((points[:, :2] < -COORD_TOL) | (points[:, :2] > 1 + COORD_TOL)).any():
        return "keypoint coordinates outside [0, 1]"
    if dims == 2:
        labelled = ~((points[:, 0] < 0) | (points[:, 1] < 0))
        return row, np.column_stack([points, labelled.astype(np.float32)])
    if not np.isin(points[:, 2], VISIBILITY).all():
        wrong = points[~np.isin(points[:, 2], VISIBILITY), 2][0]
        return f"keypoint visibility {wrong:g} is not 0, 1 or 2"
    return row, points


def check_flip_idx(flip_idx: list | None, k: int) -> str | None:
    """Why `flip_idx` (a data.yaml's) cannot reorder K keypoints, or None if
    it can (or is absent: then neither flip is used)."""
    return None if flip_idx is None else flip_idx_problem(flip_idx, k)


def flip_keypoints(keypoints: np.ndarray, size: float, flip_idx: list[int], axis: int) -> np.ndarray:
    """Keypoints [N, K, 3] (pixels) mirrored along `axis` (0: x, a
    horizontal flip of an image `size` wide; 1: y, a vertical flip of one
    `size` high) and reordered by flip_idx."""
    out = keypoints[:, flip_idx].copy()
    out[..., axis] = size - out[..., axis]
    return out


def warp_keypoints(keypoints: np.ndarray, m: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Keypoints [N, K, 3] (pixels) moved by the 3x3 matrix `m` (divided by
    the third coordinate: a perspective's too) into an image of `size`
    (w, h); those that land outside it unlabelled (visibility 0)."""
    n, k = keypoints.shape[:2]
    if n == 0:
        return keypoints
    xy = np.concatenate([keypoints[..., :2].reshape(-1, 2), np.ones((n * k, 1), keypoints.dtype)], 1) @ m.T
    xy = xy[:, :2] / xy[:, 2:3]
    outside = (xy[:, 0] < 0) | (xy[:, 1] < 0) | (xy[:, 0] > size[0]) | (xy[:, 1] > size[1])
    visibility = np.where(outside, 0, keypoints[..., 2].reshape(-1))
    return np.column_stack([xy, visibility]).reshape(n, k, 3).astype(keypoints.dtype)


def clip_keypoints(keypoints: np.ndarray, w: float, h: float) -> np.ndarray:
    """Keypoints [N, K, 3] (pixels) clipped to a w x h image; those outside it unlabelled."""
    out = keypoints.copy()
    outside = (out[..., 0] < 0) | (out[..., 0] > w) | (out[..., 1] < 0) | (out[..., 1] > h)
    out[..., 2][outside] = 0
    out[..., 0], out[..., 1] = out[..., 0].clip(0, w), out[..., 1].clip(0, h)
    return out
