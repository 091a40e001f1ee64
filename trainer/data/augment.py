"""Training augmentations for detection: mosaic, random affine, HSV, flip, and
the letterbox used for validation.

Images are HxWx3 uint8 RGB numpy arrays. Boxes travel with them as float32
[n, 5] arrays of (cls, x1, y1, x2, y2) in pixels of the current image, and,
where the labels are instance outlines and they are needed (a warp that
rotates, shears or tilts; copy_paste), the outlines beside them: a list of
(k, 2) float arrays of pixels, one per box; a warp then boxes each outline's
part inside the output, as ultralytics boxes its warped segments. Oriented
boxes travel as their four corners (`rotated`): where a step cuts one,
ultralytics' rule for OBB replaces it by the rectangle of its visible part
at its own angle (`rotated_clip`), where a segment's points are clamped.
Keypoints (a pose dataset's) travel as float32 [n, K, 3] (x, y in pixels,
visibility), one row per box: moved as ultralytics moves them (by the warp's
matrix, clipped to the mosaic canvas and the output, those outside
unlabelled: data/keypoints.py), kept with their boxes. Every
random choice comes from the `rng` (a numpy Generator) passed in: the dataset
makes one per (seed, epoch, index), so a resumed run sees the same pixels.
No function writes into its input image: the RAM cache hands out read-only
views of a shared mapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import cv2
import numpy as np

from ..common.polygon import clip_polygon, convex_hull
from ..common.registry import MAX_STRIDE
from .keypoints import clip_keypoints, warp_keypoints
from .masks import resampled

PAD_VALUE = 114  # grey fill for letterbox borders, mosaic gaps and affine borders

# A box that the augmentation shrank below this many pixels on a side, kept
# less than this share of its (scaled) area, or turned into a sliver thinner
# than 1:MAX_ASPECT, no longer shows its object well enough to train on.
MIN_SIDE_PX = 2.0
MIN_VISIBLE = 0.10
MAX_ASPECT = 20.0


@dataclass(frozen=True, kw_only=True)
class AugmentHyp:
    """Augmentation strengths (YOLO's usual defaults)."""

    mosaic: float = 1.0
    """Probability of a 4-image mosaic for a training sample."""
    degrees: float = 0.0
    """Rotation range, +/- degrees."""
    translate: float = 0.1
    """Translation range, +/- fraction of the image size."""
    scale: float = 0.5
    """Scale gain range: 1 +/- scale."""
    shear: float = 0.0
    """Shear range, +/- degrees."""
    perspective: float = 0.0
    """Perspective: the warp's bottom row gets +/- this (ultralytics' range 0-0.001)."""
    mixup: float = 0.0
    """Probability of blending a (mosaic) sample with a second one, labels of both kept."""
    cutmix: float = 0.0
    """Probability of pasting a rectangle of a second sample where no box of the first is."""
    hsv_h: float = 0.015
    """Hue gain range (fraction)."""
    hsv_s: float = 0.7
    """Saturation gain range (fraction)."""
    hsv_v: float = 0.4
    """Value gain range (fraction)."""
    flipud: float = 0.0
    """Probability of a vertical flip."""
    fliplr: float = 0.5
    """Probability of a horizontal flip."""
    bgr: float = 0.0
    """Probability of swapping the colour channels (RGB -> BGR)."""
    copy_paste: float = 0.0
    """Share of the candidate instances pasted where they overlap no box much (needs instance outlines)."""
    copy_paste_mode: str = "flip"
    """Where pasted instances come from: flip, the sample mirrored left-right; mixup, a second sample."""
    close_mosaic: int = 10
    """Last epochs trained without mosaic; the trainer sets `dataset.mosaic = False` for them."""

    def __post_init__(self) -> None:
        for name in ("mosaic", "flipud", "fliplr", "bgr", "mixup", "cutmix", "copy_paste"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"AugmentHyp.{name}: a probability must be in [0, 1], got {getattr(self, name)}")
        if self.copy_paste_mode not in ("flip", "mixup"):
            raise ValueError(f"AugmentHyp.copy_paste_mode: flip or mixup, got {self.copy_paste_mode!r}")
        for f in fields(self):
            if f.name != "copy_paste_mode" and getattr(self, f.name) < 0:
                raise ValueError(f"AugmentHyp.{f.name}: must not be negative, got {getattr(self, f.name)}")
        if self.scale >= 1.0:
            raise ValueError(f"AugmentHyp.scale: must be below 1 (the gain is 1 +/- scale), got {self.scale}")


# -- geometry helpers -------------------------------------------------------

def resized_shape(shape: tuple[int, int], imgsz: int) -> tuple[int, int]:
    """(h, w) after resizing so that the long side is `imgsz`, aspect kept."""
    h, w = shape
    r = imgsz / max(h, w)
    return max(1, round(h * r)), max(1, round(w * r))


def resized_shapes(shapes: list[tuple[int, int]], imgsz: int) -> list[tuple[int, int]]:
    """resized_shape of each of `shapes`, at once: the same float64 operations
    and the same rounding (half to even), without a Python call per image."""
    if not len(shapes):
        return []
    hw = np.asarray(shapes, np.float64).reshape(-1, 2)
    out = np.maximum(1, np.round(hw * (imgsz / hw.max(axis=1))[:, None])).astype(np.int64)
    return list(map(tuple, out.tolist()))


def letterbox_pad(shape: tuple[int, int], size: int) -> tuple[int, int]:
    """(left, top) offset that centres an image of `shape` on a size x size canvas."""
    h, w = shape
    return (size - w) // 2, (size - h) // 2


def letterbox(img: np.ndarray, size: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Pad an image whose long side is at most `size` to size x size, centred."""
    h, w = img.shape[:2]
    left, top = letterbox_pad((h, w), size)
    canvas = np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    canvas[top:top + h, left:left + w] = img
    return canvas, (left, top)


def rect_batches(shapes: list[tuple[int, int]], batch: int, imgsz: int, stride: int = MAX_STRIDE,
                 pad: float = 0.5) -> list[tuple[list[int], tuple[int, int]]]:
    """Ultralytics' rectangular batches (`set_rectangle`): [(image indices, (H, W))]
    for images of `shapes` (h, w), sorted by aspect ratio h/w, `batch` at a
    time; each batch's canvas fits its flattest or tallest image at imgsz:
    ceil(ratio * imgsz / stride + pad) * stride."""
    ratios = np.array([h / w for h, w in shapes], dtype=np.float64)
    order = ratios.argsort(kind="stable")
    out = []
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        lo, hi = ratios[idx].min(), ratios[idx].max()
        shape = [hi, 1.0] if hi < 1 else [1.0, 1 / lo] if lo > 1 else [1.0, 1.0]
        h, w = (np.ceil(np.array(shape) * imgsz / stride + pad).astype(int) * stride).tolist()
        out.append(([int(i) for i in idx], (h, w)))
    return out


def centred_pad(shape: tuple[int, int], canvas: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) borders that centre an image of `shape` on
    `canvas` (both (h, w)); an odd padding puts its extra pixel at the bottom/right."""
    dh, dw = (canvas[0] - shape[0]) / 2, (canvas[1] - shape[1]) / 2
    return round(dh - 0.1), round(dh + 0.1), round(dw - 0.1), round(dw + 0.1)


def letterbox_to(img: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Pad (and shrink if needed, never enlarge) to `shape` (H, W), centred as
    ultralytics' LetterBox. (canvas, gain, (left, top))."""
    h, w = img.shape[:2]
    gain = min(shape[0] / h, shape[1] / w, 1.0)
    nh, nw = round(h * gain), round(w * gain)
    if (nh, nw) != (h, w):
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    top, bottom, left, right = centred_pad((nh, nw), shape)
    canvas = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(PAD_VALUE,) * 3)
    return canvas, gain, (left, top)


def to_pixel_boxes(labels: np.ndarray, shape: tuple[int, int], offset: tuple[float, float]) -> np.ndarray:
    """Normalised (cls, cx, cy, w, h) of an image of `shape` -> (cls, x1, y1, x2, y2)
    pixels, shifted by `offset` (x, y) where the image sits on a canvas."""
    h, w = shape
    out = np.empty((len(labels), 5), dtype=np.float32)
    out[:, 0] = labels[:, 0]
    out[:, 1] = (labels[:, 1] - labels[:, 3] / 2) * w + offset[0]
    out[:, 2] = (labels[:, 2] - labels[:, 4] / 2) * h + offset[1]
    out[:, 3] = (labels[:, 1] + labels[:, 3] / 2) * w + offset[0]
    out[:, 4] = (labels[:, 2] + labels[:, 4] / 2) * h + offset[1]
    return out


def to_normalised(boxes: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(cls, x1, y1, x2, y2) pixels on an image of `shape` (h, w) -> normalised (cls, cx, cy, w, h)."""
    h, w = shape
    out = np.empty((len(boxes), 5), dtype=np.float32)
    out[:, 0] = boxes[:, 0]
    out[:, 1] = (boxes[:, 1] + boxes[:, 3]) / (2 * w)
    out[:, 2] = (boxes[:, 2] + boxes[:, 4]) / (2 * h)
    out[:, 3] = (boxes[:, 3] - boxes[:, 1]) / w
    out[:, 4] = (boxes[:, 4] - boxes[:, 2]) / h
    return out


def box_areas(boxes: np.ndarray) -> np.ndarray:
    return (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 4] - boxes[:, 2])


def outline_boxes(boxes: np.ndarray, outlines: list[np.ndarray], rect: tuple[float, float, float, float]) -> np.ndarray:
    """`boxes` with each one replaced by the bounding box of its outline's
    part inside `rect` (x0, y0, x1, y1); an outline wholly outside gives an
    empty box (dropped by keep_boxes). Ultralytics boxes the points of its
    1000-point resampled segment that fall inside; this clips exactly."""
    out = boxes.copy()
    x0, y0, x1, y1 = rect
    for k, o in enumerate(outlines):
        lo, hi = o.min(axis=0), o.max(axis=0)
        if lo[0] < x0 or lo[1] < y0 or hi[0] > x1 or hi[1] > y1:
            part = clip_polygon(o, x0, y0, x1, y1)
            lo, hi = (part.min(axis=0), part.max(axis=0)) if len(part) else ((x0, y0), (x0, y0))
        out[k, 1:] = (lo[0], lo[1], hi[0], hi[1])
    return out


def transform_points(points: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    xyz = np.concatenate([points, np.ones((len(points), 1))], axis=1) @ matrix.T
    return xyz[:, :2] / xyz[:, 2:3] if matrix[2, 0] or matrix[2, 1] else xyz[:, :2]


def rotated_clip(corners: np.ndarray, rect: tuple[float, float, float, float]) -> np.ndarray:
    """An oriented box's outline (its corners, resampled as ultralytics
    loads them: see YoloDataset) cut to `rect` (x0, y0, x1, y1) as
    ultralytics' Instances.clip(preserve_obb=True) cuts it: unchanged where
    inside; else the rectangle at the outline's own angle (OpenCV's
    minAreaRect of its points, turned by 90 degrees where its w < h) that
    bounds its visible part, so that an edge crop never changes the angle,
    resampled to as many points; nothing visible, every point at (x0, y0)."""
    x0, y0, x1, y1 = rect
    lo, hi = corners.min(axis=0), corners.max(axis=0)
    if lo[0] >= x0 and lo[1] >= y0 and hi[0] <= x1 and hi[1] <= y1:
        return corners
    visible = clip_polygon(convex_hull(corners), x0, y0, x1, y1)
    if len(visible) < 3:
        return np.full((len(corners), 2), (x0, y0), np.float32)
    (_, _), (w, h), angle = cv2.minAreaRect(corners.astype(np.float32))
    r = np.deg2rad(angle + 90 if w < h else angle)
    basis = np.array([[np.cos(r), -np.sin(r)], [np.sin(r), np.cos(r)]])
    aligned = visible @ basis
    (u1, v1), (u2, v2) = aligned.min(axis=0), aligned.max(axis=0)
    return resampled(np.array([(u2, v2), (u2, v1), (u1, v1), (u1, v2)]) @ basis.T, len(corners))


def cut_outline(outline: np.ndarray, rect: tuple[float, float, float, float], rotated: bool) -> np.ndarray:
    """An outline cut to `rect`: an oriented box's by rotated_clip, a
    segment's points clamped into it (ultralytics' two rules)."""
    return rotated_clip(outline, rect) if rotated else outline.clip(rect[:2], rect[2:])


def clip_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    out = boxes.copy()
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, width)
    out[:, [2, 4]] = out[:, [2, 4]].clip(0, height)
    return out


# -- mosaic -----------------------------------------------------------------

def mosaic_layout(shapes: list[tuple[int, int]], size: int,
                  rng: np.random.Generator) -> list[tuple[int, int, int, int, int, int]]:
    """Where four images of `shapes` (h, w) sit on the 2*size mosaic canvas
    around a random centre: per image (ox, oy) its top-left corner and
    (x1, y1, x2, y2) the part of the canvas it covers.

    Image k sits in quadrant k (top-left, top-right, bottom-left, bottom-right)
    with its corner on the centre, so the images never overlap and are cut
    only at the canvas border."""
    s2 = 2 * size
    xc, yc = (int(v) for v in rng.uniform(size / 2, 3 * size / 2, size=2))
    out = []
    for k, (h, w) in enumerate(shapes):
        ox = xc - w if k in (0, 2) else xc
        oy = yc - h if k in (0, 1) else yc
        out.append((ox, oy, max(ox, 0), max(oy, 0), min(ox + w, s2), min(oy + h, s2)))
    return out


def _placed_boxes(boxes: list[np.ndarray], layout) -> tuple[list[np.ndarray], np.ndarray]:
    """Each image's boxes moved onto the canvas and clipped to its part of it,
    and all boxes' areas before clipping (to drop mostly-cut boxes later)."""
    placed = []
    for bxs, (ox, oy, x1, y1, x2, y2) in zip(boxes, layout):
        shifted = bxs.copy()
        shifted[:, [1, 3]] = (shifted[:, [1, 3]] + ox).clip(x1, x2)
        shifted[:, [2, 4]] = (shifted[:, [2, 4]] + oy).clip(y1, y2)
        placed.append(shifted)
    areas = np.concatenate([box_areas(b) for b in boxes]) if boxes else np.zeros(0)
    return placed, areas.astype(np.float32)


def mosaic4(images: list[np.ndarray], boxes: list[np.ndarray], size: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four images on a 2*size canvas (see mosaic_layout). Returns (canvas,
    boxes clipped to it, each box's area before clipping) so the affine step
    can drop mostly-cut boxes."""
    s2 = 2 * size
    canvas = np.full((s2, s2, 3), PAD_VALUE, dtype=np.uint8)
    layout = mosaic_layout([img.shape[:2] for img in images], size, rng)
    for img, (ox, oy, x1, y1, x2, y2) in zip(images, layout):
        canvas[y1:y2, x1:x2] = img[y1 - oy:y2 - oy, x1 - ox:x2 - ox]
    placed, areas = _placed_boxes(boxes, layout)
    return canvas, (np.concatenate(placed) if placed else np.zeros((0, 5), np.float32)), areas


def mosaic_affine(images: list[np.ndarray], boxes: list[np.ndarray], size: int, hyp: AugmentHyp,
                  rng: np.random.Generator, outlines: list[list[np.ndarray]] | None = None,
                  paste: bool = False, rotated: bool = False, keypoints: list[np.ndarray] | None = None,
                  ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray] | None, np.ndarray | None]:
    """mosaic4 then random_affine, the same random draws, without building
    the 2*size canvas where the warp is only a scale and a shift (no rotation
    or shear, YOLO's default): each image's visible part is resized straight
    into its rectangle of the size x size output. That is 4-5x cheaper than
    warping the canvas (benchmarks/bench_loader.py); the pixels differ from
    the canvas warp by the rounding of each part's edges to whole pixels
    (below half a pixel), and the boxes follow each part's own resize exactly.

    `outlines` (each image's instance outlines, pixels, one per box): the
    boxes come from them after the warp, and they are returned warped (None
    without). With `paste` (copy_paste's flip mode), the canvas gets
    copy_paste_flip before the warp, as ultralytics pastes between its
    mosaic and its affine warp (no random draw). `rotated`: the outlines are
    oriented boxes' corners (see cut_outline). `keypoints` (each image's, [n,
    K, 3] in its pixels, one per box): placed, clipped to the canvas (those
    outside unlabelled, as ultralytics' Mosaic clips its instances), warped,
    and returned with the kept boxes (None without)."""
    layout = mosaic_layout([img.shape[:2] for img in images], size, rng)
    matrix, gain = affine_matrix((2 * size, 2 * size), size, hyp, rng)
    placed, areas = _placed_boxes(boxes, layout)
    # On the canvas, clamped to each image's part of it, as ultralytics clips its segments to the mosaic.
    canvas_outlines = None if outlines is None else \
        [cut_outline(o + (ox, oy), (x1, y1, x2, y2), rotated) for outs, (ox, oy, x1, y1, x2, y2)
         in zip(outlines, layout) for o in outs]
    canvas_points = None if keypoints is None else \
        [clip_keypoints(shifted(k, ox, oy), 2 * size, 2 * size) for k, (ox, oy, *_) in zip(keypoints, layout)]
    pasting = paste and bool(hyp.copy_paste) and outlines is not None
    if pasting or matrix[0, 1] != 0 or matrix[1, 0] != 0 or matrix[2, 0] != 0 or matrix[2, 1] != 0:
        # rotation, shear, perspective or pasting: warp the whole canvas
        canvas = np.full((2 * size, 2 * size, 3), PAD_VALUE, dtype=np.uint8)
        for img, (ox, oy, x1, y1, x2, y2) in zip(images, layout):
            canvas[y1:y2, x1:x2] = img[y1 - oy:y2 - oy, x1 - ox:x2 - ox]
        placed = np.concatenate(placed)
        if pasting:
            moved = [o + (ox, oy) for outs, (ox, oy, *_) in zip(outlines, layout) for o in outs]
            canvas, pasted, pasted_outlines = copy_paste_flip(canvas, placed, moved, hyp.copy_paste)
            placed, areas = np.concatenate([placed, pasted]), np.concatenate([areas, box_areas(pasted)])
            canvas_outlines += [o.clip(0, 2 * size) for o in pasted_outlines]
        return warp(canvas, placed, areas, matrix, gain, size, canvas_outlines, rotated,
                    None if canvas_points is None else np.concatenate(canvas_points))
    out = np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    # Edge coordinates (pixel i spans [i, i + 1)): out = s * canvas + c, where
    # the matrix maps pixel centres (OpenCV's convention for warpAffine).
    s = float(matrix[0, 0])
    cx, cy = float(matrix[0, 2]) + 0.5 - 0.5 * s, float(matrix[1, 2]) + 0.5 - 0.5 * s
    moved, warped, points, first = [], [], [], 0
    for k, (img, bxs, (ox, oy, x1, y1, x2, y2)) in enumerate(zip(images, placed, layout)):
        # The part's rectangle on the output, rounded to whole pixels: shared
        # edges round alike, so neighbouring parts neither overlap nor gap.
        xa, xb = (min(max(round(s * v + cx), 0), size) for v in (x1, x2))
        ya, yb = (min(max(round(s * v + cy), 0), size) for v in (y1, y2))
        # The canvas pixels that land there, rounded likewise and kept in the part.
        u0, u1 = (min(max(round((v - cx) / s), x1), x2) for v in (xa, xb))
        v0, v1 = (min(max(round((v - cy) / s), y1), y2) for v in (ya, yb))
        if xb > xa and yb > ya and u1 > u0 and v1 > v0:
            cv2.resize(img[v0 - oy:v1 - oy, u0 - ox:u1 - ox], (xb - xa, yb - ya), dst=out[ya:yb, xa:xb],
                       interpolation=cv2.INTER_LINEAR)
            fx, fy = (xb - xa) / (u1 - u0), (yb - ya) / (v1 - v0)
            b = bxs.copy()
            b[:, [1, 3]] = ((bxs[:, [1, 3]] - u0) * fx + xa).clip(xa, xb)
            b[:, [2, 4]] = ((bxs[:, [2, 4]] - v0) * fy + ya).clip(ya, yb)
            if canvas_outlines is not None:
                mine = [(o - (u0, v0)) * (fx, fy) + (xa, ya) for o in canvas_outlines[first:first + len(bxs)]]
                b = outline_boxes(b, mine, (xa, ya, xb, yb))
                warped += mine
            if canvas_points is not None:  # as the part's pixels moved
                mapped = np.array([[fx, 0, xa - u0 * fx], [0, fy, ya - v0 * fy], [0, 0, 1]])
                points.append(warp_keypoints(canvas_points[k], mapped, (size, size)))
        else:  # not on the output: its boxes end up outside and are dropped
            b = transform_boxes(bxs, matrix) if len(bxs) else bxs
            if canvas_outlines is not None:
                warped += [transform_points(o, matrix) for o in canvas_outlines[first:first + len(bxs)]]
            if canvas_points is not None:
                points.append(warp_keypoints(canvas_points[k], matrix, (size, size)))
        moved.append(b)
        first += len(bxs)
    moved = clip_boxes(np.concatenate(moved), size, size)
    keep = keep_boxes(moved, areas, gain)
    return out, moved[keep], None if outlines is None else in_boxes(warped, moved, keep, size, rotated), \
        None if keypoints is None else clip_keypoints(np.concatenate(points), size, size)[keep]


def shifted(keypoints: np.ndarray, dx: float, dy: float) -> np.ndarray:
    """Keypoints [n, K, 3] moved by (dx, dy) pixels, their visibility kept."""
    out = keypoints.astype(np.float32, copy=True)
    out[..., 0] += dx
    out[..., 1] += dy
    return out


# -- random affine ----------------------------------------------------------

def affine_matrix(in_shape: tuple[int, int], size: int, hyp: AugmentHyp,
                  rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """3x3 matrix: centre the input on the origin, rotate and scale, shear,
    then move to a random point near the middle of the size x size output.
    Returns (matrix, scale gain)."""
    h, w = in_shape
    centre = np.array([[1, 0, -w / 2], [0, 1, -h / 2], [0, 0, 1]], dtype=np.float64)
    angle = rng.uniform(-hyp.degrees, hyp.degrees)
    gain = rng.uniform(1 - hyp.scale, 1 + hyp.scale)
    rotate = np.eye(3)
    rotate[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=gain)
    shx, shy = (math.tan(math.radians(a)) for a in rng.uniform(-hyp.shear, hyp.shear, size=2))
    shear = np.array([[1, shx, 0], [shy, 1, 0], [0, 0, 1]], dtype=np.float64)
    tx, ty = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate, size=2) * size
    move = np.array([[1, 0, tx], [0, 1, ty], [0, 0, 1]], dtype=np.float64)
    if not hyp.perspective:  # drawn only when asked for: runs without it draw as they always did
        return move @ shear @ rotate @ centre, gain
    tilt = np.eye(3)
    tilt[2, :2] = rng.uniform(-hyp.perspective, hyp.perspective, size=2)
    return move @ shear @ rotate @ tilt @ centre, gain


def transform_boxes(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Axis-aligned hull of each box's four corners under the affine `matrix`."""
    n = len(boxes)
    corners = np.ones((n * 4, 3), dtype=np.float64)
    corners[:, :2] = boxes[:, [1, 2, 3, 2, 1, 4, 3, 4]].reshape(n * 4, 2)
    xyz = corners @ matrix.T
    xy = (xyz[:, :2] / xyz[:, 2:3] if matrix[2, 0] or matrix[2, 1] else xyz[:, :2]).reshape(n, 4, 2)
    out = np.empty((n, 5), dtype=np.float32)
    out[:, 0] = boxes[:, 0]
    out[:, 1:3] = xy.min(axis=1)
    out[:, 3:5] = xy.max(axis=1)
    return out


def keep_boxes(boxes: np.ndarray, areas_before: np.ndarray, gain: float) -> np.ndarray:
    """Mask of boxes still worth training on (see MIN_SIDE_PX, MIN_VISIBLE, MAX_ASPECT)."""
    w = boxes[:, 3] - boxes[:, 1]
    h = boxes[:, 4] - boxes[:, 2]
    aspect = np.maximum(w / np.maximum(h, 1e-6), h / np.maximum(w, 1e-6))
    visible = w * h / np.maximum(areas_before * gain * gain, 1e-6)
    return (w > MIN_SIDE_PX) & (h > MIN_SIDE_PX) & (visible > MIN_VISIBLE) & (aspect < MAX_ASPECT)


def random_affine(img: np.ndarray, boxes: np.ndarray, areas_before: np.ndarray, size: int, hyp: AugmentHyp,
                  rng: np.random.Generator, outlines: list[np.ndarray] | None = None, rotated: bool = False,
                  keypoints: np.ndarray | None = None,
                  ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray] | None, np.ndarray | None]:
    """Warp `img` (any size) onto a size x size output; boxes follow (from
    their `outlines` where given), are clipped to it, and those that became
    tiny or mostly cut off are dropped. Returns (image, boxes, the kept
    boxes' outlines warped, or None; `rotated`: oriented boxes' corners, see
    cut_outline; the kept boxes' `keypoints` warped, those outside the
    output unlabelled and clipped to it, or None)."""
    matrix, gain = affine_matrix(img.shape[:2], size, hyp, rng)
    return warp(img, boxes, areas_before, matrix, gain, size, outlines, rotated, keypoints)


def warp(img: np.ndarray, boxes: np.ndarray, areas_before: np.ndarray, matrix: np.ndarray, gain: float,
         size: int, outlines: list[np.ndarray] | None = None, rotated: bool = False,
         keypoints: np.ndarray | None = None,
         ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray] | None, np.ndarray | None]:
    border = (PAD_VALUE, PAD_VALUE, PAD_VALUE)
    if matrix[2, 0] or matrix[2, 1]:
        out = cv2.warpPerspective(img, matrix, dsize=(size, size), flags=cv2.INTER_LINEAR, borderValue=border)
    else:
        out = cv2.warpAffine(img, matrix[:2], dsize=(size, size), flags=cv2.INTER_LINEAR, borderValue=border)
    if not len(boxes):
        return out, boxes, outlines, keypoints
    moved = transform_boxes(boxes, matrix)
    if outlines is not None:
        outlines = [transform_points(o, matrix) for o in outlines]
        moved = outline_boxes(moved, outlines, (0, 0, size, size))
    moved = clip_boxes(moved, size, size)
    keep = keep_boxes(moved, areas_before, gain)
    if keypoints is not None:  # as ultralytics' RandomPerspective: moved, then clipped with its instances
        keypoints = clip_keypoints(warp_keypoints(keypoints, matrix, (size, size)), size, size)[keep]
    return out, moved[keep], None if outlines is None else in_boxes(outlines, moved, keep, size, rotated), keypoints


def in_boxes(outlines: list[np.ndarray], boxes: np.ndarray, keep: np.ndarray, size: int,
             rotated: bool = False) -> list[np.ndarray]:
    """The kept outlines, each clamped to its box (cls, x1, y1, x2, y2), as
    ultralytics clamps its segments after the warp: a mask drawn from one
    then stays inside its box; oriented boxes' corners cut to the size x
    size output by rotated_clip instead (ultralytics' preserve_obb)."""
    if rotated:
        return [rotated_clip(o, (0, 0, size, size)) for o, k in zip(outlines, keep) if k]
    return [o.clip(b[1:3], b[3:5]) for o, b, k in zip(outlines, boxes, keep) if k]


# -- colour and flip --------------------------------------------------------

def hsv_gains(hyp: AugmentHyp, rng: np.random.Generator) -> np.ndarray | None:
    """Random gains on hue, saturation and value (float64 [3]); None, drawing
    nothing, where all three strengths are zero (then apply_hsv must not run:
    the RGB -> HSV -> RGB round trip alone would change pixels)."""
    if not (hyp.hsv_h or hyp.hsv_s or hyp.hsv_v):
        return None
    return rng.uniform(-1, 1, size=3) * (hyp.hsv_h, hyp.hsv_s, hyp.hsv_v) + 1


def apply_hsv(img: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """`img` with hue, saturation and value multiplied by `gains` (OpenCV's
    8-bit HSV: hue 0..179 wraps around, the others are clipped to 255)."""
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_RGB2HSV))
    x = np.arange(256, dtype=np.float32)
    lut_h = ((x * gains[0]) % 180).astype(np.uint8)  # OpenCV's 8-bit hue is 0..179
    lut_s = np.clip(x * gains[1], 0, 255).astype(np.uint8)
    lut_v = np.clip(x * gains[2], 0, 255).astype(np.uint8)
    hsv = cv2.merge((cv2.LUT(hue, lut_h), cv2.LUT(sat, lut_s), cv2.LUT(val, lut_v)))
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def mix(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """MixUp (Zhang et al., 2018) as YOLO detectors do it: the two images
    blended by a ratio drawn from Beta(32, 32) (about a half), the boxes of both kept."""
    ratio = rng.beta(32.0, 32.0)
    img = (a[0].astype(np.float32) * ratio + b[0].astype(np.float32) * (1 - ratio)).astype(np.uint8)
    return img, np.concatenate([a[1], b[1]])


def cut_mix(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], rng: np.random.Generator,
            tries: int = 3, min_visible: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """CutMix (Yun et al., 2019) as ultralytics does it for detection: of
    `tries` random rectangles (side sqrt(1 - u) of the image's, u uniform),
    one that covers none of a's boxes gets b's pixels there, with b's boxes
    that show at least `min_visible` of themselves in it, clipped to it. `a`
    unchanged where no rectangle is free or none of b's boxes shows."""
    return cut_mix_patch(a, b, rng, tries, min_visible)[:2]


def cut_mix_patch(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], rng: np.random.Generator,
                  tries: int = 3, min_visible: float = 0.1
                  ) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int] | None, np.ndarray]:
    """cut_mix's (image, boxes), the rectangle pasted (x1, y1, x2, y2; None
    where nothing was) and the indices of b's boxes pasted, in order (for
    their outlines to follow)."""
    img, boxes = a
    nothing = (img, boxes, None, np.zeros(0, np.int64))
    h, w = img.shape[:2]
    free = []
    for _ in range(tries):
        ratio = np.sqrt(1.0 - rng.beta(1.0, 1.0))
        cw, ch, cx, cy = int(w * ratio), int(h * ratio), rng.integers(w), rng.integers(h)
        rect = (max(cx - cw // 2, 0), max(cy - ch // 2, 0), min(cx + cw // 2, w), min(cy + ch // 2, h))
        if not _covered(boxes, rect).any():
            free.append(rect)
    if not free:
        return nothing
    x1, y1, x2, y2 = free[rng.integers(len(free))]
    shown = np.flatnonzero(_covered(b[1], (x1, y1, x2, y2)) / np.maximum(box_areas(b[1]), 1e-6) >= min_visible)
    if not len(shown):
        return nothing
    out = img.copy()
    out[y1:y2, x1:x2] = b[0][y1:y2, x1:x2]
    pasted = b[1][shown].copy()
    pasted[:, [1, 3]] = pasted[:, [1, 3]].clip(x1, x2)
    pasted[:, [2, 4]] = pasted[:, [2, 4]].clip(y1, y2)
    return out, np.concatenate([boxes, pasted]), (x1, y1, x2, y2), shown


def _covered(boxes: np.ndarray, rect: tuple[int, int, int, int]) -> np.ndarray:
    """The area of each (cls, x1, y1, x2, y2) box inside `rect` (x1, y1, x2, y2)."""
    w = np.minimum(boxes[:, 3], rect[2]) - np.maximum(boxes[:, 1], rect[0])
    h = np.minimum(boxes[:, 4], rect[3]) - np.maximum(boxes[:, 2], rect[1])
    return np.clip(w, 0, None) * np.clip(h, 0, None)


def copy_paste(img: np.ndarray, boxes: np.ndarray, source: np.ndarray, source_boxes: np.ndarray,
               source_outlines: list[np.ndarray], share: float) -> tuple[np.ndarray, np.ndarray]:
    """Copy-Paste (Ghiasi et al., 2021) as ultralytics does it: the
    instances of the `source` image (its boxes and outlines, pixels of an
    image of img's size) that cover less than 0.3 of each of `boxes`;
    round(share x their number) of them, the least overlapping first, are
    pasted inside their outlines. Returns (image, the indices of the pasted
    source instances); nothing random is drawn. A box's part of the outline
    cut off by the image's edge still counts, as there."""
    if not len(boxes) or not len(source_boxes) or share <= 0:
        return img, np.zeros(0, np.int64)
    covered = np.stack([_covered(boxes, tuple(m[1:])) for m in source_boxes]) / (box_areas(boxes)[None] + 1e-7)
    free = np.flatnonzero((covered < 0.3).all(axis=1))
    chosen = free[np.argsort(covered[free].max(axis=1), kind="stable")][:round(share * len(free))]
    if not len(chosen):
        return img, chosen
    mask = np.zeros(img.shape[:2], np.uint8)
    for j in chosen:  # one by one: overlapping outlines fill, never cancel out
        cv2.fillPoly(mask, [source_outlines[j].astype(np.int32)], 1)
    region = mask.astype(bool)
    out = img.copy()
    out[region] = source[region]
    return out, chosen


def copy_paste_flip(img: np.ndarray, boxes: np.ndarray, outlines: list[np.ndarray],
                    share: float) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """copy_paste in ultralytics' mode flip: the source is the image
    mirrored left-right, with its instances mirrored. Returns (image, the
    pasted boxes, their outlines)."""
    w = img.shape[1]
    mirrored = boxes.copy()
    mirrored[:, 1], mirrored[:, 3] = w - boxes[:, 3], w - boxes[:, 1]
    flipped = [np.column_stack([w - o[:, 0], o[:, 1]]) for o in outlines]
    out, chosen = copy_paste(img, boxes, cv2.flip(img, 1), mirrored, flipped, share)
    return out, mirrored[chosen], [flipped[j] for j in chosen]


def flip_ud(img: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = img.shape[0]
    out = boxes.copy()
    out[:, 2], out[:, 4] = h - boxes[:, 4], h - boxes[:, 2]
    return cv2.flip(img, 0), out


def flip_lr(img: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = img.shape[1]
    out = boxes.copy()
    out[:, 1], out[:, 3] = w - boxes[:, 3], w - boxes[:, 1]
    return cv2.flip(img, 1), out  # 20x faster than copying numpy's reversed view
