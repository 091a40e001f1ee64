"""Detection data: data YAML forms, label parsing and bad-file handling, boxes
that move with the pixels under every augmentation, determinism for exact
resume, and the one-per-node image cache."""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import os
import pickle
import shutil
import stat
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import hpcyolo_trainer.data.dataset as data_module
from hpcyolo_trainer.data.augment import mosaic4, mosaic_affine, random_affine
from hpcyolo_trainer.data.dataset import (AugmentHyp, YoloDataset, cache_bytes, collate, label_path,
                                            load_data_spec, parse_label_row)
from hpcyolo_trainer.common.datayaml import IMG_EXTS, ImagePaths, texts
from hpcyolo_trainer.common.errors import ConfigError
from hpcyolo_trainer.data.sampler import EpochBatch, EvenShardSampler, RunBatches

COCO8 = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "coco8"

# Synthetic images: solid rectangles of distinct colours (class k has colour
# COLOURS[k]) on a dark background, well inside the image and apart from each
# other, saved as PNG so the colours are exact.
COLOURS = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]
BACKGROUND = (40, 40, 40)
RECTS = [(20, 20, 100, 90), (130, 40, 200, 140), (220, 120, 300, 220)]  # x1, y1, x2, y2 on 320 x 240
IMGSZ = 160
NO_COLOUR = dict(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)


def write_image(path: Path, img_rgb: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(img_rgb, cv2.COLOR_RGB2BGR))


def write_labels(image: Path, text: str) -> None:
    path = label_path(image)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_rect_image(path: Path, classes: list[int], w: int = 320, h: int = 240) -> None:
    img = np.full((h, w, 3), BACKGROUND, np.uint8)
    rows = []
    for cls, (x1, y1, x2, y2) in zip(classes, RECTS):
        img[y1:y2, x1:x2] = COLOURS[cls]
        rows.append(f"{cls} {(x1 + x2) / 2 / w} {(y1 + y2) / 2 / h} {(x2 - x1) / w} {(y2 - y1) / h}")
    write_image(path, img)
    write_labels(path, "\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def rects(tmp_path_factory) -> list[Path]:
    """Four images, three rectangles each, twelve classes in all."""
    root = tmp_path_factory.mktemp("rects")
    files = [root / "images" / f"{k}.png" for k in range(4)]
    for k, f in enumerate(files):
        make_rect_image(f, [3 * k, 3 * k + 1, 3 * k + 2])
    return files


def rect_dataset(files, *, augment=True, **hyp) -> YoloDataset:
    ds = YoloDataset(files, IMGSZ, augment=augment, hyp=AugmentHyp(**hyp), seed=7, names_count=len(COLOURS))
    assert len(ds) == len(files) and ds.problems == []
    return ds


def colour_mask(img: np.ndarray, cls: int) -> np.ndarray:
    return np.abs(img.astype(int) - COLOURS[cls]).max(axis=-1) <= 12


def check_boxes_follow_pixels(img_t: torch.Tensor, labels: torch.Tensor) -> int:
    """Inside each box the pixels are (mostly) its class's colour, just
    outside it they are not; every clearly visible rectangle has a box.
    Returns how many boxes were big enough to judge."""
    img = img_t.permute(1, 2, 0).numpy()
    size = img.shape[0]
    judged = 0
    for cls, cx, cy, w, h in labels.tolist():
        x1, y1, x2, y2 = ((cx - w / 2) * size, (cy - h / 2) * size, (cx + w / 2) * size, (cy + h / 2) * size)
        mask = colour_mask(img, int(cls))
        inner = mask[math.ceil(y1) + 2:math.floor(y2) - 2, math.ceil(x1) + 2:math.floor(x2) - 2]
        if inner.size < 16:
            continue
        assert inner.mean() > 0.9, f"class {cls}: box at {x1:.0f},{y1:.0f},{x2:.0f},{y2:.0f} is not on its rectangle"
        ring = ring_pixels(mask, x1, y1, x2, y2, near=2, far=5)
        assert ring.size == 0 or ring.mean() < 0.1, f"class {cls}: rectangle extends beyond its box"
        judged += 1
    present = {int(c) for c in labels[:, 0].tolist()}
    for cls in range(len(COLOURS)):
        # 600 px is more than 10 % of any rectangle at the largest scale, so
        # the augmentation must not have dropped its box.
        if colour_mask(img, cls).sum() >= 600:
            assert cls in present, f"class {cls} is clearly visible but has no box"
    return judged


def ring_pixels(mask: np.ndarray, x1, y1, x2, y2, near: int, far: int) -> np.ndarray:
    """Mask values in the band between `near` and `far` pixels outside the box."""
    size = mask.shape[0]
    outer = np.zeros_like(mask)
    outer[max(0, math.floor(y1) - far):math.ceil(y2) + far, max(0, math.floor(x1) - far):math.ceil(x2) + far] = True
    outer[max(0, math.floor(y1) - near):math.ceil(y2) + near,
          max(0, math.floor(x1) - near):math.ceil(x2) + near] = False
    return mask[outer[:size, :size]]


# == the data YAML =============================================================

def small_dataset(root: Path) -> None:
    for split, n in (("train", 2), ("val", 1), ("extra", 1)):
        for k in range(n):
            make_rect_image(root / "images" / split / f"{split}{k}.png", [0, 1, 2])


def test_yaml_forms_dir_list_file_and_list_of_dirs(tmp_path):
    small_dataset(tmp_path / "ds")
    (tmp_path / "ds" / "train.txt").write_text(
        f"images/train/train0.png\n\n{tmp_path / 'ds' / 'images' / 'train' / 'train1.png'}\nnotes.md\n")
    yaml = tmp_path / "cfg" / "data.yaml"
    yaml.parent.mkdir()
    yaml.write_text("path: ../ds\ntrain: train.txt\nval: [images/val, images/extra]\ntest: images/val\n"
                    "names: {0: a, 1: b, 2: c}\n")
    spec = load_data_spec(yaml)
    assert spec.root == (tmp_path / "ds").resolve() and spec.names == ["a", "b", "c"]
    assert [p.name for p in spec.train] == ["train0.png", "train1.png"]
    assert [p.name for p in spec.val] == ["val0.png", "extra0.png"]
    assert [p.name for p in spec.test] == ["val0.png"]

    yaml.write_text("path: ../ds\ntrain: images/train\nval: images/val\nnames: [a, b, c]\n")
    spec = load_data_spec(yaml)
    assert len(spec.train) == 2 and spec.test is None and spec.names == ["a", "b", "c"]


def test_a_split_is_the_text_of_the_paths_rglob_finds_in_their_order(tmp_path):
    """The split's images as ImagePaths: each one's text is str of its Path
    (what the index, the stats and the cache digest read), and the images
    are those `rglob` finds, sorted as Paths sort, in nested folders too."""
    small_dataset(tmp_path / "ds")
    nested = tmp_path / "ds" / "images" / "train" / "b-sub" / "deeper"
    nested.mkdir(parents=True)
    for name in ("z.jpg", "a.PNG", "notes.txt"):
        (nested / name).write_bytes((tmp_path / "ds" / "images" / "train" / "train0.png").read_bytes())
    (tmp_path / "ds" / "data.yaml").write_text("train: images/train\nval: [images/val, images/extra]\nnames: [a]\n")
    spec = load_data_spec(tmp_path / "ds" / "data.yaml")
    assert isinstance(spec.train, ImagePaths)
    found = sorted(p for p in (spec.root / "images" / "train").rglob("*") if p.suffix.lower() in IMG_EXTS)
    assert list(spec.train) == found and spec.train == found and len(found) == 4
    assert spec.train.strings == [str(p) for p in found] == texts(found)
    assert spec.train[1] == found[1] and spec.train[1:3] == found[1:3]
    assert spec.train.take([3, 0]) == [found[3], found[0]]
    assert spec.val == [spec.root / "images" / "val" / "val0.png", spec.root / "images" / "extra" / "extra0.png"]
    assert pickle.loads(pickle.dumps(spec.train)) == spec.train  # loader workers get the dataset pickled
    assert texts(["a//b.jpg", Path("c/./d.jpg")]) == ["a/b.jpg", "c/d.jpg"]  # as their Paths give them


@pytest.mark.parametrize("body, key", [
    ("train: images/train\nnames: [a]\n", "val"),
    ("train: images/nope\nval: images/val\nnames: [a]\n", "train"),
    ("train: images/train\nval: missing.txt\nnames: [a]\n", "val"),
    ("train: images/train\nval: images/val\nnames: {0: a, 2: b}\n", "names"),
])
def test_yaml_mistakes_name_the_file_and_key(tmp_path, body, key):
    small_dataset(tmp_path)
    yaml = tmp_path / "data.yaml"
    yaml.write_text(body)
    with pytest.raises(ConfigError, match=f"^{str(yaml)}: {key}: "):
        load_data_spec(yaml)


def test_coco8_loads():
    spec = load_data_spec(COCO8 / "coco8.yaml")
    assert (len(spec.train), len(spec.val), len(spec.names)) == (4, 4, 80)
    assert spec.root == COCO8.resolve() and spec.test is None
    ds = YoloDataset(spec.val, 320, augment=False, hyp=AugmentHyp(), seed=0, names_count=80)
    assert len(ds) == 4 and ds.problems == []
    imgs, targets, paths, metas = collate([ds[i] for i in range(len(ds))])
    assert imgs.shape == (4, 3, 320, 320) and imgs.dtype == torch.uint8
    assert targets.shape[1] == 6 and targets.dtype == torch.float32 and len(targets) == 17
    assert set(targets[:, 0].tolist()) == {0, 1, 2, 3} and metas[0]["orig_shape"] == (640, 481)  # h, w


# == labels and bad files ====================================================

def test_polygon_row_becomes_its_bounding_box():
    row = parse_label_row("3 0.1 0.1 0.5 0.12 0.45 0.4 0.12 0.38", nc=5)
    np.testing.assert_allclose(row, [3, 0.3, 0.25, 0.4, 0.3], atol=1e-6)
    np.testing.assert_allclose(parse_label_row("1 0.5 0.5 1.005 0.2", nc=5), [1, 0.5, 0.5, 1.0, 0.2], atol=1e-6)


def test_malformed_lines_and_corrupt_images_are_skipped_with_messages(tmp_path):
    good, background, unlabelled = (tmp_path / "images" / f"{n}.png" for n in ("good", "bg", "nolabel"))
    make_rect_image(good, [0, 1, 2])
    make_rect_image(background, [0, 1, 2])
    write_labels(background, "")  # empty file: background
    make_rect_image(unlabelled, [0])
    label_path(unlabelled).unlink()  # missing file: background
    write_labels(good, "0 0.5 0.5 0.2 0.2\nabc 0.5 0.5 0.1 0.1\n0 0.5 0.5 0.1\n\n99 0.5 0.5 0.1 0.1\n"
                       "1 1.5 0.5 0.1 0.1\n2 0.1 0.1 0.3 0.1 0.3 0.3 0.1 0.3\n")
    garbage = tmp_path / "images" / "garbage.jpg"
    garbage.write_bytes(b"\x00not an image" * 50)
    truncated = tmp_path / "images" / "truncated.jpg"
    cv2.imwrite(str(truncated), np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    truncated.write_bytes(truncated.read_bytes()[:600])

    ds = YoloDataset([good, garbage, background, truncated, unlabelled], 64, augment=False, hyp=AugmentHyp(),
                     seed=0, names_count=3)
    assert [p.name for p in ds.paths] == ["good.png", "bg.png", "nolabel.png"]
    assert ds.counts["corrupt images"] == 2 and ds.counts["malformed label lines"] == 4
    lines = [p for p in ds.problems if "malformed label line skipped" in p]
    assert [p.split(":")[1] for p in lines] == ["2", "3", "5", "6"]
    assert all(p.startswith(str(label_path(good))) for p in lines)
    assert sum("garbage.jpg" in p for p in ds.problems) == 1 and sum("truncated.jpg" in p for p in ds.problems) == 1
    assert ds.problems[-1] == "skipped 2 corrupt images, 4 malformed label lines" == ds.summary()
    assert ds[0][1].tolist()[0] == pytest.approx([0, 0.5, 0.5, 0.2, 0.15])  # 4:3 letterboxed and len(ds[0][1]) == 2
    assert ds[1][1].shape == (0, 5) and ds[2][1].shape == (0, 5)


def test_exif_rotation_is_applied_to_shape_and_pixels(tmp_path):
    from PIL import Image

    path = tmp_path / "images" / "rotated.jpg"
    path.parent.mkdir()
    im = Image.fromarray(np.zeros((20, 40, 3), np.uint8))  # 40 wide, 20 high as stored
    exif = im.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees to display": 20 wide, 40 high
    im.save(path, exif=exif)
    ds = YoloDataset([path], 40, augment=False, hyp=AugmentHyp(), seed=0, names_count=1)
    assert ds.shapes == [(40, 20)] and ds.load(0)[0].shape == (40, 20, 3)


def test_image_that_stops_decoding_is_blank_without_labels(rects, tmp_path, monkeypatch):
    files = [shutil.copy(f, tmp_path / f.name) for f in rects[:2]]
    for f, src in zip(files, rects):
        shutil.copy(label_path(src), tmp_path / Path(f).with_suffix(".txt").name)
    plain = YoloDataset(files, 64, augment=False, hyp=AugmentHyp(), seed=0, names_count=12)
    assert len(plain[1][1]) == 3
    Path(files[1]).write_bytes(b"gone")  # changed after the check: no crash
    img, labels, _, _ = plain[1]
    assert (img == 114).all() and labels.shape == (0, 5)

    import hpcyolo_trainer.data.dataset as data
    decode = data.decode_resized
    monkeypatch.setattr(data, "decode_resized", lambda p, shape: None if p == Path(files[0]) else decode(p, shape))
    cached = YoloDataset(files[:1], 64, augment=False, hyp=AugmentHyp(), seed=1, cache="disk",
                         cache_dir=tmp_path / "c", names_count=12)
    assert cached.counts["corrupt images"] == 1 and "cannot be decoded" in cached.problems[0]
    assert (cached[0][0] == 114).all() and cached[0][1].shape == (0, 5)


# == boxes move with the pixels ==============================================

def test_letterbox_boxes_and_meta(rects):
    ds = rect_dataset(rects, augment=False)
    for i in range(len(ds)):
        img, labels, _, meta = ds[i]
        assert check_boxes_follow_pixels(img, labels) == 3
        assert meta["orig_shape"] == (240, 320) and meta["pad"] == (0, 20)
        assert (img[:, :20] == 114).all() and (img[:, -20:] == 114).all()
        # back to the original image through ratio and pad
        cls, cx, cy, w, h = labels[0].tolist()
        x1 = ((cx - w / 2) * IMGSZ - meta["pad"][0]) / meta["ratio"][0]
        y2 = ((cy + h / 2) * IMGSZ - meta["pad"][1]) / meta["ratio"][1]
        assert (x1, y2) == pytest.approx((RECTS[0][0], RECTS[0][3]), abs=1e-3)


def test_flip_mirrors_pixels_and_boxes(rects):
    val = rect_dataset(rects, augment=False)
    flip = rect_dataset(rects, mosaic=0.0, translate=0.0, scale=0.0, fliplr=1.0, **NO_COLOUR)
    for i in range(len(val)):
        (img, labels, _, _), (vimg, vlabels, _, _) = flip[i], val[i]
        assert torch.equal(img, vimg.flip(-1))
        expected = vlabels.clone()
        expected[:, 1] = 1 - vlabels[:, 1]
        assert torch.allclose(labels, expected, atol=1e-6)  # not torch.testing: it imports torch.distributed (seconds)
        assert check_boxes_follow_pixels(img, labels) == 3


def test_affine_scale_translate_moves_boxes_with_pixels(rects):
    ds = rect_dataset(rects, mosaic=0.0, translate=0.2, scale=0.5, fliplr=0.0, **NO_COLOUR)
    judged = 0
    for epoch in range(6):
        ds.set_epoch(epoch)
        judged += sum(check_boxes_follow_pixels(*ds[i][:2]) for i in range(len(ds)))
    assert judged >= 40


def test_mosaic_moves_boxes_with_pixels(rects):
    ds = rect_dataset(rects, **NO_COLOUR)
    judged, kinds = 0, set()
    for epoch in range(8):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            img, labels, _, _ = ds[i]
            judged += check_boxes_follow_pixels(img, labels)
            kinds.add(len({int(c) // 3 for c in labels[:, 0].tolist()}))
    assert judged >= 60 and max(kinds) >= 3  # boxes from several images in one sample


def test_mosaic_without_canvas_matches_canvas_then_warp():
    """mosaic_affine (parts resized straight onto the output) against mosaic4
    + random_affine (the 2*size canvas warped): same draws, the same picture up
    to sub-pixel rounding at the parts' edges, boxes within a pixel."""
    rng = np.random.default_rng(0)
    shapes = [(120, 160), (160, 120), (107, 160), (160, 160)]
    for t in range(20):
        images, boxes = [], []
        for h, w in (shapes[(t + k) % 4] for k in range(4)):
            yy, xx = np.mgrid[0:h, 0:w]
            img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (w + h)], -1).astype(np.uint8)
            rows = []
            for _ in range(4):
                x1, y1 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
                x2, y2 = min(x1 + int(rng.integers(8, 60)), w), min(y1 + int(rng.integers(8, 60)), h)
                cv2.rectangle(img, (x1, y1), (x2 - 1, y2 - 1), (255, 0, 255), -1)
                rows.append([0, x1, y1, x2, y2])
            images.append(img)
            boxes.append(np.array(rows, np.float32))
        hyp = AugmentHyp()
        r = np.random.default_rng((1, t))
        canvas, placed, areas = mosaic4(images, boxes, IMGSZ, r)
        want, want_boxes, _, _ = random_affine(canvas, placed, areas, IMGSZ, hyp, r)
        got, got_boxes, none, _ = mosaic_affine(images, boxes, IMGSZ, hyp, np.random.default_rng((1, t)))
        diff = np.abs(want.astype(int) - got.astype(int))
        assert diff.mean() < 2 and (diff > 40).mean() < 0.02
        assert len(got_boxes) == len(want_boxes) and np.abs(got_boxes - want_boxes).max(initial=0) < 1.5
        assert none is None
        # With outlines (here each box's rectangle), boxes from them: the same boxes, each with its outline.
        rects = [[b[[1, 2, 3, 2, 3, 4, 1, 4]].reshape(4, 2) for b in bxs] for bxs in boxes]
        _, outlined, outlines, _ = mosaic_affine(images, boxes, IMGSZ, hyp, np.random.default_rng((1, t)), rects)
        np.testing.assert_allclose(outlined, got_boxes, atol=1e-3)
        assert len(outlines) == len(outlined)
        for box, outline in zip(outlined, outlines):  # within the rounding of the parts' edges
            inside = np.clip(outline, 0, IMGSZ)
            np.testing.assert_allclose([*inside.min(0), *inside.max(0)], box[1:], atol=1.0)


def test_a_plain_index_list_draws_mosaic_partners_from_the_whole_dataset(rects):
    """Without a pool (an index list, not the trainer's EpochBatch): a
    batch of two of the four images also shows the other two, as mosaic
    partners; the same batch of the same epoch is the same again."""
    ds = rect_dataset(rects, **NO_COLOUR)
    batch = [0, 1] * 4
    shown = set()
    for epoch in range(3):
        ds.set_epoch(epoch)
        items = ds.__getitems__(batch)
        assert sum(check_boxes_follow_pixels(img, labels) for img, labels, _, _ in items) >= 4
        shown |= {int(c) // 3 for _, labels, _, _ in items for c in labels[:, 0].tolist()}
    assert shown == {0, 1, 2, 3}
    assert torch.equal(collate(items)[0], collate(ds.__getitems__(batch))[0])  # same epoch, same batch


def run_order(n: int, batch: int, epochs: int) -> list[list[int]]:
    """Every batch of a run, epoch after epoch, from EvenShardSampler alone."""
    out = []
    for epoch in range(epochs):
        sampler = EvenShardSampler(n, 0, 1, seed=3)
        sampler.set_epoch(epoch)
        order = list(sampler)
        out += [order[k:k + batch] for k in range(0, len(order), batch)]
    return out


@pytest.mark.parametrize("batch", [4, 300])
def test_a_batchs_pool_is_the_images_of_its_streams_batches_around_it(batch):
    """Batch n of the run (over epochs) draws mosaic partners from the
    images of POOL_IMAGES // batch batches n + j STREAM around it (at the
    run's start, the first ones; later epochs' batches too, as their
    orders are fixed already). A resumed run's batches carry the pools the
    whole run's had."""
    from hpcyolo_trainer.data.sampler import POOL_IMAGES, STREAM

    n, epochs = (40, 7) if batch == 4 else (600, 9)
    depth = POOL_IMAGES // batch
    per = math.ceil(n / batch)
    flat = run_order(n, batch, epochs + math.ceil(depth * STREAM / per))
    whole = list(RunBatches(EvenShardSampler(n, 0, 1, seed=3), batch, 0, 0, epochs, epochs))
    assert [list(b) for b in whole] == flat[:epochs * per]
    for m, got in enumerate(whole):
        first = max(m - depth // 2 * STREAM, m % STREAM)
        assert got.pool == [i for j in range(depth) for i in flat[first + j * STREAM]]
        assert len(got.pool) == min(POOL_IMAGES, depth * batch)
    assert set(whole[0].pool) > set(whole[0])  # the first batch's pool reaches forward
    resumed = list(RunBatches(EvenShardSampler(n, 0, 1, seed=3), batch, 1, batch, epochs, epochs))
    assert [(list(b), b.pool) for b in resumed] == [(list(b), b.pool) for b in whole[per + 1:]]
    closed = list(RunBatches(EvenShardSampler(n, 0, 1, seed=3), batch, 0, 0, epochs, mosaic_until=1))
    assert all(b.pool is None for b in closed[per:]) and closed[per - 1].pool == whole[per - 1].pool


def test_pool_partners_decode_about_one_image_per_mosaic_and_come_from_the_pool(rects, monkeypatch):
    """The trainer's batches (RunBatches): every mosaic's partners are in
    its batch's pool, and a process keeps the images it decoded for the
    pools to come: at most one decode per item where, kept for its own
    batch only, an item costs more than two. Kept images are read-only, and the items equal
    those of a process that starts afresh at each batch (nothing kept)."""
    ds = rect_dataset(rects * 16, **NO_COLOUR)
    decoded, mosaics = [], []
    real_decode, real_mosaic = data_module.decode_resized, YoloDataset._mosaic
    monkeypatch.setattr(data_module, "decode_resized", lambda path, shape: decoded.append(path) or
                        real_decode(path, shape))
    monkeypatch.setattr(YoloDataset, "_mosaic", lambda self, indices, *a: mosaics.append(indices) or
                        real_mosaic(self, indices, *a))
    batches = list(RunBatches(EvenShardSampler(len(ds), 0, 1, seed=3), 4, 0, 0, 3, 3))
    kept = []
    for b in batches:
        mosaics.clear()
        kept.append(collate(ds.__getitems__(b))[0])
        assert len(mosaics) == len(b) and all(set(m[1:]) <= set(b.pool) for m in mosaics)
    items = 4 * len(batches)
    assert len(decoded) <= items  # at most one decode an item (each of 64 images once, here)
    assert all(not img.flags.writeable for img, _ in ds._recent.values())
    decoded.clear()
    for b, want in zip(batches, kept):
        ds.__dict__.pop("_recent", None)
        assert torch.equal(collate(ds.__getitems__(b))[0], want)
    assert len(decoded) > 2 * items  # nothing kept between batches: more than two decodes an item


def test_mosaic_batches_same_for_any_worker_count_and_after_a_resume(rects):
    ds = YoloDataset(rects * 4, IMGSZ, augment=True, seed=7, names_count=len(COLOURS))
    batch = 8

    def run(workers: int, start: int) -> list:
        sampler = EvenShardSampler(len(ds), 0, 1, seed=3)
        sampler.set_epoch(2, start)
        ds.set_epoch(2)
        return list(DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=collate))

    full, two_workers, resumed = run(0, 0), run(2, 0), run(2, batch)
    assert len(full) == 2 and len(resumed) == 1
    for (a, ta, _, _), (b, tb, _, _) in zip(full, two_workers):
        assert torch.equal(a, b) and torch.equal(ta, tb)
    assert torch.equal(full[1][0], resumed[0][0]) and torch.equal(full[1][1], resumed[0][1])


def test_one_loader_for_the_run_gives_each_epochs_batches_as_a_loader_per_epoch_does(rects):
    """RunBatches tags each batch with its epoch and mosaic setting: workers
    that started in epoch 0 still make epoch 2's images, and the close-mosaic
    epoch's, exactly as a fresh per-epoch loader over a dataset set to that
    epoch does; a resumed run's one loader continues mid-epoch alike."""
    ds = YoloDataset(rects * 4, IMGSZ, augment=True, seed=7, names_count=len(COLOURS))
    batch, epochs, mosaic_until = 4, 4, 3

    def per_epoch(epoch: int, start: int = 0) -> list:
        sampler = EvenShardSampler(len(ds), 0, 1, seed=3)
        sampler.set_epoch(epoch, start)
        ds.set_epoch(epoch)
        ds.mosaic = epoch < mosaic_until
        return list(DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=0, collate_fn=collate))

    data_module.POOL_PARTNERS = False  # the per-epoch loaders' index lists have no pools
    try:
        want = [b for e in range(epochs) for b in per_epoch(e)]
        ds.set_epoch(0)
        ds.mosaic = True  # the main process's copy says epoch 0, mosaic on: the batches must win
        whole = RunBatches(EvenShardSampler(len(ds), 0, 1, seed=3), batch, 0, 0, epochs, mosaic_until)
        got = list(DataLoader(ds, batch_sampler=whole, num_workers=2, collate_fn=collate, persistent_workers=False))
    finally:
        data_module.POOL_PARTNERS = True
    per = math.ceil(len(ds) / batch)
    assert per >= 2 and len(got) == len(want) == len(whole) == epochs * per
    for (a, ta, _, _), (b, tb, _, _) in zip(want, got):
        assert torch.equal(a, b) and torch.equal(ta, tb)
    assert not torch.equal(want[0][0], want[per][0])  # epochs differ, so the tags mattered


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_the_runs_batches_with_pools_are_the_same_for_any_worker_count_and_after_a_resume(rects, workers):
    """The pool scheme's items depend on the batch order alone: workers
    that divide STREAM (2) keep what the pools need, others (3) decode
    more, and none changes an item; a resumed run's one loader continues
    mid-epoch with the items of the whole run."""
    ds = YoloDataset(rects * 4, IMGSZ, augment=True, seed=7, names_count=len(COLOURS))
    batch, epochs, mosaic_until = 4, 4, 3
    per = math.ceil(len(ds) / batch)
    whole = RunBatches(EvenShardSampler(len(ds), 0, 1, seed=3), batch, 0, 0, epochs, mosaic_until)
    want = [collate(ds.__getitems__(b)) for b in whole]  # in this process, afresh
    got = list(DataLoader(ds, batch_sampler=RunBatches(EvenShardSampler(len(ds), 0, 1, seed=3), batch, 0, 0, epochs,
                                                        mosaic_until), num_workers=workers, collate_fn=collate))
    assert len(got) == len(want) == epochs * per
    for (a, ta, _, _), (b, tb, _, _) in zip(want, got):
        assert torch.equal(a, b) and torch.equal(ta, tb)
    resumed = RunBatches(EvenShardSampler(len(ds), 0, 1, seed=3), batch, 2, batch, epochs, mosaic_until)
    rest = list(DataLoader(ds, batch_sampler=resumed, num_workers=workers, collate_fn=collate))
    assert len(rest) == 2 * per - 1 and all(torch.equal(a[0], b[0]) for a, b in zip(rest, want[2 * per + 1:]))
    tags = [(b.epoch, b.mosaic) for b in resumed]
    assert tags == [(2, True)] * (per - 1) + [(3, False)] * per and all(isinstance(b, EpochBatch) for b in resumed)


def test_run_batches_of_rectangular_batches_follow_the_rect_sampler(rects):
    from hpcyolo_trainer.data.sampler import RectBatchSampler

    batches = [[0, 1], [2, 3], [4, 5]]
    rect = RectBatchSampler(batches, 2, 0, 1, seed=1)
    want = []
    for e in range(2):
        rect.set_epoch(e)
        want += [(e, b) for b in rect]
    got = RunBatches(RectBatchSampler(batches, 2, 0, 1, seed=1), 2, 0, 0, 2, mosaic_until=0)
    assert [(b.epoch, list(b)) for b in got] == want and len(got) == 6
    assert not any(b.mosaic for b in got)
    assert [list(b) for b in RunBatches(RectBatchSampler(batches, 2, 0, 1, seed=1), 2, 1, 4, 2, 0)] == \
        [b for e, b in want[5:]]


def test_a_workers_batch_is_one_shared_tensor_without_a_stacking_copy(rects):
    """__getitems__ writes each image into its row of one [B, 3, H, W] tensor,
    in shared memory in a worker; collate passes that tensor on as it is."""
    ds = YoloDataset(rects * 4, IMGSZ, augment=True, seed=7, names_count=len(COLOURS))
    indices = list(range(8))
    items = ds.__getitems__(indices)
    imgs = collate(items)[0]
    assert imgs.shape == (8, 3, IMGSZ, IMGSZ) and imgs.data_ptr() == items[0][0].data_ptr()
    for k, (img, _, _, _) in enumerate(items):
        assert img.data_ptr() == imgs[k].data_ptr()
    # the same pixels as item by item (the HWC -> CHW planes written in place)
    val = YoloDataset(rects, IMGSZ, augment=False, names_count=len(COLOURS))
    one = [val[i][0] for i in range(len(val))]
    assert torch.equal(collate(val.__getitems__(list(range(len(val)))))[0], torch.stack(one))
    rgb = cv2.cvtColor(cv2.imread(str(val.paths[0])), cv2.COLOR_BGR2RGB)
    left, top = (IMGSZ - 160) // 2, (IMGSZ - 120) // 2
    small = cv2.resize(rgb, (160, 120), interpolation=cv2.INTER_LINEAR)  # as ultralytics 8.4, shrinking too
    assert torch.equal(one[0][:, top:top + 120, left:left + 160], torch.from_numpy(small).permute(2, 0, 1))
    # rows that are not one tensor's, in order, are stacked
    swapped = collate([items[1], items[0]])[0]
    assert torch.equal(swapped[0], imgs[1]) and swapped.data_ptr() != imgs.data_ptr()
    batch = next(iter(DataLoader(ds, batch_size=8, num_workers=1, collate_fn=collate)))
    assert batch[0].is_shared() and torch.equal(batch[0], imgs)


def test_stopping_the_loader_mid_run_lets_the_process_exit(tmp_path, rects):
    """Workers ignore SIGTERM (the trainer's worker_init): a run stopped
    mid-epoch must end them itself (train.stop_workers), or Python's exit
    waits for them forever."""
    import subprocess
    import sys

    script = tmp_path / "stop.py"
    script.write_text(f"""
import functools, sys
from pathlib import Path
from torch.utils.data import DataLoader
from hpcyolo_trainer.data.dataset import YoloDataset, collate
from hpcyolo_trainer.run.inputs import ignore_signals, stop_workers
ds = YoloDataset([Path(p) for p in {[str(r) for r in rects]!r}] * 8, 64, augment=True, names_count=12)
loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate,
                    worker_init_fn=functools.partial(ignore_signals, ("USR1", "TERM")))
it = iter(loader)
next(it)
pids = [w.pid for w in it._workers]
stop_workers(it)
print("stopped", pids, flush=True)
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split("[", 1)[1].split("]")[0].split(",")]
    assert len(pids) == 2 and not any(Path(f"/proc/{p}").exists() for p in pids)


# == determinism (exact resume) ==============================================

def test_same_seed_epoch_index_gives_identical_items(rects):
    a, b = rect_dataset(rects), rect_dataset(rects)
    torch.manual_seed(123)
    np.random.seed(123)  # global RNG state must not matter
    for i in range(len(a)):
        assert torch.equal(a[i][0], b[i][0]) and torch.equal(a[i][1], b[i][1])
    b.set_epoch(1)
    assert any(not torch.equal(a[i][0], b[i][0]) for i in range(len(a)))


def test_worker_count_does_not_change_batches(rects):
    ds = rect_dataset(rects)
    ds.set_epoch(5)
    batches = [list(DataLoader(ds, batch_size=2, num_workers=n, collate_fn=collate)) for n in (0, 2)]
    for (img0, t0, _, _), (img2, t2, _, _) in zip(*batches):
        assert torch.equal(img0, img2) and torch.equal(t0, t2)


# == the shared image cache ==================================================

def tree_snapshot(root: Path) -> dict:
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def _cache_child(files, cache_dir, start, out):
    start.wait()  # both processes reach the cache at the same moment
    ds = YoloDataset(files, 320, augment=False, hyp=AugmentHyp(), seed=0, cache="ram", cache_dir=cache_dir,
                     names_count=80)
    digests = [hashlib.sha256(ds[i][0].numpy().tobytes()).hexdigest() for i in range(len(ds))]
    out.put((ds.cache_built, digests, cache_bytes(ds)))


@pytest.fixture
def readonly_coco8(tmp_path):
    root = tmp_path / "coco8"
    shutil.copytree(COCO8, root)
    for folder, dirs, files in os.walk(root):
        for p in [Path(folder)] + [Path(folder) / f for f in files]:
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield root
    for folder, dirs, files in os.walk(root):
        Path(folder).chmod(0o755)


def test_ram_cache_built_once_per_node_and_identical(readonly_coco8, tmp_path):
    spec = load_data_spec(readonly_coco8 / "coco8.yaml")
    files = spec.train + spec.val
    before = tree_snapshot(readonly_coco8)
    cache_dir = tmp_path / "shm" / "cache"  # stands in for node-local /dev/shm/...
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_cache_child, args=(files, cache_dir, start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert sorted(built for built, _, _ in results) == [False, True]  # one builder, one waiter
    assert results[0][1] == results[1][1]

    plain = YoloDataset(files, 320, augment=False, hyp=AugmentHyp(), seed=0, names_count=80)
    assert results[0][1] == [hashlib.sha256(plain[i][0].numpy().tobytes()).hexdigest() for i in range(len(plain))]
    (data,) = cache_dir.glob("imgcache-*/images.u8")
    assert results[0][2] == data.stat().st_size > 0
    assert not list(cache_dir.glob(".*partial*"))

    # training items (mosaic + affine + HSV) are the same from the cache too
    cached = YoloDataset(files, 320, augment=True, hyp=AugmentHyp(), seed=3, cache="ram", cache_dir=cache_dir,
                         names_count=80)
    uncached = YoloDataset(files, 320, augment=True, hyp=AugmentHyp(), seed=3, names_count=80)
    assert not cached.cache_built
    for i in range(len(cached)):
        assert torch.equal(cached[i][0], uncached[i][0]) and torch.equal(cached[i][1], uncached[i][1])
    assert tree_snapshot(readonly_coco8) == before  # nothing written next to the dataset


def test_disk_cache_is_rebuilt_when_a_file_changes(rects, tmp_path):
    files = [shutil.copy(f, tmp_path / f.name) for f in rects]
    first = YoloDataset(files, 96, augment=True, hyp=AugmentHyp(), seed=0, cache="disk", cache_dir=tmp_path / "c",
                        names_count=12)
    again = YoloDataset(files, 96, augment=True, hyp=AugmentHyp(), seed=0, cache="disk", cache_dir=tmp_path / "c",
                        names_count=12)
    assert first.cache_built and not again.cache_built and cache_bytes(again) == cache_bytes(first)
    batch = next(iter(DataLoader(again, batch_size=4, num_workers=2, collate_fn=collate)))  # maps in workers
    assert torch.equal(batch[0], collate([first[i] for i in range(4)])[0])
    st = os.stat(files[0])
    os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = YoloDataset(files, 96, augment=True, hyp=AugmentHyp(), seed=0, cache="disk", cache_dir=tmp_path / "c",
                          names_count=12)
    assert touched.cache_built and len(list((tmp_path / "c").glob("imgcache-*"))) == 2


def test_flipud_mirrors_every_image_upside_down_and_its_boxes(rects):
    val = rect_dataset(rects, augment=False)
    flip = rect_dataset(rects, mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0, flipud=1.0, **NO_COLOUR)
    for i in range(len(val)):
        (img, labels, _, _), (vimg, vlabels, _, _) = flip[i], val[i]
        assert torch.equal(img, vimg.flip(-2))
        expected = vlabels.clone()
        expected[:, 2] = 1 - vlabels[:, 2]
        assert torch.allclose(labels, expected, atol=1e-6)
        assert check_boxes_follow_pixels(img, labels) == 3


def test_fliplr_0_flips_nothing_and_bgr_1_swaps_every_images_channels(rects):
    val = rect_dataset(rects, augment=False)
    plain = rect_dataset(rects, mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0, **NO_COLOUR)
    swapped = rect_dataset(rects, mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0, bgr=1.0, **NO_COLOUR)
    for i in range(len(val)):
        assert torch.equal(plain[i][0], val[i][0]) and torch.equal(plain[i][1], val[i][1])
        assert torch.equal(swapped[i][0], val[i][0].flip(0)) and torch.equal(swapped[i][1], val[i][1])



def test_perspective_warps_the_image_and_the_boxes_follow_their_rectangles(rects):
    plain = rect_dataset(rects, mosaic=0.0, fliplr=0.0, **NO_COLOUR)
    tilted = rect_dataset(rects, mosaic=0.0, fliplr=0.0, perspective=0.0005, **NO_COLOUR)
    judged = 0
    for i in range(len(rects)):
        img, labels, _, _ = tilted[i]
        assert not torch.equal(img, plain[i][0])
        judged += check_boxes_follow_pixels(img, labels)
    assert judged >= 6
    mosaics = rect_dataset(rects, mosaic=1.0, fliplr=0.0, perspective=0.0005, **NO_COLOUR)  # the canvas is warped
    assert sum(check_boxes_follow_pixels(*mosaics[i][:2]) for i in range(len(rects))) >= 6


def test_mixup_1_blends_every_image_and_keeps_both_samples_boxes(rects):
    alone = rect_dataset(rects, fliplr=0.0, **NO_COLOUR)
    mixed = rect_dataset(rects, fliplr=0.0, mixup=1.0, **NO_COLOUR)
    for i in range(len(rects)):
        (img, labels, _, _), (img0, labels0, _, _) = mixed[i], alone[i]
        # The first sample is drawn as without MixUp; the second adds its boxes and about half its pixels.
        assert len(labels) > len(labels0) and torch.equal(labels[:len(labels0)], labels0)
        assert (img.float() - img0.float()).abs().mean() > 5


def test_cutmix_pastes_a_second_samples_rectangle_where_no_box_is_with_its_boxes_there(rects):
    alone = rect_dataset(rects, fliplr=0.0, **NO_COLOUR)
    cut = rect_dataset(rects, fliplr=0.0, cutmix=1.0, **NO_COLOUR)
    pasted = 0
    for epoch in range(3):
        alone.set_epoch(epoch), cut.set_epoch(epoch)
        for i in range(len(rects)):
            (img, labels, _, _), (img0, labels0, _, _) = cut[i], alone[i]
            assert torch.equal(labels[:len(labels0)], labels0)  # the first sample is drawn as without CutMix
            changed = (img != img0).any(0)
            if len(labels) == len(labels0):
                assert not changed.any()  # no free rectangle, or none of the second sample's boxes in it
                continue
            pasted += 1
            ys, xs = changed.nonzero(as_tuple=True)
            size = img.shape[-1]
            rect = (xs.min() / size, ys.min() / size, (xs.max() + 1) / size, (ys.max() + 1) / size)
            for cls, cx, cy, w, h in labels0.tolist():  # no box of the first sample under it
                assert cx + w / 2 <= rect[0] + 1e-6 or cx - w / 2 >= rect[2] - 1e-6 or \
                    cy + h / 2 <= rect[1] + 1e-6 or cy - h / 2 >= rect[3] - 1e-6
            for cls, cx, cy, w, h in labels[len(labels0):].tolist():  # the new boxes lie in it
                assert rect[0] - 1e-6 <= cx - w / 2 and cx + w / 2 <= rect[2] + 1e-6
                assert rect[1] - 1e-6 <= cy - h / 2 and cy + h / 2 <= rect[3] + 1e-6
    assert pasted >= 2
