"""Detection data: the data YAML, YOLO label files, the dataset and its caches.

- `load_data_spec(yaml)` reads an ultralytics-style data YAML into a DataSpec
  (hpcyolo_trainer.common.datayaml, shared with the CLI's checks).
- `YoloDataset(files, imgsz, ...)` checks every image and label file once, at
  construction, dropping what is broken and recording one line per problem in
  `dataset.problems` (nothing is printed or raised: the trainer prints them on
  rank 0). Items are (img uint8 [3, S, S] RGB, or [3, H, W] with rectangular
  batches, labels float32 [n, 5] normalised to the image, path, meta).
- Augmentation randomness of item i in epoch e comes only from
  `np.random.default_rng((seed, e, i))`, never from global or worker RNG state,
  so a resumed run sees bit-identical batches whatever the worker count. A
  DataLoader fetches a batch through `__getitems__`; a mosaic's partners
  are drawn by the same generator from the batch's pool of images loaded
  around the same time (sampler.STREAM: a pure function of the run's batch
  order, as ultralytics' buffer of recent images), or from the whole
  dataset for a plain index list.
  DataLoader workers get a copy of the dataset when an iterator starts, so
  the epoch and the mosaic setting travel with each batch (an EpochBatch
  from sampler.RunBatches, which the trainer uses: one iterator for the
  run); plain index lists use the dataset's `set_epoch(e)` and `mosaic`,
  which must then be set before `iter(loader)`.
- Caches ("ram", "disk") are one uint8 file of decoded, resized images plus an
  index, built once under `cache_dir` (never next to the dataset) by one
  process under an fcntl lock and mapped read-only by every process: on a
  tmpfs such as /dev/shm the node holds one copy, not one per rank.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import io
import json
import math
import os
import shutil
import socket
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from ..common.datayaml import IMG_EXTS, DataSpec, label_path, load_data_spec, texts
from ..common.errors import HpcyoloError
from ..common.fsutil import fsync_dir
from ..common.polygon import xyxyxyxy2xywhr
from .augment import (
    PAD_VALUE,
    AugmentHyp,
    apply_hsv,
    box_areas,
    centred_pad,
    copy_paste,
    copy_paste_flip,
    cut_mix,
    cut_outline,
    cut_mix_patch,
    flip_lr,
    flip_ud,
    hsv_gains,
    letterbox,
    letterbox_pad,
    letterbox_to,
    mix,
    mosaic_affine,
    random_affine,
    rect_batches,
    resized_shapes,
    shifted,
    to_normalised,
    to_pixel_boxes,
)
from .filescan import cpus, per_file
from .keypoints import clip_keypoints, flip_keypoints, parse_pose_row
from .labels import parse_label_row
from .masks import instance_masks, overlap_masks, resampled
from .sampler import STREAM

# The data YAML and label paths live in hpcyolo_trainer.common.datayaml (no torch: the CLI
# checks a dataset with them on a login node); re-exported for the trainer.
__all__ = ["IMG_EXTS", "AugmentHyp", "DataSpec", "YoloDataset", "cache_bytes", "collate", "keep_freed_memory",
           "label_path", "load_data_spec"]
# ultralytics resamples an oriented box's four corners to 100 points along its
# edges on loading; OpenCV's minimum-area rectangle of those points is the
# box's Format makes, and where a warp tilts a box the points pick its angle.
OBB_POINTS = 100
# A keypoint dataset's row that does not read as its kpt_shape says: the problem's words, which the
# keypoint task's datasets refuse (a row of another shape is a dataset for another task or a wrong kpt_shape).
MALFORMED_POSE_ROW = "malformed pose row"
# Problem lines kept per dataset, the rest counted: a systematic fault (class
# ids counted from 1, a wrong `names`) would otherwise print one per label.
MAX_PROBLEM_LINES = 20
CACHE_FORMAT = 2  # bump when the cache layout or the decode/resize recipe changes
CACHE_MARKER = "COMPLETE"
# Mosaic partners from each batch's pool (sampler.STREAM);
# False: from the whole dataset, four decodes per mosaic, as hpcyolo drew
# them before (benchmarks/bench_mosaic_partners.py sets it to compare).
POOL_PARTNERS = True
# What one rank's loader processes keep, all together, of the images they
# decoded for the pools in use (a pool of 1000 images at imgsz 640 is about
# 0.9 GB; ultralytics' buffers at batch 64 and 8 workers hold about 3.8 GB).
RECENT_BYTES = 8 << 30

# OpenCV's own thread pool, multiplied by DataLoader workers and ranks, would
# oversubscribe the node's cores; parallelism comes from workers instead.
cv2.setNumThreads(0)


# == labels and images =======================================================

def read_labels(path: Path, nc: int) -> tuple[np.ndarray, list[str]]:
    """Rows of a label file and one message per malformed line. A missing or
    empty file is a background image. Raises OSError if the file exists but
    cannot be read."""
    rows, problems, _ = read_label_file(path, nc)
    return rows, problems


def read_label_file(path: Path, nc: int, kpt_shape: tuple[int, int] | None = None
                    ) -> tuple[np.ndarray, list[str], list[np.ndarray | None]]:
    """read_labels' rows and problems, and read_outlines' outlines, from one
    read of the file. With `kpt_shape` (a keypoint dataset's), every row is a
    pose row (data/keypoints.py parse_pose_row) and the third part is each
    row's keypoints [K, 3] instead (a malformed row's problem says
    MALFORMED_POSE_ROW: the keypoint tasks refuse it)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return np.zeros((0, 5), np.float32), [], []
    if kpt_shape is not None:
        return _read_pose_rows(path, text, nc, kpt_shape)
    rows, problems, outlines = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = parse_label_row(line, nc)
        if isinstance(row, str):
            problems.append(f"{path}:{number}: malformed label line skipped ({row}): {line.strip()[:80]!r}")
        else:
            rows.append(row)
            outlines.append(_outline(line))
    return (np.stack(rows) if rows else np.zeros((0, 5), np.float32)), problems, outlines


def _read_pose_rows(path: Path, text: str, nc: int, kpt_shape: tuple[int, int]
                    ) -> tuple[np.ndarray, list[str], list[np.ndarray]]:
    rows, problems, keypoints = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parsed = parse_pose_row(line, nc, kpt_shape)
        if isinstance(parsed, str):
            problems.append(f"{path}:{number}: {MALFORMED_POSE_ROW} ({parsed}): {line.strip()[:80]!r}")
        else:
            rows.append(parsed[0])
            keypoints.append(parsed[1])
    return (np.stack(rows) if rows else np.zeros((0, 5), np.float32)), problems, keypoints


def _outline(line: str) -> np.ndarray | None:
    """A well-formed row's polygon (k, 2) clipped to [0, 1], or None for a box."""
    values = np.array(line.split()[1:], dtype=np.float32)
    return values.reshape(-1, 2).clip(0, 1) if len(values) > 4 else None


def read_outlines(path: Path, nc: int) -> list[np.ndarray | None]:
    """Per row that read_labels keeps from `path`, in its order: the
    polygon's points (k, 2) as fractions of the image, clipped to [0, 1], or
    None for a box row. For copy_paste, which pastes instances by outline,
    and the warps that box them."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [_outline(line) for line in text.splitlines()
            if line.strip() and not isinstance(parse_label_row(line, nc), str)]


def probe_image(path: Path) -> tuple[int, int]:
    """(h, w) as decoded, after EXIF rotation (OpenCV applies it), without
    decoding the pixels; raises on an unreadable, corrupt or truncated file.
    One open of the file (on a parallel file system each open is a round
    trip to the metadata server), read from the start again as needed."""
    from PIL import Image  # here: a start on an indexed dataset probes nothing and does without Pillow's import

    with open(path, "rb") as f:
        with Image.open(f) as im:
            im.verify()  # structure and checksums where the format has them (PNG)
        f.seek(0)
        with Image.open(f) as im:  # verify() leaves the image unusable: parse it again
            w, h = im.size
            fmt = im.format
            orientation = im.getexif().get(0x0112, 1)
        if fmt == "JPEG" and not _has_jpeg_end(f):
            raise ValueError("truncated JPEG (no end-of-image marker)")
    if w < 1 or h < 1:
        raise ValueError(f"empty image ({w}x{h})")
    return (w, h) if orientation in (5, 6, 7, 8) else (h, w)


def _has_jpeg_end(f) -> bool:
    """A cut-off download decodes to a half-grey image without error; its
    end-of-image marker (FF D9) is missing. Some cameras pad after it, so
    look at the tail (of the open file `f`), not only the last two bytes."""
    f.seek(max(0, os.fstat(f.fileno()).st_size - 1024))
    return b"\xff\xd9" in f.read()


def decode_resized(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    """Decode to RGB and resize to `shape` (h, w); None if it cannot be decoded.

    OpenCV, not Pillow, by measurement (benchmarks/bench_decode.py, one thread,
    Pillow 13.0 / OpenCV 5.0): decode+resize to 640 ran at 488 vs 301 images/s
    on coco8 and 17.5 vs 13.3 on 1.3-12 MP JPEGs; the median Pillow/OpenCV time
    ratio over both sets and both operations was 1.24-1.38 in three runs (OpenCV faster).
    """
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)  # applies EXIF orientation, as probe_image assumes
    if bgr is None:
        return None
    h, w = shape
    if bgr.shape[:2] != (h, w):  # bilinear, shrinking too, as ultralytics 8.4 loads (data/base.py load_image)
        bgr = cv2.resize(bgr, (w, h), interpolation=cv2.INTER_LINEAR)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


# == checking the files ======================================================

@dataclass(frozen=True)
class Checked:
    """One image after the check: kept (shape, labels and their outlines,
    stat) or dropped (reason)."""

    path: Path
    shape: tuple[int, int] | None = None
    labels: np.ndarray | None = None
    stat: tuple[int, int] | None = None
    problems: tuple[str, ...] = ()
    dropped: str | None = None  # "corrupt images" or "unreadable label files"
    outlines: tuple[np.ndarray | None, ...] = ()  # per label row: its polygon (k, 2), or None for a box
    keypoints: np.ndarray | None = None  # a keypoint dataset's: per label row its keypoints, float32 [n, K, 3]


def check_one(path: Path, nc: int, kpt_shape: tuple[int, int] | None = None) -> Checked:
    try:
        st = path.stat()
        shape = probe_image(path)
    # Pillow raises a zoo of types on malformed files (SyntaxError, struct.error,
    # IndexError, DecompressionBombError, ...); any of them means "drop it".
    except Exception as e:  # noqa: BLE001
        return Checked(path, problems=(f"{path}: corrupt image dropped ({type(e).__name__}: {e})",),
                       dropped="corrupt images")
    try:
        labels, problems, outlines = read_label_file(label_path(path), nc, kpt_shape)
    except OSError as e:
        return Checked(path, problems=(f"{label_path(path)}: unreadable label file, image dropped ({e})",),
                       dropped="unreadable label files")
    if kpt_shape is not None:
        keypoints = np.stack(outlines) if outlines else np.zeros((0, kpt_shape[0], 3), np.float32)
        return Checked(path, shape, labels, (st.st_size, st.st_mtime_ns), tuple(problems),
                       outlines=(None,) * len(labels), keypoints=keypoints)
    return Checked(path, shape, labels, (st.st_size, st.st_mtime_ns), tuple(problems), outlines=tuple(outlines))


def check_each(files: list[Path], nc: int, kpt_shape: tuple[int, int] | None = None) -> list[Checked]:
    """check_one of every file, kept and dropped alike, in input order."""
    return per_file(lambda part: [check_one(Path(p), nc, kpt_shape) for p in part], files)


def check_files(files: list[Path], nc: int, kpt_shape: tuple[int, int] | None = None
                ) -> tuple[Kept, list[str], dict[str, int]]:
    """Kept images in input order, problem messages, and counts for the summary."""
    return sift(check_each(files, nc, kpt_shape))


class Kept:
    """The images a check kept, column by column, in input order: `paths`,
    `shapes` (h, w), `labels` (float32 [n, 5] each), `stats` (image size and
    mtime in ns, int64 [N, 2]), on demand, `outlines()` (per image, per
    label row its polygon or None) and, for a keypoint dataset, `keypoints`
    (float32 [n, K, 3] each: x, y as fractions of the image, visibility; else
    None). From Checked results (`of`), or built by the dataset's index
    straight from its arrays, without a Checked per image."""

    def __init__(self, paths: list[Path], shapes: list[tuple[int, int]], labels: list[np.ndarray],
                 stats: np.ndarray, outlines, keypoints: list[np.ndarray] | None = None):
        self.paths, self.shapes, self.labels, self.keypoints = paths, shapes, labels, keypoints
        self.stats = np.asarray(stats, np.int64).reshape(-1, 2)
        self._outlines = outlines  # list of per-image outlines, or a function that makes that list

    @classmethod
    def of(cls, items: list[Checked]) -> Kept:
        keypoints = [it.keypoints for it in items] if items and items[0].keypoints is not None else None
        return cls([it.path for it in items], [it.shape for it in items], [it.labels for it in items],
                   [it.stat for it in items], [list(it.outlines) for it in items], keypoints)

    def __len__(self) -> int:
        return len(self.paths)

    def outlines(self) -> list[list[np.ndarray | None]]:
        if callable(self._outlines):
            self._outlines = self._outlines()
        return self._outlines


def sift(results) -> tuple[Kept, list[str], dict[str, int]]:
    """check_each's results (or the dataset index's, which sift themselves
    from their arrays: `results.sift()`) -> the kept ones, the problem lines
    (at most MAX_PROBLEM_LINES, the rest counted) and the counts for the summary."""
    if hasattr(results, "sift"):
        return results.sift()
    counts = {"corrupt images": 0, "malformed label lines": 0, "unreadable label files": 0}
    problems: list[str] = []
    for r in results:
        problems += r.problems
        if r.dropped:
            counts[r.dropped] += 1
        else:
            counts["malformed label lines"] += len(r.problems)
    return Kept.of([r for r in results if not r.dropped]), cut_problems(problems), counts


def cut_problems(problems: list[str]) -> list[str]:
    """At most MAX_PROBLEM_LINES of `problems`, and a line counting the rest."""
    if len(problems) > MAX_PROBLEM_LINES:
        problems = [*problems[:MAX_PROBLEM_LINES], f"... and {len(problems) - MAX_PROBLEM_LINES} more problems "
                                                   "like these (counted below)"]
    return problems


def summary(counts: dict[str, int]) -> str:
    parts = [f"{n} {what}" for what, n in counts.items() if n or what != "unreadable label files"]
    return "skipped " + ", ".join(parts)


# == the shared image cache ==================================================

class ImageCache:
    """A built cache, read-only: `images.u8` (all images back to back, HxWx3
    RGB) and `index.npy` (int64 rows: byte offset, h, w, decoded ok)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.index = np.load(folder / "index.npy")
        self.nbytes = (folder / "images.u8").stat().st_size
        self._data: np.memmap | None = None

    def get(self, i: int) -> np.ndarray:
        if self._data is None:  # mapped lazily: in each DataLoader worker, after pickling
            self._data = np.memmap(self.folder / "images.u8", dtype=np.uint8, mode="r")
        offset, h, w, _ = (int(v) for v in self.index[i])
        return self._data[offset:offset + h * w * 3].reshape(h, w, 3)

    def ok(self, i: int) -> bool:
        return bool(self.index[i, 3])

    def __getstate__(self) -> dict:
        # Pickling a memmap copies its whole contents into every worker: send
        # the path only, and let the worker map the same file again.
        return {**self.__dict__, "_data": None}


def cache_digest(items: Kept, imgsz: int) -> str:
    """Changes whenever any file, its size or mtime, the image size, the cache
    layout or the decoder version does, so a stale cache is never used (a new
    OpenCV may decode a JPEG slightly differently)."""
    h = hashlib.sha256(json.dumps([CACHE_FORMAT, imgsz, cv2.__version__]).encode())
    for path, (size, mtime) in zip(texts(items.paths), items.stats.tolist()):
        h.update(f"{path}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()[:20]


def open_cache(cache_dir: Path, digest: str, paths: list[Path],
               shapes: list[tuple[int, int]]) -> tuple[ImageCache | None, bool, str | None]:
    """(cache or None, whether this process built it, why there is none). One
    process per cache_dir builds; the others wait on the lock, then map it."""
    final = cache_dir / f"imgcache-{digest}"
    if (final / CACHE_MARKER).exists():
        return ImageCache(final), False, None
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".imgcache-{digest}.lock", "w") as lock:
        locked = _lock(lock)
        if (final / CACHE_MARKER).exists():
            return ImageCache(final), False, None
        if locked:  # leftovers of a builder that died; holding the lock, none is live
            for old in cache_dir.glob(f".{final.name}.partial-*"):
                shutil.rmtree(old, ignore_errors=True)
        needed, free = sum(h * w * 3 for h, w in shapes), shutil.disk_usage(cache_dir).free
        if needed + (64 << 20) > free:
            return None, False, (f"image cache needs {needed / 2**30:.1f} GiB but {cache_dir} has "
                                 f"{free / 2**30:.1f} GiB free: decoding from the files instead")
        try:
            _build_cache(final, paths, shapes)
        except OSError as e:
            return None, False, f"cannot build the image cache in {cache_dir} ({e}): decoding from the files instead"
    return ImageCache(final), True, None


def use_cache(kind: str, cache_dir: Path, digest: str, paths: list[Path], shapes: list[tuple[int, int]],
              problems: list[str]) -> tuple[ImageCache | None, bool]:
    """open_cache for a dataset's `kind` of cache (ram or disk), with a line
    in `problems` for a ram cache off tmpfs and for a cache that could not be
    built (then None: the images are decoded from their files)."""
    if kind == "ram" and (fs := _filesystem_type(cache_dir)) not in ("", "tmpfs", "ramfs"):
        problems.append(f"ram cache in {cache_dir} is on {fs}, not tmpfs: pass a node-local tmpfs "
                        "such as /dev/shm/... as cache_dir")
    cache, built, why_not = open_cache(cache_dir, digest, paths, shapes)
    if why_not:
        problems.append(why_not)
    return cache, built


def _lock(lock) -> bool:
    """Exclusive lock; False where the file system has none (Lustre mounted
    without `flock`): then builders may race, which the rename step survives."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return True
    except OSError:
        return False


def _build_cache(final: Path, paths: list[Path], shapes: list[tuple[int, int]]) -> None:
    """Decode everything into a partial folder, then rename it into place with
    its completion marker inside: a folder at `final` is always complete."""
    partial = final.parent / f".{final.name}.partial-{socket.gethostname()}-{os.getpid()}"
    partial.mkdir()
    try:
        index = _cache_index(shapes)
        index[:, 3] = _fill_images(partial / "images.u8", index, paths)
        _write_synced(partial / "index.npy", _npy_bytes(index))
        marker = {"images": len(paths), "bytes": (partial / "images.u8").stat().st_size, "host": socket.gethostname()}
        _write_synced(partial / CACHE_MARKER, json.dumps(marker).encode())
        _rename_into_place(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _cache_index(shapes: list[tuple[int, int]]) -> np.ndarray:
    index = np.zeros((len(shapes), 4), dtype=np.int64)
    sizes = np.array([h * w * 3 for h, w in shapes], dtype=np.int64)
    index[1:, 0] = np.cumsum(sizes)[:-1]
    index[:, 1:3] = np.array(shapes, dtype=np.int64).reshape(-1, 2)
    return index


def _fill_images(file: Path, index: np.ndarray, paths: list[Path]) -> list[bool]:
    total = int((index[:, 1] * index[:, 2] * 3).sum())
    with open(file, "wb") as f:
        # Reserve the space now: a sparse file on a tmpfs that fills up later
        # kills the builder with SIGBUS on a page write; this fails with ENOSPC.
        os.posix_fallocate(f.fileno(), 0, total)
    data = np.memmap(file, dtype=np.uint8, mode="r+", shape=(total,))

    def fill(k: int) -> bool:
        offset, h, w = (int(v) for v in index[k, :3])
        img = decode_resized(paths[k], (h, w))
        data[offset:offset + h * w * 3] = PAD_VALUE if img is None else img.reshape(-1)
        return img is not None

    # All cores of this task: the other processes on the node are waiting anyway,
    # and OpenCV releases the GIL while it decodes.
    with ThreadPoolExecutor(max_workers=cpus()) as pool:
        ok = list(pool.map(fill, range(len(paths))))
    data.flush()  # msync: on a disk cache the pixels are durable before the rename (unmapped on return)
    return ok


def _rename_into_place(partial: Path, final: Path) -> None:
    try:
        os.replace(partial, final)
    except OSError:
        # Another node won an unlocked race (shared file system without flock).
        if not (final / CACHE_MARKER).exists():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    fsync_dir(final.parent)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _filesystem_type(path: Path) -> str:
    """Type of the mount holding `path`, from /proc/mounts ('' if unknown)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return ""
    target = str(path.resolve())
    best = max((m for m in mounts if target == m[0] or target.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]), default=("", ""))
    return best[1]


# == the dataset ==============================================================

class YoloDataset(Dataset):
    """Images and YOLO labels, letterboxed (val) or augmented (train).

    Batches from sampler.RunBatches carry their epoch and mosaic setting.
    Loaded otherwise, set `dataset.mosaic = False` for the close-mosaic
    epochs and call `set_epoch(e)` before each epoch's DataLoader iterator
    is created (workers receive a copy of the dataset then).

    `rect_batch=B`: rectangular batches as ultralytics' `rect` (images sorted
    by aspect ratio, B at a time, `dataset.batches`); each item is letterboxed
    to its batch's shape, without mosaic or affine warp. Load it with a batch
    sampler that keeps those batches together (sampler.RectBatchSampler).

    `hsv_on_device=True` (the trainer on a GPU): training items keep their
    colours and carry their HSV gains in `meta["hsv"]` for
    photometric.hsv_jitter_batch; every random draw stays the same.

    `obb=True` (train.task obb): every label row is an oriented box's four
    corners, carried through each augmentation as ultralytics carries them
    (cut by its rule for oriented boxes, augment.rotated_clip); an item's
    labels are float32 [n, 6]: class, then the minimum-area rectangle of the
    corners as ultralytics' Format makes it (xyxyxyxy2xywhr: cx, cy, w, h as
    fractions of the image's width and height, r in radians).

    `segments=True` (train.task segment): every label row is a polygon,
    carried through each augmentation with its box; an item's labels are
    (rows, masks), the masks rasterised at 1 / `mask_ratio` of the image,
    one map per image with `overlap_mask` (its rows in the map's order,
    largest instance first), else one mask per row (data/masks.py).

    `kpt_shape=(K, D)` (train.task pose; the data YAML's): every label row
    is a pose row (data/keypoints.py), its K keypoints carried through each
    augmentation as ultralytics carries them (warped with the image, those
    that leave it unlabelled, flipped and reordered by `flip_idx`; without
    a flip_idx neither flip is used, as in ultralytics); an item's labels
    are (rows [n, 5], keypoints float32 [n, K, 3]: x, y as fractions of the
    image, visibility). A row that does not read as kpt_shape says is
    refused in one line naming its file and line.
    """

    def __init__(self, files: list[Path], imgsz: int, *, augment: bool, hyp: AugmentHyp = AugmentHyp(),
                 seed: int = 0, cache: Literal["none", "ram", "disk"] = "none", cache_dir: Path | None = None,
                 names_count: int, rect_batch: int = 0, hsv_on_device: bool = False,
                 checked=None, segments: bool = False, mask_ratio: int = 4, overlap_mask: bool = True,
                 obb: bool = False, kpt_shape: tuple[int, int] | None = None, flip_idx: list[int] | None = None):
        if imgsz < 1 or seed < 0 or names_count < 1:
            raise ValueError(f"need imgsz >= 1, seed >= 0, names_count >= 1 (got {imgsz}, {seed}, {names_count})")
        if cache not in ("none", "ram", "disk") or (cache != "none" and cache_dir is None):
            raise ValueError(f"cache must be none, ram or disk (ram and disk need a cache_dir), got {cache!r}")
        if kpt_shape is not None and flip_idx is None and (hyp.fliplr or hyp.flipud):
            hyp = replace(hyp, fliplr=0.0, flipud=0.0)  # as ultralytics: a flip needs to know which keypoint is which
            flips_off = True
        else:
            flips_off = False
        self.imgsz, self.augment, self.hyp, self.seed = imgsz, augment, hyp, seed
        # The channel swap comes after the colour jitter: where it may swap, the jitter stays here.
        self.hsv_on_device = hsv_on_device and not hyp.bgr
        self.epoch = 0
        # `checked`: the check's results for `files` from the dataset's index (dataindex), read from one file.
        items, self.problems, self.counts = sift(checked) if checked is not None else \
            check_files(list(files), names_count, kpt_shape)
        self.paths, self.shapes, self.labels = items.paths, items.shapes, items.labels
        self.kpt_shape, self.flip_idx = kpt_shape, None if flip_idx is None else list(flip_idx)
        self.keypoints = pose_keypoints(items, self.problems, kpt_shape) if kpt_shape is not None else None
        if flips_off and augment:
            self.problems.append("no flip_idx in the data YAML: fliplr and flipud are off (as ultralytics turns "
                                 "them off; flip_idx names each keypoint's mirror image)")
        self.resized = resized_shapes(self.shapes, imgsz)
        # Rectangular batches of `rect_batch` images (ultralytics' rect): each
        # image's canvas is its batch's shape; batch with `self.batches`.
        self.batches = rect_batches(self.shapes, rect_batch, imgsz) if rect_batch and len(items) else []
        self.canvas = [(imgsz, imgsz)] * len(items)
        for indices, shape in self.batches:
            for i in indices:
                self.canvas[i] = shape
        self.mosaic = augment and not self.batches
        # Instance outlines, per image one per label row: read where copy_paste pastes by them or a warp
        # that rotates, shears or tilts boxes them (boxes of other warps are their outlines' boxes already).
        needed = hyp.copy_paste or hyp.degrees or hyp.shear or hyp.perspective
        self.segments, self.mask_ratio, self.overlap_mask, self.obb = segments, mask_ratio, overlap_mask, obb
        if segments:
            self.outlines = polygons_only(items, names_count)
        elif obb:
            self.outlines = obb_corners(items, names_count)
        else:
            self.outlines = self._outlines(items.outlines()) if augment and needed and not self.batches else None
        self.cache: ImageCache | None = None
        self.cache_built = False
        if cache != "none" and len(items):
            self._use_cache(cache, Path(cache_dir), cache_digest(items, imgsz))
        if any(self.counts.values()):
            self.problems.append(summary(self.counts))

    def _use_cache(self, kind: str, cache_dir: Path, digest: str) -> None:
        self.cache, self.cache_built = use_cache(kind, cache_dir, digest, self.paths, self.resized, self.problems)
        if self.cache is None:
            return
        # From the index, not from the build, so that every process (rank 0
        # too, whichever built it) reports the same problems.
        for i in np.flatnonzero(self.cache.index[:, 3] == 0):
            self.problems.append(f"{self.paths[i]}: corrupt image (cannot be decoded), trained as a blank image "
                                 "without labels")
            self.counts["corrupt images"] += 1

    def _outlines(self, rows: list[list[np.ndarray | None]]) -> list[list[np.ndarray]] | None:
        """Every label row's polygon (`rows`, read with the labels), or None
        where a row is a box: as in ultralytics, copy_paste then pastes
        nothing (a problem line says so) and warps move boxes as boxes."""
        boxes = sum(o is None for r in rows for o in r)
        if any(len(r) != len(lb) for r, lb in zip(rows, self.labels)):
            boxes = max(boxes, 1)
        if boxes or not any(rows):
            total = sum(map(len, self.labels))
            if self.hyp.copy_paste:
                self.problems.append(f"copy_paste {self.hyp.copy_paste:g}: {boxes} of {total} training labels are "
                                     "boxes, not instance outlines (polygons): nothing is pasted, as in ultralytics")
            return None
        return rows

    def keep_classes(self, classes) -> None:
        """Drop the label rows (and outlines, keypoints) of every class not in `classes`."""
        keep = [np.isin(lb[:, 0], classes) for lb in self.labels]
        if self.outlines is not None:
            self.outlines = [[o for o, k in zip(outs, mask) if k] for outs, mask in zip(self.outlines, keep)]
        if self.keypoints is not None:
            self.keypoints = [kp[mask] for kp, mask in zip(self.keypoints, keep)]
        self.labels = [lb[mask] for lb, mask in zip(self.labels, keep)]

    def _outlines_px(self, i: int, labels: np.ndarray, shape: tuple[int, int],
                     offset: tuple[int, int]) -> list[np.ndarray]:
        """Image i's outlines in pixels of its resized `shape` (h, w), shifted
        by `offset` (x, y); none where its loaded `labels` are not the rows
        they outline (an image that no longer decodes has no labels)."""
        if len(labels) != len(self.outlines[i]):
            return []
        scale = np.array([shape[1], shape[0]], np.float32)
        if self.segments:  # a segmentation's, resampled as ultralytics loads them: its masks rasterise alike
            return [resampled(o) * scale + offset for o in self.outlines[i]]
        if self.obb:  # an oriented box's corners, resampled as ultralytics loads them: their rectangles fit alike
            return [resampled(o, OBB_POINTS) * scale + offset for o in self.outlines[i]]
        return [o * scale + offset for o in self.outlines[i]]

    def _keypoints_px(self, i: int, labels: np.ndarray, shape: tuple[float, float],
                      offset: tuple[float, float]) -> np.ndarray | None:
        """Image i's keypoints [n, K, 3] in pixels of its resized `shape`
        (h, w), shifted by `offset` (x, y); None for a dataset without
        keypoints, none where its loaded `labels` are not their rows."""
        if self.keypoints is None:
            return None
        points = self.keypoints[i]
        if len(labels) != len(points):
            return np.zeros((0, self.kpt_shape[0], 3), np.float32)
        out = points.astype(np.float32, copy=True)
        out[..., 0] = out[..., 0] * shape[1] + offset[0]
        out[..., 1] = out[..., 1] * shape[0] + offset[1]
        return out

    def __len__(self) -> int:
        return len(self.paths)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def summary(self) -> str:
        return summary(self.counts)

    # -- loading

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(image resized so its long side is imgsz, normalised labels). An
        image that no longer decodes is a blank one without labels."""
        if self.cache is not None:
            img, ok = self.cache.get(i), self.cache.ok(i)
        else:
            img = decode_resized(self.paths[i], self.resized[i])
            ok = img is not None
        if not ok:
            return np.full((*self.resized[i], 3), PAD_VALUE, np.uint8), np.zeros((0, 5), np.float32)
        return img, self.labels[i]

    def meta(self, i: int) -> dict:
        """Geometry of the letterbox of item i: `orig = (letterboxed - pad) / ratio`,
        ratio and pad as (x, y). Exact for validation items; for augmented
        training items it describes the image before augmentation."""
        (h0, w0), (h, w) = self.shapes[i], self.resized[i]
        if self.batches:
            top, _, left, _ = centred_pad((h, w), self.canvas[i])
            pad = (left, top)
        else:
            pad = letterbox_pad((h, w), self.imgsz)
        return {"orig_shape": (h0, w0), "ratio": (w / w0, h / h0), "pad": pad}

    # -- items

    def __getitem__(self, i: int):
        return self._item(i, self._partners_any, self.load, self.epoch, self.mosaic,
                          torch.empty((3, *self.canvas[i]), dtype=torch.uint8))

    def __getitems__(self, indices: list[int]) -> list:
        """A whole batch: the DataLoader's fetcher calls this with what the
        batch sampler yields, a list of indices or an EpochBatch (whose epoch,
        mosaic setting and pool win over this copy's: see sampler.RunBatches).

        The images are written straight into one [B, 3, H, W] tensor, in
        shared memory in a loader worker, which `collate` passes on as the
        batch: no per-image tensor, no stacking copy.

        A mosaic's three partners come from the batch's pool (sampler.STREAM),
        whose images this process decodes once and holds while its pools use
        them (`_load_recent`): about one decode per mosaic, where partners
        from the whole dataset cost four."""
        epoch, mosaic = getattr(indices, "epoch", self.epoch), getattr(indices, "mosaic", self.mosaic)
        pool = getattr(indices, "pool", None) if POOL_PARTNERS else None
        indices = [int(i) for i in indices]
        shapes = {self.canvas[i] for i in indices}
        rows = batch_tensor(len(indices), shapes.pop()) if len(shapes) == 1 else None
        outs = [rows[k] if rows is not None else torch.empty((3, *self.canvas[i]), dtype=torch.uint8)
                for k, i in enumerate(indices)]
        if not (self.augment and mosaic and pool):
            return [self._item(i, self._partners_any, self.load, epoch, mosaic, out) for i, out in zip(indices, outs)]

        def partners(rng: np.random.Generator) -> list[int]:
            return [pool[k] for k in rng.integers(0, len(pool), size=3)]

        load = self.load if self.cache is not None else functools.partial(self._load_recent, len(pool))
        return [self._item(i, partners, load, epoch, mosaic, out) for i, out in zip(indices, outs)]

    def _partners_any(self, rng: np.random.Generator) -> list[int]:
        return [int(j) for j in rng.integers(0, len(self), size=3)]

    def _load_recent(self, pool_size: int, i: int) -> tuple[np.ndarray, np.ndarray]:
        """load(i), kept while the pools in use hold it: first in, first
        out, as many images as this process's share of the pools needs (the
        STREAM / workers streams it serves, a pool each) within its share of
        RECENT_BYTES. Kept images are read-only: no augmentation
        may change what a later mosaic reads."""
        recent = self.__dict__.setdefault("_recent", OrderedDict())
        if i in recent:
            return recent[i]
        img, labels = self.load(i)
        img.flags.writeable = False
        recent[i] = img, labels
        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info is not None else 1
        keep, budget = -(-STREAM // workers) * pool_size, RECENT_BYTES // workers
        held = self.__dict__.get("_recent_bytes", 0) + img.nbytes
        while len(recent) > keep or held > budget and len(recent) > 1:
            held -= recent.popitem(last=False)[1][0].nbytes
        self._recent_bytes = held
        return img, labels

    def __getstate__(self) -> dict:
        """A copy for a loader worker: without this process's recent images."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_recent", "_recent_bytes")}

    def _item(self, i: int, partners, load, epoch: int, mosaic: bool, out: torch.Tensor):
        """Item i with its image written into `out` (uint8 [3, H, W] of its
        canvas). With `hsv_on_device`, its meta carries the HSV gains
        (`meta["hsv"]`) that the trainer applies (photometric.hsv_jitter_batch)."""
        meta = self.meta(i)
        if self.augment:
            # The only source of randomness: a resumed run, any worker count,
            # any global seed state give the same item (in the same batch).
            rng = np.random.default_rng((self.seed, epoch, i))
            img, boxes, gains, outlines, points = self._train_sample(i, rng, partners, load, mosaic)
            if self.hsv_on_device:
                meta["hsv"] = None if gains is None else tuple(float(g) for g in gains)
        else:
            img, boxes, outlines, points = self._val_sample(i)
        labels = to_normalised(boxes, img.shape[:2])
        to_planes(img, out.numpy())
        if points is not None:  # as ultralytics' Format: x, y as fractions of the image
            points = points / np.array([img.shape[1], img.shape[0], 1.0], np.float32)
            return out, (torch.from_numpy(labels), torch.from_numpy(points.astype(np.float32))), \
                str(self.paths[i]), meta
        if self.obb:
            return out, torch.from_numpy(rotated_rows(labels[:, 0], outlines, img.shape[:2])), str(self.paths[i]), meta
        if self.segments:
            return out, self._with_masks(labels, outlines, img.shape[:2]), str(self.paths[i]), meta
        return out, torch.from_numpy(labels), str(self.paths[i]), meta

    def _with_masks(self, labels: np.ndarray, outlines: list[np.ndarray],
                    hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, masks) of a segmentation item: see the class's docstring."""
        if self.overlap_mask:
            masks, order = overlap_masks(hw, outlines, self.mask_ratio)
            return torch.from_numpy(labels[order]), torch.from_numpy(masks)
        return torch.from_numpy(labels), torch.from_numpy(instance_masks(hw, outlines, self.mask_ratio))

    def _val_sample(self, i: int, load=None
                    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray] | None, np.ndarray | None]:
        """(image letterboxed, boxes in its pixels, their outlines there where
        the dataset has outlines, else None, their keypoints there where it
        has keypoints, else None)."""
        img, labels = (load or self.load)(i)
        if self.batches:
            canvas, gain, pad = letterbox_to(img, self.canvas[i])
        else:
            (canvas, pad), gain = letterbox(img, self.imgsz), 1.0
        h, w = img.shape[:2]
        outlines = None if self.outlines is None else self._outlines_px(i, labels, (h * gain, w * gain), pad)
        return canvas, to_pixel_boxes(labels, img.shape[:2], pad), outlines, \
            self._keypoints_px(i, labels, (h * gain, w * gain), pad)

    def _train_sample(self, i: int, rng: np.random.Generator, partners, load, mosaic: bool
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, list[np.ndarray] | None,
                                 np.ndarray | None]:
        """(image, boxes, HSV gains left for the device or None, the boxes'
        outlines where the dataset has them (a segmentation's), else None,
        their keypoints where it has them, else None).
        `partners(rng)`: the three other images of a mosaic; `load(j)`: image j."""
        if self.batches:  # rectangular: mosaic and the affine warp would make a square image
            img, boxes, outlines, points = self._val_sample(i, load)
        else:
            img, boxes, outlines, points = self._warped(i, rng, partners, load, mosaic)
            # Copy-Paste's mode mixup, as ultralytics: after the warp, from a second sample made the same way.
            if mosaic and self.hyp.copy_paste and self.hyp.copy_paste_mode == "mixup" and self.outlines is not None \
                    and len(boxes):
                source, source_boxes, source_outlines, _ = self._warped(partners(rng)[0], rng, partners, load, mosaic)
                if source_outlines is not None:
                    img, chosen = copy_paste(img, boxes, source, source_boxes, source_outlines, self.hyp.copy_paste)
                    boxes = np.concatenate([boxes, source_boxes[chosen]])
                    outlines = joined(outlines, [source_outlines[j] for j in chosen])
            # MixUp, as ultralytics: while mosaics are on, with a second sample made the same way.
            if mosaic and self.hyp.mixup and rng.random() < self.hyp.mixup:
                other, other_boxes, other_outlines, other_points = self._warped(partners(rng)[0], rng, partners,
                                                                                load, mosaic)
                img, boxes = mix((img, boxes), (other, other_boxes), rng)
                outlines = joined(outlines, other_outlines)
                points = None if points is None else np.concatenate([points, other_points])
            if mosaic and self.hyp.cutmix and rng.random() < self.hyp.cutmix:  # then CutMix, likewise
                other, other_boxes, other_outlines, other_points = self._warped(partners(rng)[0], rng, partners,
                                                                                load, mosaic)
                if self.segments or self.obb:  # as ultralytics: instances that show 1% of their box, cut to the patch
                    img, boxes, rect, shown = cut_mix_patch((img, boxes), (other, other_boxes), rng, min_visible=0.01)
                    if len(shown):
                        outlines = joined(outlines, [cut_outline(other_outlines[j], rect, self.obb) for j in shown])
                elif points is not None:  # as ultralytics: keypoints clipped to the patch, those outside unlabelled
                    img, boxes, rect, shown = cut_mix_patch((img, boxes), (other, other_boxes), rng)
                    if len(shown):
                        x1, y1, x2, y2 = rect
                        cut = clip_keypoints(shifted(other_points[shown], -x1, -y1), x2 - x1, y2 - y1)
                        points = np.concatenate([points, shifted(cut, x1, y1)])
                else:
                    img, boxes = cut_mix((img, boxes), (other, other_boxes), rng)
        # The same draws either way, so a run's flips and boxes do not depend
        # on where its colours change (per pixel: it commutes with the flip).
        gains = hsv_gains(self.hyp, rng)
        if gains is not None and not self.hsv_on_device:
            img, gains = apply_hsv(img, gains), None
        # As ultralytics: up-down, then left-right, then the channel swap. A
        # strength of 0 draws nothing, so that a run without it draws as before.
        if self.hyp.flipud and rng.random() < self.hyp.flipud:
            img, boxes = flip_ud(img, boxes)
            outlines = None if outlines is None else [np.column_stack([o[:, 0], img.shape[0] - o[:, 1]])
                                                      for o in outlines]
            points = None if points is None else flip_keypoints(points, img.shape[0], self.flip_idx, 1)
        if rng.random() < self.hyp.fliplr:
            img, boxes = flip_lr(img, boxes)
            outlines = None if outlines is None else [np.column_stack([img.shape[1] - o[:, 0], o[:, 1]])
                                                      for o in outlines]
            points = None if points is None else flip_keypoints(points, img.shape[1], self.flip_idx, 0)
        if self.hyp.bgr and rng.random() < self.hyp.bgr:
            img = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
        return img, boxes, gains, outlines, points

    def _warped(self, i: int, rng: np.random.Generator, partners, load,
                mosaic: bool) -> tuple[np.ndarray, np.ndarray, list[np.ndarray] | None, np.ndarray | None]:
        """Image i in a mosaic (with probability hyp.mosaic, while mosaics
        are on), else alone, randomly warped; with its boxes' outlines warped
        where the dataset has them (else None). Copy-Paste's mode flip pastes
        before the warp, while mosaics are on (ultralytics' close_mosaic ends it too)."""
        paste = mosaic and bool(self.hyp.copy_paste) and self.hyp.copy_paste_mode == "flip"
        if mosaic and rng.random() < self.hyp.mosaic:
            return self._mosaic([i, *partners(rng)], load, rng, paste)
        img, boxes, outlines, points = self._val_sample(i, load)
        if outlines is not None:
            if len(outlines) != len(boxes):
                outlines = None
            elif paste and len(boxes):  # as in ultralytics, pasted before the warp
                img, pasted, pasted_outlines = copy_paste_flip(img, boxes, outlines, self.hyp.copy_paste)
                boxes, outlines = np.concatenate([boxes, pasted]), outlines + pasted_outlines
        return random_affine(img, boxes, box_areas(boxes), self.imgsz, self.hyp, rng, outlines, self.obb, points)

    def _mosaic(self, indices: list[int], load, rng: np.random.Generator,
                paste: bool) -> tuple[np.ndarray, np.ndarray, list[np.ndarray] | None, np.ndarray | None]:
        """Mosaic of four images, warped at once (mosaic_affine)."""
        loaded = [load(j) for j in indices]
        images = [img for img, _ in loaded]
        boxes = [to_pixel_boxes(labels, img.shape[:2], (0, 0)) for img, labels in loaded]
        outlines = None if self.outlines is None else \
            [self._outlines_px(j, labels, img.shape[:2], (0, 0)) for j, (img, labels) in zip(indices, loaded)]
        if outlines is not None and any(len(o) != len(b) for o, b in zip(outlines, boxes)):
            outlines = None
        points = None if self.keypoints is None else \
            [self._keypoints_px(j, labels, img.shape[:2], (0, 0)) for j, (img, labels) in zip(indices, loaded)]
        return mosaic_affine(images, boxes, self.imgsz, self.hyp, rng, outlines, paste, self.obb, points)


def joined(outlines: list[np.ndarray] | None, more: list[np.ndarray] | None) -> list[np.ndarray] | None:
    """A sample's outlines and another's pasted or mixed in; None (no
    outlines to follow the boxes) where either is None."""
    return None if outlines is None or more is None else outlines + more


def pose_keypoints(items: Kept, problems: list[str], kpt_shape: tuple[int, int]) -> list[np.ndarray]:
    """Every kept image's keypoints (float32 [n, K, 3]), for the keypoint
    task; the first row that did not read as kpt_shape says (its problem
    line, among `problems`) is refused in one line naming its file and line."""
    bad = next((p for p in problems if f": {MALFORMED_POSE_ROW} (" in p), None)
    if bad is not None:
        raise HpcyoloError(bad)
    if items.keypoints is None:
        return [np.zeros((len(lb), kpt_shape[0], 3), np.float32) for lb in items.labels]
    return items.keypoints


def polygons_only(items: Kept, nc: int) -> list[list[np.ndarray]]:
    """Every label row's polygon, for a segmentation; a box row is refused
    in one line naming its file and line (a segmenter learns masks from outlines)."""
    rows = items.outlines()
    for path, outlines in zip(items.paths, rows):
        for k, outline in enumerate(outlines):
            if outline is None:
                raise HpcyoloError(f"{label_path(path)}:{_line_of_row(label_path(path), k, nc)}: a box (class cx cy w "
                                   "h) where train.task segment needs a polygon (class x1 y1 x2 y2 x3 y3 ...) on "
                                   "every line")
    return rows


def obb_corners(items: Kept, nc: int) -> list[list[np.ndarray]]:
    """Every label row's four corners (4, 2), for oriented boxes; a row of
    other than 8 coordinates, or whose corners enclose no area (a rectangle
    of zero width), is refused in one line naming its file and line
    (ultralytics reads any polygon as an OBB's corners and fits a rectangle
    to it; a box row or a segment here is a dataset for another task)."""
    rows = items.outlines()
    for path, outlines in zip(items.paths, rows):
        for k, corners in enumerate(outlines):
            where = f"{label_path(path)}:{_line_of_row(label_path(path), k, nc)}"
            count = 4 if corners is None else 2 * len(corners)
            if count != 8:
                raise HpcyoloError(f"{where}: {count} coordinates where train.task obb needs an oriented box's "
                                   "four corners (class x1 y1 x2 y2 x3 y3 x4 y4) on every line")
            _, _, w, h, _ = xyxyxyxy2xywhr(corners[None])[0]
            if min(w, h) <= 0:
                raise HpcyoloError(f"{where}: a degenerate oriented box (its corners enclose no area)")
    return rows


def rotated_rows(cls: np.ndarray, corners: list[np.ndarray], hw: tuple[int, int]) -> np.ndarray:
    """An OBB item's labels [n, 6]: class, then each outline's minimum-area
    rectangle (cx, cy, w, h, r) with cx, w divided by the image's width and
    cy, h by its height, as ultralytics' Format(return_obb=True)."""
    out = np.zeros((len(cls), 6), np.float32)
    if len(cls):
        out[:, 0] = cls
        out[:, 1:] = xyxyxyxy2xywhr(np.stack(corners))
        out[:, [1, 3]] /= hw[1]
        out[:, [2, 4]] /= hw[0]
    return out


def _line_of_row(path: Path, row: int, nc: int) -> int:
    """The line number of label row `row` (counted from 0 among the rows
    read_label_file keeps) of the file `path`."""
    kept = -1
    for number, line in enumerate(path.read_bytes().decode("utf-8", errors="replace").splitlines(), start=1):
        if line.strip() and not isinstance(parse_label_row(line, nc), str):
            kept += 1
            if kept == row:
                return number
    return 0


def batch_tensor(count: int, shape: tuple[int, int]) -> torch.Tensor:
    """uint8 [count, 3, H, W] for a batch's images. In a DataLoader worker it
    is allocated in shared memory, as default_collate allocates a stacked
    batch there: the main process receives it without a copy."""
    size = (count, 3, *shape)
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(size, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(math.prod(size))
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, size)


def to_planes(img: np.ndarray, out: np.ndarray) -> None:
    """HxWx3 image -> the 3xHxW array `out`: OpenCV's split writes each
    channel plane in place, 3x faster than numpy's transposing copy."""
    planes = [out[0], out[1], out[2]]
    written = cv2.split(img, planes)
    if written[0].ctypes.data != out[0].ctypes.data:  # OpenCV allocated instead (it should not)
        out[:] = np.stack(written)


def _rows_of_one_tensor(imgs) -> torch.Tensor | None:
    """The [B, 3, H, W] tensor whose rows, in order, are `imgs`
    (YoloDataset.__getitems__ wrote them there), or None."""
    first = imgs[0]
    storage, step = first.untyped_storage(), first.numel()
    if first.storage_offset() or storage.nbytes() != step * len(imgs):
        return None
    if any(im.untyped_storage().data_ptr() != storage.data_ptr() or im.storage_offset() != k * step
           or im.shape != first.shape or not im.is_contiguous() for k, im in enumerate(imgs)):
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (len(imgs), *first.shape))


def collate(batch):
    """-> (imgs uint8 [B, 3, H, W], targets float32 [M, 6] = (index in batch,
    cls, cx, cy, w, h), paths, metas); a segmentation's targets are
    (targets, masks): masks [B, h, w] (one overlap map per image) or [M, h, w];
    a keypoint dataset's (targets, keypoints [M, K, 3])."""
    imgs, labels, paths, metas = zip(*batch)
    masks = None
    if labels and isinstance(labels[0], tuple):
        labels, masks = zip(*labels)
        if masks[0].dim() == 3 and masks[0].dtype == torch.float32:  # keypoints, one [K, 3] per row
            targets = [torch.cat((torch.full((len(lb), 1), float(k)), lb), dim=1) for k, lb in enumerate(labels)]
            stacked = _rows_of_one_tensor(imgs)
            stacked = default_collate(list(imgs)) if stacked is None else stacked
            return stacked, (torch.cat(targets), torch.cat(masks)), list(paths), list(metas)
    targets = [torch.cat((torch.full((len(lb), 1), float(k)), lb), dim=1) for k, lb in enumerate(labels)]
    stacked = _rows_of_one_tensor(imgs)
    if stacked is None:
        # default_collate stacks into shared memory in a loader worker; a
        # batch stacked in private memory would be copied again to be sent.
        stacked = default_collate(list(imgs))
    targets = torch.cat(targets) if targets else torch.zeros((0, 6))
    if masks is None:
        return stacked, targets, list(paths), list(metas)
    wide = {m.dtype for m in masks} != {torch.uint8}  # an image of over 255 instances: its map is int32
    masks = [m.to(torch.int32) if wide else m for m in masks]
    masks = torch.stack(masks) if masks[0].dim() == 2 else torch.cat(masks)
    return stacked, (targets, masks), list(paths), list(metas)


def keep_freed_memory() -> None:
    """For loader workers: let glibc's malloc keep and reuse the memory of
    freed image buffers instead of handing it back to the kernel after every
    sample (mmap threshold 32 MiB, its maximum; trim threshold 128 MiB). Each
    sample allocates and frees several megabyte-sized arrays; faulting their
    pages in again each time cost about a quarter of the loader's CPU time
    (benchmarks/bench_loader.py: 107 -> 140 images/s per core). A worker keeps
    at most the trim threshold beyond what it uses. No-op off glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD


def cache_bytes(dataset: YoloDataset) -> int:
    """Bytes of the dataset's shared image cache (0 without one): the node
    holds this once however many processes map it."""
    return dataset.cache.nbytes if dataset.cache is not None else 0
