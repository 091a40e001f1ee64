"""A synthetic dataset of coloured shapes, in ultralytics layout, for
detection, instance segmentation, classification, oriented boxes or keypoints.

`make_shapes(dest)` (and `hpcyolo make-dataset shapes DIR`) writes::

    DIR/images/{train,val}/NNNNNN.jpg
    DIR/labels/{train,val}/NNNNNN.txt    one `class cx cy w h` line per object, normalised
    DIR/data.yaml                        path: ., train: images/train, val: images/val, names

`task="segment"` (`--task segment`) writes the same images with one
`class x1 y1 x2 y2 ... xn yn` line per object instead: the shape's
silhouette as a polygon (normalised, clipped to the image; a ring's hole
joined to its outline by a zero-width cut, as ultralytics writes a mask with
a hole), the polygon ultralytics reads segments from. `task="obb"` (`--task obb`)
writes one `class x1 y1 x2 y2 x3 y3 x4 y4` line per object: the four
corners of the tight rotated rectangle (minimum area) around that polygon,
normalised, an object whose rectangle would leave the image placed again
(ultralytics refuses corners beyond 1% outside). `task="pose"` (`--task
pose`) writes one `class cx cy w h` line per object followed by 4
keypoints `x y v`: the extreme points of the shape's whole outline, in the
order leftmost, topmost, rightmost, bottommost (where several outline points
tie, their middle), each visibility 2 where it lies inside the image, else
`0 0 0` (unlabelled, as ultralytics writes them); data.yaml gets
`kpt_shape: [4, 3]` and `flip_idx: [2, 1, 0, 3]` (a left-right mirror swaps
the leftmost and rightmost points; ultralytics reorders by flip_idx on an
up-down flip too, which would want [0, 3, 2, 1]: that flip, off by default
in ultralytics and hpcyolo, is wrong for this set). `task="classify"`
writes 6-10 shapes of one class per image into ultralytics' classification layout, the
classes balanced, no labels and no data.yaml (the folder is the dataset)::

    DIR/{train,val}/CLASS/NNNNNN.jpg

It exists so that a training run can be checked end to end in minutes, on a
CPU, with a meaningful number at the end: a YOLO "n" model trained from
scratch for under ten minutes should reach mAP@0.5 >= 0.6 on the val split.
Every choice below serves that: the task must be learnable quickly, yet not
so trivial that a broken trainer passes.

Design
------
* **Class = silhouette, never colour.** Classes are circle, square, triangle,
  cross, star, ring (`classes` takes the first N). Each object gets a random
  colour, so the only way to tell classes apart is shape. The six outlines are
  mutually distinct at any rotation and size we draw: filled round (circle),
  four straight sides (square), three (triangle), a plus with concave corners
  (cross), five spikes (star), a round outline with a hole (ring). Rotation is
  limited to +-25 degrees for squares and crosses (so a square never becomes a
  diamond and a cross never an X); triangles and stars rotate freely. A mild
  aspect jitter (0.8-1.25) makes the box regression non-trivial.
* **Sizes 12%-50% of the image side**, log-uniform (as many small as large
  objects). At imgsz 160 the smallest is ~19 px: several cells of the
  stride-8 head, so nothing is too tiny for a from-scratch "n" model.
* **Contrast.** Backgrounds are a random two-colour linear gradient plus
  low-frequency colour blotches plus per-pixel Gaussian noise (the whole image
  is noised after the shapes are drawn, so shapes are not flat either). A
  shape's colour is re-drawn until it is at least 130 RGB units away from the
  mean background under it and from the colour of any object it overlaps:
  visible, but not always by the same cue (hue, brightness or both).
* **Classify: 6-10 light shapes of the image's class on a dark background,
  each 12%-25% of the side.** A classifier pools its features over the whole
  image, and with the colours of shape and background both random it must
  first learn edges that ignore their sign: measured with yolo11n-cls from
  scratch (800 images at 160 px, plain torch, no augmentation), it stays at
  chance for 8 epochs on the detection images and on plain-coloured ones
  alike, and learns white shapes on black to 0.96 top-1. So a classify
  image's background is darkened (x 0.45) and its shapes drawn in random
  light colours (each channel 150-255): the class is still the silhouette
  alone. One shape an image (30%-70% of the side) was learnt too, but
  ultralytics' augmentation (a crop of half the image or more, RandAugment,
  an erased rectangle) often took its evidence away: learning began at an
  epoch from the 4th to past the 12th, on both trainers alike, and 12-epoch
  runs ended anywhere from 0.29 to 0.92. With several shapes a crop or an
  erased rectangle leaves some: 12-epoch runs at the demo's settings end
  at 0.645-0.98 top-1, mean 0.85 over 6 seeds, on both trainers
  (benchmarks/bench_ultralytics_train.py --task classify).
* **Visibility.** A new object is rejected (and re-placed, up to 30 tries)
  if its box has IoU > 0.3 with an earlier box, or if it would hide more than
  25% of the pixels of an earlier object. Objects may stick out of the image,
  but at least 75% of each stays inside. So every labelled object stays
  recognisable.
* **Tight boxes.** Shapes are drawn 4x supersampled into a per-object alpha
  mask (anti-aliased edges); the label is the bounding box of the pixels with
  alpha >= 0.5, clipped to the image: exactly what a person would draw.
* **Background images.** 5% of each split (rounded) has no object and an
  empty label file, as real datasets do; it teaches the model to stay silent.
* **JPEG, quality 95, no chroma subsampling.** Measured on these images
  (160 px): OpenCV (what ultralytics loaders call) decodes them in ~0.8 ms
  against ~1.5 ms for the same pixels as PNG, Pillow in ~1.4 ms against
  ~1.8 ms; the files are less than half the size (~24 KB against ~55 KB:
  noisy backgrounds deflate badly), which also halves staging and page-cache
  traffic. Decoding is what a CPU data loader spends its time on in a short
  run. The 4:4:4 sampling keeps colour edges crisp; quality 95 keeps
  artefacts far below the added noise.
* **Deterministic and parallel.** Image i of split s is a pure function of
  (seed, s, i) (its own numpy Generator), so the output is byte-identical for
  a seed whatever the number of worker processes. Worker processes are used
  only for large sets, where they pay for their start-up.
* **Atomic.** Everything is written into DIR.partial-XXXX next to DIR, then
  renamed into place; an existing non-empty DIR is never touched.
"""

from __future__ import annotations

import functools
import io
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.polygon import clip_polygon, min_area_rect
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "cross", "star", "ring")
SPLITS = ("train", "val")
TASKS = ("detect", "segment", "classify", "obb", "pose")  # what make_shapes writes labels for
KEYPOINTS = ("leftmost", "topmost", "rightmost", "bottommost")  # a pose label's keypoints, in order
FLIP_IDX = (2, 1, 0, 3)           # a left-right mirror of KEYPOINTS: leftmost <-> rightmost
TIE_PX = 0.5                      # outline points this close to the extreme one share it
ROUND_POINTS = 32                 # polygon points of a circle's (and a ring's each) outline

MIN_SIZE, MAX_SIZE = 0.12, 0.50   # object side, fraction of the image side
CLASSIFY_SIZES = (0.12, 0.25)     # a classify image's shapes, fraction of the side
CLASSIFY_COUNT = (6, 10)          # a classify image's shapes (all of its class): the range
DARK_BACKGROUND = 0.45            # a classify image's background, scaled down
LIGHT_SHAPE = (150.0, 255.0)      # a classify shape's colour channels: the range
MAX_IOU = 0.3                     # between boxes of one image
MAX_HIDDEN = 0.25                 # of an earlier object's pixels a later one may cover
MIN_INSIDE = 0.75                 # of an object's pixels inside the image
MIN_COLOR_DIST = 130.0            # RGB distance shape colour <-> what lies under it
BACKGROUND_FRACTION = 0.05
SUPERSAMPLE = 4
JPEG_QUALITY = 95
PLACEMENT_TRIES = 30
PARALLEL_THRESHOLD = 3000         # images; below this one process is faster
PROGRESS_THRESHOLD = 2000         # images; report progress on stderr from this size up


# --------------------------------------------------------------------------- drawing

def _polygon(kind: str, rotation: float) -> np.ndarray:
    """Vertices of a unit-ish polygon for `kind`, rotated by `rotation` radians."""
    if kind == "square":
        pts = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
    elif kind == "triangle":
        pts = [(math.cos(a), -math.sin(a)) for a in np.deg2rad([90, 210, 330])]
    elif kind == "cross":
        t = 0.36  # half arm thickness
        pts = [(-t, -1), (t, -1), (t, -t), (1, -t), (1, t), (t, t), (t, 1), (-t, 1), (-t, t), (-1, t), (-1, -t),
               (-t, -t)]
    elif kind == "star":
        pts = []
        for k in range(10):
            r = 1.0 if k % 2 == 0 else 0.45
            a = math.pi / 2 + k * math.pi / 5
            pts.append((r * math.cos(a), -r * math.sin(a)))
    else:
        raise ValueError(kind)
    p = np.asarray(pts, dtype=np.float64)
    c, s = math.cos(rotation), math.sin(rotation)
    return p @ np.array([[c, s], [-s, c]])


def outline(kind: str, w: int, h: int, rotation: float = 0.0) -> np.ndarray:
    """The polygon (k, 2), in pixels of the w x h patch (a pixel i spans
    [i, i + 1]), that shape_alpha fills: its vertices, or ROUND_POINTS points
    of an ellipse; a ring's outer ellipse, then its inner one backwards,
    joined by a zero-width cut."""
    ss = SUPERSAMPLE
    W, H = w * ss, h * ss
    if kind in ("circle", "ring"):
        angles = np.linspace(0, 2 * np.pi, ROUND_POINTS, endpoint=False)
        unit = np.stack([np.cos(angles), np.sin(angles)], 1)
        rx, ry = (W - 1) / 2, (H - 1) / 2
        points = (rx, ry) + unit * (rx, ry)
        if kind == "ring":
            width = max(ss, round(0.24 * min(W, H)))
            inner = (rx, ry) + unit * (rx - width, ry - width)
            points = np.concatenate([points, points[:1], inner[:1], inner[::-1]])
    else:
        p = _polygon(kind, rotation)
        lo, hi = p.min(0), p.max(0)
        points = (p - lo) / (hi - lo) * [W - 1, H - 1]
    return (points + 0.5) / ss


def shape_alpha(kind: str, w: int, h: int, rotation: float = 0.0) -> np.ndarray:
    """An anti-aliased float32 alpha mask (h, w) in [0, 1] of `kind`, scaled
    so that its outline touches all four sides of the w x h patch."""
    ss = SUPERSAMPLE
    W, H = w * ss, h * ss
    mask = Image.new("L", (W, H), 0)
    draw = ImageDraw.Draw(mask)
    if kind == "circle":
        draw.ellipse([0, 0, W - 1, H - 1], fill=255)
    elif kind == "ring":
        width = max(ss, round(0.24 * min(W, H)))
        draw.ellipse([0, 0, W - 1, H - 1], outline=255, width=width)
    else:
        p = _polygon(kind, rotation)
        lo, hi = p.min(0), p.max(0)
        p = (p - lo) / (hi - lo) * [W - 1, H - 1]
        draw.polygon([tuple(v) for v in p], fill=255)
    small = mask.resize((w, h), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


@functools.lru_cache(maxsize=8)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in [-0.5, 0.5], as (1, size) and (size, 1)."""
    c = (np.arange(size, dtype=np.float32) + 0.5) / size - 0.5
    return c[None, :], c[:, None]


@functools.lru_cache(maxsize=32)
def _upsampler(size: int, n: int) -> np.ndarray:
    """(size, n) linear-interpolation matrix from n control points to size pixels."""
    pos = np.clip((np.arange(size) + 0.5) / size * (n - 1), 0, n - 1)
    lo = np.minimum(pos.astype(int), n - 2)
    frac = (pos - lo).astype(np.float32)
    m = np.zeros((size, n), dtype=np.float32)
    m[np.arange(size), lo] = 1 - frac
    m[np.arange(size), lo + 1] = frac
    return m


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """float32 (3, size, size), channels first (fast broadcasting): a
    two-colour linear gradient plus low-frequency colour blotches."""
    c1, c2 = rng.uniform(0, 255, 3).astype(np.float32), rng.uniform(0, 255, 3).astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    xx, yy = _grid(size)
    t = xx * math.cos(angle) + yy * math.sin(angle)          # in [-0.71, 0.71]
    t = t * np.float32(1 / math.sqrt(2)) + np.float32(0.5)   # in [0, 1]
    img = c1[:, None, None] + (c2 - c1)[:, None, None] * t[None]
    n = int(rng.integers(3, 7))
    blotch = rng.normal(0, 25, (3, n, n)).astype(np.float32)
    up = _upsampler(size, n)
    img += up @ blotch @ up.T
    return img


NOISE_BANK = 512


@functools.lru_cache(maxsize=1)
def _noise_bank() -> np.ndarray:
    """(3, 512, 512) standard normal noise, the same in every process.

    Drawing 3 x 160 x 160 fresh normals costs more than the rest of an image
    together; a random window of a fixed bank is as good for this purpose."""
    return np.random.default_rng(0x5EED).standard_normal((3, NOISE_BANK, NOISE_BANK), dtype=np.float32)


def _noise(rng: np.random.Generator, size: int) -> np.ndarray:
    """(3, size, size) unit Gaussian pixel noise."""
    if size > NOISE_BANK:
        return rng.standard_normal((3, size, size), dtype=np.float32)
    oy, ox = rng.integers(0, NOISE_BANK - size + 1, 2)
    return _noise_bank()[rng.permutation(3), oy:oy + size, ox:ox + size]


def _pick_color(rng: np.random.Generator, under: list[np.ndarray]) -> np.ndarray:
    """A random colour far enough from each of the colours in `under`."""
    ref = np.asarray(under, dtype=np.float64).reshape(-1, 3)
    best, best_d = None, -1.0
    for _ in range(50):
        c = rng.uniform(0, 255, 3)
        d = float(np.linalg.norm(ref - c, axis=1).min())
        if d >= MIN_COLOR_DIST:
            return c
        if d > best_d:
            best, best_d = c, d
    return best  # pragma: no cover - 50 misses in a row is vanishingly rare


def _box_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def render_image(rng: np.random.Generator, imgsz: int, classes: int, n_objects: int, *, only: int | None = None,
                 outlines: list | None = None, rotated: bool = False,
                 sizes: tuple[float, float] = (MIN_SIZE, MAX_SIZE), light: bool = False,
                 keypoints: list | None = None):
    """One image: (uint8 array (imgsz, imgsz, 3), [(class, x0, y0, x1, y1)] in pixels).

    Boxes are tight around the alpha >= 0.5 pixels of each shape, clipped to
    the image, with x1/y1 exclusive (pixel edges). `only`: every object of
    that class (the same random draws as without it). `outlines`: a list
    that gets each object's polygon (k, 2), in image pixels, clipped to it;
    with `rotated`, the four corners of that polygon's minimum-area rectangle
    instead, a placement whose rectangle leaves the image drawn again.
    `sizes`: the range of an object's side, fractions of the image side.
    `light`: light shapes on a darkened background (classify's images).
    `keypoints`: a list that gets each object's extreme points (4, 3) in
    image pixels (extreme_points; those outside the image: 0 0 0).
    """
    S = imgsz
    img = _background(rng, S)
    if light:
        img *= np.float32(DARK_BACKGROUND)
    owner = np.full((S, S), -1, dtype=np.int16)    # which object each pixel shows
    areas: list[int] = []                          # drawn pixels per object (inside the image)
    colors: list[np.ndarray] = []
    boxes: list[tuple[int, float, float, float, float]] = []
    for _ in range(n_objects):
        cls = int(rng.integers(classes))
        cls = cls if only is None else only
        kind = SHAPES[cls]
        for _try in range(PLACEMENT_TRIES):
            side = S * math.exp(rng.uniform(math.log(sizes[0]), math.log(sizes[1])))
            aspect = math.exp(rng.uniform(math.log(0.8), math.log(1.25)))
            w = max(4, round(side * math.sqrt(aspect)))
            h = max(4, round(side / math.sqrt(aspect)))
            x = int(rng.integers(-round(0.15 * w), S - round(0.85 * w) + 1))
            y = int(rng.integers(-round(0.15 * h), S - round(0.85 * h) + 1))
            if kind in ("square", "cross"):
                rot = rng.uniform(-math.radians(25), math.radians(25))
            else:
                rot = rng.uniform(0, 2 * math.pi)
            alpha = shape_alpha(kind, w, h, rot)
            # Crop the patch to the image.
            ax0, ay0 = max(0, -x), max(0, -y)
            ax1, ay1 = min(w, S - x), min(h, S - y)
            if ax1 <= ax0 or ay1 <= ay0:
                continue
            a = alpha[ay0:ay1, ax0:ax1]
            on = a >= 0.5
            total = int((alpha >= 0.5).sum())
            if total == 0 or on.sum() < MIN_INSIDE * total:
                continue
            rows, cols = np.flatnonzero(on.any(1)), np.flatnonzero(on.any(0))
            box = (x + ax0 + cols[0], y + ay0 + rows[0], x + ax0 + cols[-1] + 1, y + ay0 + rows[-1] + 1)
            if any(_box_iou(box, b[1:]) > MAX_IOU for b in boxes):
                continue
            if outlines is not None:
                points = np.clip(clip_polygon(outline(kind, w, h, rot) + (x, y), 0, 0, S, S), 0, S)
                if rotated:
                    points = min_area_rect(points)
                    if points.min() < 0 or points.max() > S:  # a label ultralytics would refuse
                        continue
            region = (slice(y + ay0, y + ay1), slice(x + ax0, x + ax1))
            covered = owner[region][on]
            hidden = np.bincount(covered[covered >= 0], minlength=len(areas))
            if any(hidden[j] > MAX_HIDDEN * areas[j] for j in range(len(areas))):
                continue
            sub = img[(slice(None), *region)]
            # Far from the background under it and from each object it touches.
            free = on & (owner[region] < 0)
            under = [colors[j] for j in np.flatnonzero(hidden)]
            if free.any():
                under.append(sub[:, free].mean(1))
            color = rng.uniform(*LIGHT_SHAPE, 3) if light else _pick_color(rng, under)
            sub += (color[:, None, None].astype(np.float32) - sub) * a[None]
            owner[region][on] = len(areas)
            areas.append(int(on.sum()))
            colors.append(color)
            boxes.append((cls, *map(float, box)))
            if outlines is not None:
                outlines.append(points)
            if keypoints is not None:
                keypoints.append(extreme_points(outline(kind, w, h, rot) + (x, y), S))
            break
    img += _noise(rng, S) * np.float32(rng.uniform(4, 10))
    np.clip(img + 0.5, 0, 255, out=img)
    return np.ascontiguousarray(img.astype(np.uint8).transpose(1, 2, 0)), boxes


def extreme_points(points: np.ndarray, size: int) -> np.ndarray:
    """The keypoints (4, 3) of an outline (k, 2) in an image size x size:
    its leftmost, topmost, rightmost and bottommost points (where outline
    points tie within TIE_PX, their middle along the other axis), each x, y,
    visibility 2 if it lies inside the image, else 0, 0, 0."""
    out = np.zeros((4, 3))
    for k, (axis, sign) in enumerate(((0, -1), (1, -1), (0, 1), (1, 1))):
        along = points[:, axis] * sign
        tied = points[along >= along.max() - TIE_PX, 1 - axis]
        point = np.empty(2)
        point[axis], point[1 - axis] = points[along.argmax(), axis], (tied.min() + tied.max()) / 2
        if 0 <= point.min() and point.max() <= size:
            out[k] = (*point, 2)
    return out


def _label_text(boxes, imgsz: int) -> str:
    lines = []
    for cls, x0, y0, x1, y1 in boxes:
        cx, cy = (x0 + x1) / 2 / imgsz, (y0 + y1) / 2 / imgsz
        w, h = (x1 - x0) / imgsz, (y1 - y0) / imgsz
        lines.append(f"{cls} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}\n")
    return "".join(lines)


def _polygon_text(boxes, outlines, imgsz: int) -> str:
    return "".join(f"{cls} " + " ".join(f"{v:.6f}" for v in (points / imgsz).ravel()) + "\n"
                   for (cls, *_), points in zip(boxes, outlines))


def _pose_text(boxes, keypoints, imgsz: int) -> str:
    lines = _label_text(boxes, imgsz).splitlines()
    return "".join(line + "".join(f" {x / imgsz:.6f} {y / imgsz:.6f} {v:g}" for x, y, v in points) + "\n"
                   for line, points in zip(lines, keypoints))


def _encode_jpeg(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    return buf.getvalue()


# --------------------------------------------------------------------------- splits

def _background_indices(seed: int, split: int, n: int, task: str = "detect") -> set[int]:
    if task == "classify":  # an image of no class has no place in a class folder
        return set()
    rng = np.random.default_rng([seed, split, 0xB6])
    k = round(BACKGROUND_FRACTION * n)
    return set(rng.choice(n, size=k, replace=False).tolist()) if k else set()


def _write_one(job) -> None:
    root, split, index, seed, imgsz, classes, max_objects, empty, task = job
    rng = np.random.default_rng([seed, split, index])
    n_objects = 0 if empty else int(rng.integers(1, max_objects + 1))
    name, stem = SPLITS[split], f"{index:06d}"
    if task == "classify":  # shapes of one class, the classes in turn
        count = int(rng.integers(CLASSIFY_COUNT[0], CLASSIFY_COUNT[1] + 1))
        arr, boxes = render_image(rng, imgsz, classes, count, only=index % classes, sizes=CLASSIFY_SIZES, light=True)
        cls = boxes[0][0] if boxes else index % classes
        Path(root, name, SHAPES[cls], stem + ".jpg").write_bytes(_encode_jpeg(arr))
        return
    outlines = [] if task in ("segment", "obb") else None
    keypoints = [] if task == "pose" else None
    arr, boxes = render_image(rng, imgsz, classes, n_objects, outlines=outlines, rotated=task == "obb",
                              keypoints=keypoints)
    Path(root, "images", name, stem + ".jpg").write_bytes(_encode_jpeg(arr))
    if keypoints is not None:
        text = _pose_text(boxes, keypoints, imgsz)
    else:
        text = _label_text(boxes, imgsz) if outlines is None else _polygon_text(boxes, outlines, imgsz)
    Path(root, "labels", name, stem + ".txt").write_text(text)


def _workers(total: int) -> int:
    if total < PARALLEL_THRESHOLD or not sys.platform.startswith("linux"):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 16, total // 500))


def _check(name: str, value: int, lo: int, hi: int | None = None) -> None:
    if not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise HpcyoloError(f"{name} must be an integer {bound}, not {value!r}")


def _partial_folder(dest: Path) -> Path:
    """A new folder beside `dest` to write the dataset into, renamed into
    place at the end; a place where none can be made (a file on the way,
    /proc, no permission) is one line."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        file = next((p for p in dest.parents if p.exists() and not p.is_dir()), dest.parent)
        raise HpcyoloError(f"cannot create {dest}: {file} is a file, not a folder") from None
    except OSError as e:
        raise HpcyoloError(f"cannot create {dest}: cannot make the folder {e.filename} ({e.strerror})") from None
    try:
        return Path(tempfile.mkdtemp(dir=dest.parent, prefix=f"{dest.name}.partial-"))
    except OSError as e:
        raise HpcyoloError(f"cannot create {dest}: cannot write in {dest.parent} ({e.strerror})") from None


def make_shapes(dest: Path, *, n_train: int = 800, n_val: int = 200, imgsz: int = 160, classes: int = 4,
                seed: int = 0, max_objects: int = 4, progress: bool | None = None, task: str = "detect") -> Path:
    """Write the shapes dataset for `task` (TASKS) into `dest` (which must not
    exist, or be an empty directory) and return the path of its data.yaml
    (for classify, of the folder: ultralytics takes a classification dataset
    as its folder).

    `progress`: report on stderr; None means only for large sets.
    """
    if task not in TASKS:
        raise HpcyoloError(f"task must be one of {', '.join(TASKS)}, not {task!r}")
    _check("n_train", n_train, 1)
    _check("n_val", n_val, 1)
    _check("imgsz", imgsz, 32, 4096)
    _check("classes", classes, 1, len(SHAPES))
    _check("seed", seed, 0)
    _check("max_objects", max_objects, 1, 50)
    dest = Path(dest)
    _check_dest(dest)
    partial = _partial_folder(dest)
    try:
        os.chmod(partial, 0o755)
        folders = [(name, shape) for name in SPLITS for shape in SHAPES[:classes]] if task == "classify" else \
            [(sub, name) for sub in ("images", "labels") for name in SPLITS]
        for folder in folders:
            (partial / Path(*folder)).mkdir(parents=True)
        jobs = []
        for split, n in enumerate((n_train, n_val)):
            empty = _background_indices(seed, split, n, task)
            jobs += [(str(partial), split, i, seed, imgsz, classes, max_objects, i in empty, task) for i in range(n)]
        total = len(jobs)
        report = progress if progress is not None else total >= PROGRESS_THRESHOLD
        step = max(1, total // 10)
        workers = _workers(total)

        def tick(done: int) -> None:
            if report and (done % step == 0 or done == total):
                print(f"shapes: {done}/{total} images", file=sys.stderr, flush=True)

        if workers == 1:
            for done, job in enumerate(jobs, 1):
                _write_one(job)
                tick(done)
        else:
            import multiprocessing

            # fork: a worker needs only numpy and Pillow, already loaded. A
            # spawned one would re-run the caller's __main__ (which breaks
            # `python -`, notebooks and unguarded scripts).
            ctx = multiprocessing.get_context("fork")
            chunk = max(1, min(64, total // (workers * 8)))
            with ctx.Pool(workers) as pool:
                for done, _ in enumerate(pool.imap_unordered(_write_one, jobs, chunksize=chunk), 1):
                    tick(done)
        names = "\n".join(f"  {i}: {SHAPES[i]}" for i in range(classes))
        pose = "" if task != "pose" else \
            (f"# keypoints: {', '.join(KEYPOINTS)} of each shape's outline\n"
             f"kpt_shape: [{len(KEYPOINTS)}, 3]\nflip_idx: [{', '.join(map(str, FLIP_IDX))}]\n")
        if task != "classify":
            (partial / "data.yaml").write_text(
                f"# Synthetic shapes: hpcyolo make-dataset shapes{'' if task == 'detect' else ' --task ' + task} "
                f"(seed {seed}, imgsz {imgsz})\npath: .\ntrain: images/train\nval: images/val\n{pose}"
                f"names:\n{names}\n")
        _check_dest(dest)
        try:
            os.rename(partial, dest)  # replaces an empty directory, fails on a non-empty one
        except OSError as e:
            raise HpcyoloError(f"{dest}: cannot move the new dataset into place: {e.strerror}") from None
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(e, OSError):  # the disk filled up, say
            raise HpcyoloError(f"{dest}: cannot write the dataset: {e.strerror}") from None
        raise
    try:
        from hpcyolo_trainer.common.fsutil import fsync_dir

        fsync_dir(dest.parent)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    return dest if task == "classify" else dest / "data.yaml"


def _check_dest(dest: Path) -> None:
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise HpcyoloError(f"{dest}: exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        raise HpcyoloError(f"{dest}: exists and is not empty; give a new directory")
