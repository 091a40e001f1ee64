"""Oriented boxes through the data path: ultralytics' own cuts and warps of
oriented boxes (reference script's obb-augment: Instances.clip and
RandomPerspective with preserve_obb) against augment.rotated_clip and the
warp's, letterbox and flips exactly, every augmentation of the detection
path leaving rectangles inside the image, and bad OBB rows refused in one
line naming file and line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.polygon import clip_polygon, xyxyxyxy2xywhr
from hpcyolo_trainer.data.augment import outline_boxes, rotated_clip, transform_points
from hpcyolo_trainer.data.dataset import AugmentHyp, YoloDataset, collate, load_data_spec
from hpcyolo_trainer.data.masks import resampled
from hpcyolo_trainer.model.rboxes import xywhr2xyxyxyxy

REFERENCE = REPO / "tests" / "reference" / "ultralytics" / "obb" / "augment.npz"
IMGSZ = 96
HYPS = {
    "mosaic": {},  # ultralytics' defaults: mosaic, scale 0.5, translate 0.1, fliplr 0.5
    "warp": {"mosaic": 0.0, "degrees": 30.0, "shear": 5.0, "perspective": 0.0005, "flipud": 0.5},
    "mosaic-warp": {"degrees": 20.0, "shear": 3.0, "flipud": 0.5},
    "mixup-cutmix": {"mixup": 0.7, "cutmix": 0.7, "degrees": 10.0},
}


def polygon_area(points: np.ndarray) -> float:
    x, y = points[:, 0], points[:, 1]
    return abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))) / 2


def same_rectangles(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    """Each xywhr of `a` and `b` [n, 5] the same rectangle: every corner of one
    within atol px of a corner of the other (whichever side each calls w)."""
    ca, cb = (xywhr2xyxyxyxy(torch.as_tensor(np.asarray(x, np.float64))) for x in (a, b))
    gap = (ca[:, :, None] - cb[:, None]).norm(dim=-1)  # [n, 4, 4]
    worst = torch.maximum(gap.amin(2).amax(1), gap.amin(1).amax(1))
    assert float(worst.max()) < atol, (worst.max(), np.flatnonzero(worst.numpy() >= atol))


def test_a_cut_is_ultralytics_preserve_obb_clip():
    """Rectangles crossing a 96 x 64 image's border, cut as a mosaic and a
    CutMix patch cut them: the same rectangles (a hundredth of a pixel) and
    the same boxes of their visible parts as ultralytics' Instances.clip."""
    ref = np.load(REFERENCE)
    corners = np.stack([resampled(c, 100) for c in ref["corners"]])  # as ultralytics' dataset loads them
    cut = [rotated_clip(c, (0, 0, 96, 64)) for c in corners]
    assert sum(not np.array_equal(c, k) for c, k in zip(cut, corners)) >= 8  # cases that cut
    boxes = outline_boxes(np.zeros((len(corners), 5), np.float32), list(corners), (0, 0, 96, 64))
    np.testing.assert_allclose(boxes[:, 1:], ref["clip_boxes"], atol=1e-3)
    same_rectangles(xyxyxyxy2xywhr(np.stack(cut)), ref["clip_rboxes"], atol=0.01)


def test_a_warp_moves_rectangles_as_ultralytics_random_perspective():
    """Six warps (rotation, scale, shear, move; three with a perspective
    tilt) onto 96 x 96: each rectangle's corners transformed, cut to the
    output, are ultralytics' (apply_segments then clip(preserve_obb)) to a
    hundredth of a pixel, and their visible parts' boxes its boxes."""
    ref = np.load(REFERENCE)
    corners = np.stack([resampled(c, 100) for c in ref["corners"]])
    for m, rboxes, boxes, kept in zip(ref["matrices"], ref["warp_rboxes"], ref["warp_boxes"], ref["warp_kept"]):
        moved = [transform_points(c, m) for c in corners]
        ours = outline_boxes(np.zeros((len(corners), 5), np.float32), moved, (0, 0, 96, 96))
        shown = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        np.testing.assert_allclose(ours[shown, 1:], boxes[shown], atol=2e-3)
        cut = np.stack([rotated_clip(c, (0, 0, 96, 96)) for c in moved])
        same_rectangles(xyxyxyxy2xywhr(cut)[kept], rboxes[kept], atol=0.01)
        assert kept.sum() >= 5


@pytest.fixture(scope="module")
def obb_yaml(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("obb") / "shapes", n_train=16, n_val=4, imgsz=IMGSZ, task="obb",
                       seed=5)


def corners_of(label: Path) -> tuple[np.ndarray, np.ndarray]:
    rows = np.loadtxt(label, ndmin=2)
    return rows[:, 0], rows[:, 1:].reshape(-1, 4, 2)


def test_letterbox_and_flips_move_the_corners_exactly(obb_yaml):
    """Without augmentation an item's rows are the minimum-area rectangle
    of its file's corners (normalised as ultralytics' Format: by the
    image's width and height); flipped left-right or up-down, the mirror
    image of them."""
    spec = load_data_spec(obb_yaml)
    plain = YoloDataset(spec.train, IMGSZ, augment=False, names_count=4, obb=True)
    hyp = dict(mosaic=0.0, scale=0.0, translate=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    flips = {"lr": YoloDataset(spec.train, IMGSZ, augment=True, names_count=4, obb=True,
                               hyp=AugmentHyp(**hyp, fliplr=1.0)),
             "ud": YoloDataset(spec.train, IMGSZ, augment=True, names_count=4, obb=True,
                               hyp=AugmentHyp(**hyp, fliplr=0.0, flipud=1.0))}
    checked = 0
    for i, path in enumerate(plain.paths):
        cls, corners = corners_of(path.parent.parent.parent / "labels" / "train" / f"{path.stem}.txt") \
            if (path.parent.parent.parent / "labels" / "train" / f"{path.stem}.txt").stat().st_size else (None, None)
        _, rows, _, _ = plain[i]
        if cls is None:
            assert len(rows) == 0
            continue
        assert rows.shape == (len(cls), 6) and (rows[:, 0].numpy() == cls).all()
        same_rectangles(rows[:, 1:].numpy() * [1, 1, 1, 1, 1], xyxyxyxy2xywhr(corners), atol=1e-5)
        for name, flipped in flips.items():
            mirrored = corners.copy()
            axis = 0 if name == "lr" else 1
            mirrored[..., axis] = 1 - mirrored[..., axis]
            _, rows, _, _ = flipped[i]
            same_rectangles(rows[:, 1:].numpy(), xyxyxyxy2xywhr(mirrored), atol=1e-5)
        checked += len(cls)
    assert checked > 16


@pytest.mark.parametrize("name", sorted(HYPS))
def test_every_augmentation_leaves_rectangles_inside_the_image(obb_yaml, name):
    """After mosaic, the warp with rotation, shear and perspective, flips,
    mixup and cutmix: every row a finite rectangle of positive sides, much
    of it inside the image (ultralytics' rule for a cut box is the rectangle
    at its angle around its visible part, which may reach beyond the
    image), the batch's targets [M, 7] (image, class, xywhr)."""
    spec = load_data_spec(obb_yaml)
    data = YoloDataset(spec.train, IMGSZ, augment=True, hyp=AugmentHyp(**HYPS[name]), seed=2, names_count=4,
                       obb=True)
    rows = 0
    for epoch in range(2):
        data.set_epoch(epoch)
        for i in range(len(data)):
            img, labels, _, _ = data[i]
            assert img.shape == (3, IMGSZ, IMGSZ) and labels.shape[1] == 6
            assert torch.isfinite(labels).all() and (labels[:, 3:5] > 0).all()
            for corners in xywhr2xyxyxyxy(labels[:, 1:].double()).numpy():
                shown = clip_polygon(corners, 0, 0, 1, 1)
                assert len(shown) >= 3 and polygon_area(shown) > 0.05 * polygon_area(corners), (name, i, corners)
            rows += len(labels)
    assert rows > 20
    imgs, targets, _, _ = collate([data[0], data[1]])
    assert targets.shape[1] == 7 and set(targets[:, 0].tolist()) <= {0.0, 1.0}


def bad_set(obb_yaml, tmp_path, line: str) -> tuple[list[Path], Path, int]:
    shutil.copytree(obb_yaml.parent, tmp_path / "set")
    label = next(p for p in sorted((tmp_path / "set" / "labels" / "train").iterdir()) if p.read_text().strip())
    rows = label.read_text().splitlines()
    label.write_text("\n".join(["", *rows, line]) + "\n")  # the bad row on line len + 2
    return sorted((tmp_path / "set" / "images" / "train").glob("*.jpg")), label, len(rows) + 2


@pytest.mark.parametrize("line, message", [
    ("1 0.1 0.1 0.3 0.1 0.3 0.3", "6 coordinates where train.task obb needs an oriented box's four corners"),
    ("1 0.5 0.5 0.2 0.2", "4 coordinates where train.task obb needs"),
    ("2 0.1 0.1 0.2 0.2 0.3 0.3 0.4 0.4", "a degenerate oriented box"),
])
def test_a_bad_obb_row_is_refused_in_one_line_naming_file_and_line(obb_yaml, tmp_path, line, message):
    files, label, number = bad_set(obb_yaml, tmp_path, line)
    with pytest.raises(HpcyoloError) as e:
        YoloDataset(files, IMGSZ, augment=True, names_count=4, obb=True)
    assert str(e.value).count("\n") == 0 and str(e.value).startswith(f"{label}:{number}: {message}"), str(e.value)


def test_corners_beyond_ultralytics_tolerance_are_a_problem_line(obb_yaml, tmp_path):
    """A corner 2% outside the image (ultralytics allows 1%): the row is
    skipped with a line naming file and line, as every task's malformed rows."""
    files, label, number = bad_set(obb_yaml, tmp_path, "1 0.1 0.1 1.02 0.1 1.02 0.3 0.1 0.3")
    data = YoloDataset(files, IMGSZ, augment=True, names_count=4, obb=True)
    assert any(p.startswith(f"{label}:{number}: malformed label line skipped (coordinates outside [0, 1])")
               for p in data.problems), data.problems
