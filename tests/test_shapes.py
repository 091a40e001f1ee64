"""The synthetic shapes dataset: layout, labels, determinism, tight boxes, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO
from PIL import Image

from hpcyolo.login import shapes
from hpcyolo_trainer.common.errors import HpcyoloError

SMALL = dict(n_train=24, n_val=8, imgsz=64, classes=6, seed=1, max_objects=4)


def hpcyolo(*args, **kw):
    exe = os.path.join(os.path.dirname(sys.executable), "hpcyolo")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=REPO, **kw)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("ds") / "shapes"
    assert shapes.make_shapes(dest, **SMALL) == dest / "data.yaml"
    return dest


def test_layout_and_counts(dataset):
    for split, n in (("train", SMALL["n_train"]), ("val", SMALL["n_val"])):
        images = sorted(p.stem for p in (dataset / "images" / split).iterdir())
        labels = sorted(p.stem for p in (dataset / "labels" / split).iterdir())
        assert len(images) == n and images == labels
        assert all(p.suffix == ".jpg" for p in (dataset / "images" / split).iterdir())
        with Image.open(dataset / "images" / split / f"{images[0]}.jpg") as im:
            assert im.size == (SMALL["imgsz"],) * 2 and im.mode == "RGB"
    assert not list(dataset.parent.glob("*.partial-*"))


def test_data_yaml(dataset):
    spec = yaml.safe_load((dataset / "data.yaml").read_text())
    assert spec["path"] == "." and spec["train"] == "images/train" and spec["val"] == "images/val"
    assert spec["names"] == dict(enumerate(["circle", "square", "triangle", "cross", "star", "ring"]))


def test_labels_are_valid(dataset):
    counts, empty = np.zeros(SMALL["classes"], int), 0
    for txt in dataset.glob("labels/*/*.txt"):
        lines = txt.read_text().splitlines()
        empty += not lines
        assert len(lines) <= SMALL["max_objects"]
        for line in lines:
            c, *xywh = line.split()
            assert len(xywh) == 4 and c.isdigit() and 0 <= int(c) < SMALL["classes"], line
            cx, cy, w, h = map(float, xywh)
            assert 0 < w <= 1 and 0 < h <= 1, line
            assert cx - w / 2 >= -1e-6 and cx + w / 2 <= 1 + 1e-6, line
            assert cy - h / 2 >= -1e-6 and cy + h / 2 <= 1 + 1e-6, line
            assert max(w, h) >= 0.08, line  # ~10% of the side at least (clipping may cut a little)
            counts[int(c)] += 1
    assert empty == round(0.05 * SMALL["n_train"]) + round(0.05 * SMALL["n_val"])
    assert counts.sum() > SMALL["n_train"]  # most images hold objects


def test_same_seed_same_bytes_other_seed_differs(dataset, tmp_path):
    ref = files(dataset)
    again = files(Path(shapes.make_shapes(tmp_path / "a", **SMALL)).parent)
    assert again == ref
    other = files(Path(shapes.make_shapes(tmp_path / "b", **{**SMALL, "seed": 2})).parent)
    assert other.keys() == ref.keys()
    images = [k for k in ref if k.endswith(".jpg")]
    assert sum(other[k] != ref[k] for k in images) == len(images)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="worker processes are forked on Linux only")
def test_worker_processes_write_the_same_bytes(dataset, tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(shapes, "_workers", lambda total: 2)
    shapes.make_shapes(tmp_path / "mp", progress=True, **SMALL)
    assert files(tmp_path / "mp") == files(dataset)
    total = SMALL["n_train"] + SMALL["n_val"]
    assert f"shapes: {total}/{total} images" in capfd.readouterr().err


@pytest.mark.parametrize("kind", shapes.SHAPES)
def test_alpha_fills_its_patch(kind):
    # The shape is scaled to its patch: it reaches all four sides (sharp tips,
    # thinner than half a pixel, may stop short by a pixel or two).
    for rot in (0.0, 0.3, -0.4, 2.0):
        on = shapes.shape_alpha(kind, 37, 29, rot) >= 0.5
        ys, xs = np.nonzero(on)
        assert xs.min() <= 2 and xs.max() >= 36 - 2 and ys.min() <= 2 and ys.max() >= 28 - 2, (kind, rot)
        assert on.mean() > 0.25, (kind, rot)
        if not (kind == "square" and rot == 0.0):
            assert on.mean() < 0.95, (kind, rot)  # a silhouette, not a filled box


def bbox(mask):
    ys, xs = np.nonzero(mask)
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def test_box_bounds_the_drawn_shape(monkeypatch):
    # Without pixel noise an image with one shape is background + alpha *
    # (colour - background): recover alpha from the pixels and check that the
    # label is the tight box of alpha >= 0.5.
    monkeypatch.setattr(shapes, "_noise", lambda rng, size: np.zeros((3, size, size), np.float32))
    S, seen = 96, set()
    for i in range(40):
        img, boxes = shapes.render_image(np.random.default_rng([7, i]), S, 6, 1)
        if not boxes:
            continue
        (cls, *box), = boxes
        bg = np.clip(shapes._background(np.random.default_rng([7, i]), S) + 0.5, 0, 255).astype(np.uint8)
        bg = bg.transpose(1, 2, 0).astype(np.float32)
        img = img.astype(np.float32)
        colours, counts = np.unique(img.reshape(-1, 3), axis=0, return_counts=True)
        colour = colours[counts.argmax()]  # the flat fill of the shape
        d = colour - bg
        alpha = ((img - bg) * d).sum(-1) / np.maximum((d * d).sum(-1), 1e-6)
        # It contrasts with what is under it (on average: backgrounds are gradients).
        assert np.linalg.norm(colour - bg[alpha > 0.9].mean(0)) >= shapes.MIN_COLOR_DIST - 2, i
        inner, outer = bbox(alpha >= 0.56), bbox(alpha >= 0.44)  # uint8 rounding either side of 0.5
        assert outer[0] <= box[0] <= inner[0] and outer[1] <= box[1] <= inner[1], (i, cls, box, inner, outer)
        assert inner[2] <= box[2] <= outer[2] and inner[3] <= box[3] <= outer[3], (i, cls, box, inner, outer)
        assert bbox(alpha > 0.1) == pytest.approx(box, abs=1.01)  # the soft edge is at most a pixel wide
        seen.add(cls)
    assert seen == set(range(6))


def test_shapes_in_the_jpeg_stand_out(dataset):
    # On the written files: pixels inside a box differ from those just outside.
    for txt in sorted(dataset.glob("labels/train/*.txt")):
        lines = txt.read_text().splitlines()
        if len(lines) != 1:
            continue
        img = np.asarray(Image.open(dataset / "images" / "train" / f"{txt.stem}.jpg"), dtype=np.float32)
        S = img.shape[0]
        _, cx, cy, w, h = map(float, lines[0].split())
        x0, x1 = round((cx - w / 2) * S), round((cx + w / 2) * S)
        y0, y1 = round((cy - h / 2) * S), round((cy + h / 2) * S)
        inside = np.zeros((S, S), bool)
        inside[y0:y1, x0:x1] = True
        ring = np.zeros((S, S), bool)
        ring[max(0, y0 - 4):y1 + 4, max(0, x0 - 4):x1 + 4] = True
        ring &= ~inside
        if ring.sum() < 20:
            continue
        assert np.linalg.norm(img[inside].mean(0) - img[ring].mean(0)) > 25, txt.name


def test_refuses_a_non_empty_directory(tmp_path):
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(HpcyoloError, match="not empty"):
        shapes.make_shapes(dest, n_train=2, n_val=1)
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no partial left behind


def test_fills_an_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    shapes.make_shapes(tmp_path / "empty", n_train=3, n_val=1, imgsz=48)
    assert len(list((tmp_path / "empty" / "images" / "train").iterdir())) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_bad_arguments():
    with pytest.raises(HpcyoloError, match="classes"):
        shapes.make_shapes(Path("/nonexistent/never"), classes=7)


def test_cli(tmp_path):
    r = hpcyolo("make-dataset", "--help")
    assert r.returncode == 0 and "Usage: hpcyolo make-dataset" in r.stdout and "--max-objects" in r.stdout
    dest = tmp_path / "demo"
    r = hpcyolo("make-dataset", "shapes", dest, "--train", 5, "--val", 2, "--imgsz", 64, "--classes", 3)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(dest / "data.yaml")
    assert len(yaml.safe_load((dest / "data.yaml").read_text())["names"]) == 3
    r = hpcyolo("make-dataset", "shapes", dest, "--train", 5, "--val", 2)
    assert r.returncode == 1 and r.stderr.startswith("hpcyolo: error: ") and "not empty" in r.stderr


def test_cli_never_imports_torch(tmp_path):
    code = (
        "import sys\n"
        "from hpcyolo.cli import main\n"
        "for argv in (['make-dataset', '--help'], ['make-dataset', 'shapes', DEST, '--train', '2', '--val', '1']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), e.code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')\n"
        "print('IMPORTED', bad, file=sys.stderr)\n"
        "sys.exit(1 if bad else 0)\n"
    ).replace("DEST", repr(str(tmp_path / "d")))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "IMPORTED []" in r.stderr


# == --task segment and --task classify ===========================================

def polygon_mask(points: np.ndarray, size: int, ss: int = 4) -> np.ndarray:
    """The pixels (size, size) a polygon (k, 2, in pixels) covers, by area at ss x ss samples."""
    from PIL import ImageDraw

    canvas = Image.new("L", (size * ss, size * ss), 0)
    ImageDraw.Draw(canvas).polygon([tuple(p) for p in points * ss - 0.5], fill=255)
    return np.asarray(canvas.resize((size, size), Image.Resampling.BOX), dtype=np.float32) / 255 >= 0.5


def test_each_shapes_polygon_covers_the_pixels_it_drew():
    """One shape per image, with the noise off: the polygon written for it
    covers the pixels of alpha >= 0.5 (recovered from the image) with IoU >=
    0.9 at the default image size, a ring's hole left out, and bounds the
    detection box within a pixel."""
    S, ious = 160, {}  # the default size: the smallest shape is 19 px, a ring's band 4
    for i in range(60):
        rng = np.random.default_rng([11, i])
        outlines: list = []
        img, boxes = shapes.render_image(rng, S, 6, 1, outlines=outlines)
        if not boxes:
            continue
        rng = np.random.default_rng([11, i])
        bg = np.clip(shapes._background(rng, S) + 0.5, 0, 255).transpose(1, 2, 0)
        noise_free = shapes._noise
        try:
            shapes._noise = lambda rng, size: np.zeros((3, size, size), np.float32)
            img, _ = shapes.render_image(np.random.default_rng([11, i]), S, 6, 1)
        finally:
            shapes._noise = noise_free
        img = img.astype(np.float32)
        colours, counts = np.unique(img.reshape(-1, 3), axis=0, return_counts=True)
        d = colours[counts.argmax()] - bg.astype(np.float32)
        alpha = ((img - bg) * d).sum(-1) / np.maximum((d * d).sum(-1), 1e-6)
        (cls, *box), = boxes
        drawn, covered = alpha >= 0.5, polygon_mask(outlines[0], S)
        ious.setdefault(shapes.SHAPES[cls], []).append((drawn & covered).sum() / (drawn | covered).sum())
        lo, hi = outlines[0].min(0), outlines[0].max(0)
        assert np.allclose([*lo, *hi], box, atol=1.0), (i, cls, box, lo, hi)
        assert outlines[0].min() >= 0 and outlines[0].max() <= S
    assert sorted(ious) == sorted(shapes.SHAPES)  # every kind seen, the ring's hole among them
    assert min(min(v) for v in ious.values()) >= 0.9, {k: round(min(v), 3) for k, v in ious.items()}


def test_a_segment_set_is_the_detect_sets_images_with_polygons_whose_boxes_are_its_boxes(dataset, tmp_path):
    seg = shapes.make_shapes(tmp_path / "seg", **SMALL, task="segment").parent
    det, got = files(dataset), files(seg)
    images = [name for name in det if name.startswith("images/")]
    assert images and all(got[name] == det[name] for name in images)  # the same draws
    assert "--task segment" in (seg / "data.yaml").read_text()
    assert yaml.safe_load((seg / "data.yaml").read_text())["names"] == yaml.safe_load((dataset / "data.yaml").read_text())["names"]
    lines = 0
    for name in (n for n in det if n.startswith("labels/")):
        for box_line, polygon_line in zip(det[name].decode().splitlines(), got[name].decode().splitlines(), strict=True):
            c, *xywh = box_line.split()
            pc, *xy = polygon_line.split()
            points = np.asarray(xy, dtype=float).reshape(-1, 2)
            assert pc == c and len(points) >= 3 and points.min() >= 0 and points.max() <= 1
            cx, cy, w, h = map(float, xywh)
            lo, hi = points.min(0), points.max(0)
            assert np.allclose([*lo, *hi], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], atol=1.01 / SMALL["imgsz"])
            lines += 1
    assert lines > SMALL["n_train"]


def test_a_classify_set_is_shapes_of_one_class_an_image_in_balanced_class_folders(tmp_path):
    dest = tmp_path / "cls"
    assert shapes.make_shapes(dest, n_train=12, n_val=6, imgsz=64, classes=3, seed=2, task="classify") == dest
    assert sorted(p.name for p in dest.iterdir()) == ["train", "val"]  # no labels, no data.yaml
    for split, n in (("train", 12), ("val", 6)):
        folders = {p.name: sorted(q.name for q in p.iterdir()) for p in (dest / split).iterdir()}
        assert sorted(folders) == sorted(shapes.SHAPES[:3])
        assert [len(v) for v in folders.values()] == [n // 3] * 3
        for name, images in folders.items():
            for image in images:  # each image's shapes are all of its folder's class
                rng = np.random.default_rng([2, ("train", "val").index(split), int(Path(image).stem)])
                rng.integers(1, 5)  # the object count drawn first, as for the other tasks
                count = int(rng.integers(shapes.CLASSIFY_COUNT[0], shapes.CLASSIFY_COUNT[1] + 1))
                _, boxes = shapes.render_image(rng, 64, 3, count, only=shapes.SHAPES.index(name),
                                               sizes=shapes.CLASSIFY_SIZES, light=True)
                assert 2 <= len(boxes) <= count and {b[0] for b in boxes} == {shapes.SHAPES.index(name)}
    assert files(dest) == files(shapes.make_shapes(tmp_path / "again", n_train=12, n_val=6, imgsz=64, classes=3,
                                                   seed=2, task="classify"))


def test_the_cli_writes_each_task_and_refuses_another(tmp_path):
    r = hpcyolo("make-dataset", "shapes", tmp_path / "seg", "--task", "segment", "--train", "4", "--val", "2")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "seg" / "data.yaml"), r.stderr
    r = hpcyolo("make-dataset", "shapes", tmp_path / "cls", "--task", "classify", "--train", "4", "--val", "4")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "cls"), r.stderr
    r = hpcyolo("make-dataset", "shapes", tmp_path / "obb", "--task", "obb", "--train", "4", "--val", "2")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "obb" / "data.yaml"), r.stderr
    r = hpcyolo("make-dataset", "shapes", tmp_path / "pose", "--task", "pose", "--train", "4", "--val", "2")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "pose" / "data.yaml"), r.stderr
    r = hpcyolo("make-dataset", "shapes", tmp_path / "depth", "--task", "depth")
    assert r.returncode == 2 and "--task" in r.stderr and not (tmp_path / "depth").exists()
    with pytest.raises(HpcyoloError, match="task must be one of detect, segment, classify, obb, pose"):
        shapes.make_shapes(tmp_path / "x", task="depth")
    assert not (tmp_path / "x").exists()


# == --task obb ====================================================================

def test_min_area_rect_is_opencvs_rectangle():
    """The rectangle min_area_rect finds has OpenCV's minAreaRect area (what
    ultralytics converts corners with) on random polygons, right angles and
    every point inside it."""
    import cv2

    from hpcyolo_trainer.common.polygon import min_area_rect

    rng = np.random.default_rng(3)
    for _ in range(200):
        points = rng.normal(size=(int(rng.integers(3, 12)), 2)) * rng.uniform(1, 50, 2) + rng.uniform(0, 100, 2)
        corners = min_area_rect(points)
        sides = np.roll(corners, -1, 0) - corners
        assert abs(np.dot(sides[0], sides[1])) < 1e-6 * np.dot(sides[0], sides[0]) + 1e-9
        (_, _), (w, h), _ = cv2.minAreaRect(points.astype(np.float32))
        area = np.hypot(*sides[0]) * np.hypot(*sides[1])
        assert area == pytest.approx(w * h, rel=1e-4, abs=1e-6)
        u, v = sides[0] / np.hypot(*sides[0]), sides[1] / np.hypot(*sides[1])
        a, b = (points - corners[0]) @ u, (points - corners[0]) @ v
        assert a.min() > -1e-6 and b.min() > -1e-6 and a.max() < np.hypot(*sides[0]) + 1e-6 \
            and b.max() < np.hypot(*sides[1]) + 1e-6


def test_an_obb_set_labels_each_shape_with_its_tight_rotated_rectangle(tmp_path):
    """Every line is a class and four corners inside the image that make a
    rectangle; the rectangle is the minimum-area one of the shape's polygon
    (the same draw with outlines), and the same seed writes the same files."""
    import cv2

    obb = shapes.make_shapes(tmp_path / "obb", **SMALL, task="obb").parent
    assert "--task obb" in (obb / "data.yaml").read_text()
    lines = 0
    for label in sorted((obb / "labels").rglob("*.txt")):
        for line in label.read_text().splitlines():
            c, *xy = line.split()
            corners = np.asarray(xy, dtype=float).reshape(4, 2)
            assert 0 <= int(c) < SMALL["classes"] and corners.min() >= 0 and corners.max() <= 1
            sides = np.roll(corners, -1, 0) - corners
            assert abs(np.dot(sides[0], sides[1])) < 1e-4 and np.allclose(sides[0], -sides[2], atol=2e-6)
            lines += 1
    assert lines > SMALL["n_train"]
    from hpcyolo_trainer.common.polygon import min_area_rect

    compared = 0
    for i in range(30):  # each rectangle against OpenCV's of the polygon drawn
        polygons, rects = [], []
        shapes.render_image(np.random.default_rng([5, i]), 160, 6, 3, outlines=polygons)
        shapes.render_image(np.random.default_rng([5, i]), 160, 6, 3, outlines=rects, rotated=True)
        for polygon, rect in zip(polygons, rects):  # the same placements until one's rectangle leaves the image
            (_, _), (w, h), _ = cv2.minAreaRect(polygon.astype(np.float32))
            (cx, cy), (rw, rh), _ = cv2.minAreaRect(rect.astype(np.float32))
            if min_area_rect(polygon).min() < 0 or min_area_rect(polygon).max() > 160:
                break  # placed again in the obb set: the draws part here
            assert rw * rh == pytest.approx(w * h, rel=1e-4) and np.allclose(rect, min_area_rect(polygon))
            compared += 1
    assert compared > 40
    assert files(obb) == files(shapes.make_shapes(tmp_path / "again", **SMALL, task="obb").parent)


# == --task pose ===================================================================

def test_a_pose_set_labels_each_shape_with_its_extreme_points(tmp_path):
    """Every line is a box and four keypoints (x y v): the shape's leftmost,
    topmost, rightmost and bottommost points, those inside the image
    visible (2) on the box's left, top, right and bottom edge (the box is
    the drawn pixels', the points the outline's: within a pixel), those
    outside 0 0 0; the data YAML names kpt_shape and the flip_idx that a
    left-right mirror needs; the same seed writes the same files."""
    pose = shapes.make_shapes(tmp_path / "pose", **SMALL, task="pose").parent
    spec = yaml.safe_load((pose / "data.yaml").read_text())
    assert spec["kpt_shape"] == [4, 3] and spec["flip_idx"] == [2, 1, 0, 3]
    size, visible, hidden = SMALL["imgsz"], 0, 0
    for label in sorted((pose / "labels").rglob("*.txt")):
        for line in label.read_text().splitlines():
            values = np.asarray(line.split()[1:], dtype=float)
            assert len(values) == 4 + 4 * 3
            box = np.array([values[0] - values[2] / 2, values[1] - values[3] / 2, values[0] + values[2] / 2,
                            values[1] + values[3] / 2]) * size
            points = values[4:].reshape(4, 3) * (size, size, 1)
            assert set(points[:, 2]) <= {0.0, 2.0}
            hidden += int((points[:, 2] == 0).sum())
            assert (points[points[:, 2] == 0] == 0).all()
            shown = points[:, 2] == 2
            visible += int(shown.sum())
            edges = np.array([points[0, 0] - box[0], points[1, 1] - box[1], box[2] - points[2, 0],
                              box[3] - points[3, 1]])
            assert np.abs(edges[shown]).max(initial=0) < 1.0, (label, line)
    assert visible > 4 * SMALL["n_train"] and hidden > 0
    assert files(pose) == files(shapes.make_shapes(tmp_path / "again", **SMALL, task="pose").parent)


def test_flip_idx_names_each_keypoint_of_the_mirrored_shape():
    """The extreme points of a mirrored outline are the original's, mirrored
    and reordered by FLIP_IDX (leftmost <-> rightmost)."""
    rng = np.random.default_rng(3)
    for kind in ("triangle", "star", "cross", "square"):
        outline = shapes.outline(kind, 40, 30, rng.uniform(0, 6.3)) + (50, 60)
        mirrored = outline * (-1, 1) + (160, 0)
        ours, theirs = shapes.extreme_points(outline, 160), shapes.extreme_points(mirrored, 160)
        np.testing.assert_allclose(theirs[:, 0], 160 - ours[list(shapes.FLIP_IDX), 0], atol=1e-9)
        np.testing.assert_allclose(theirs[:, 1], ours[list(shapes.FLIP_IDX), 1], atol=1e-9)
