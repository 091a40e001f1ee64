"""copy_paste, ultralytics' Copy-Paste in its flip mode: a sample's
instances pasted again, mirrored, inside their outlines (polygon label
rows), where they overlap no other box much; with box labels nothing is
pasted and the one warning says so."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.augment import AugmentHyp, copy_paste_flip
from hpcyolo_trainer.data import YoloDataset, read_outlines


def test_an_instance_is_pasted_mirrored_inside_its_outline_and_one_on_its_own_mirror_is_not():
    img = np.zeros((60, 100, 3), np.uint8)
    triangle = np.array([[10, 10], [30, 10], [10, 40]], np.float32)  # its box: x 10-30, y 10-40
    centred = np.array([[45, 20], [55, 20], [55, 30], [45, 30]], np.float32)  # its mirror is itself
    cv2.fillPoly(img, [triangle.astype(np.int32)], (255, 0, 0))
    cv2.fillPoly(img, [centred.astype(np.int32)], (0, 255, 0))
    boxes = np.array([[3, 10, 10, 30, 40], [5, 45, 20, 55, 30]], np.float32)
    out, pasted = copy_paste_flip(img, boxes, [triangle, centred], 1.0)
    np.testing.assert_array_equal(pasted, [[3, 70, 10, 90, 40]])  # x mirrored: 100 - 30, 100 - 10
    assert (out[15, 85] == (255, 0, 0)).all()  # inside the mirrored triangle (x 70-90: its right angle at 90)
    assert (out[38, 72] == 0).all()  # inside the mirrored box, outside the outline: untouched
    np.testing.assert_array_equal(out[:, :60], img[:, :60])  # the instances themselves stay
    assert (img[15, 85] == 0).all()  # the input is not changed
    # A share: round(0.4 x 2 free instances) = 1, the least overlapping first; 0 pastes nothing.
    third = np.array([[60, 45], [70, 45], [70, 55], [60, 55]], np.float32)  # its mirror (30-40) touches nothing
    boxes3 = np.concatenate([boxes, [[1, 60, 45, 70, 55]]]).astype(np.float32)
    _, some = copy_paste_flip(img, boxes3, [triangle, centred, third], 0.4)
    assert len(some) == 1
    _, nothing = copy_paste_flip(img, boxes3, [triangle, centred, third], 0.0)
    assert len(nothing) == 0


def as_outlines(data: Path) -> None:
    """Rewrite every box row of the dataset as the diamond inscribed in the
    box, a polygon row (its bounding box is the box)."""
    for path in data.parent.glob("labels/*/*.txt"):
        rows = []
        for line in path.read_text().splitlines():
            c, cx, cy, w, h = line.split()
            cx, cy, w, h = map(float, (cx, cy, w, h))
            points = [cx, cy - h / 2, cx + w / 2, cy, cx, cy + h / 2, cx - w / 2, cy]
            rows.append(" ".join([c, *(f"{v:.6f}" for v in points)]))
        path.write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("d")
    boxes = make_shapes(root / "boxes", n_train=16, n_val=2, imgsz=96, classes=3, seed=3)
    outlined = make_shapes(root / "outlined", n_train=16, n_val=2, imgsz=96, classes=3, seed=3)
    as_outlines(outlined)
    return boxes, outlined


def dataset(data: Path, **hyp) -> YoloDataset:
    files = sorted((data.parent / "images" / "train").iterdir())
    return YoloDataset(files, 96, augment=True, hyp=AugmentHyp(**hyp), seed=1, names_count=3)


def items(ds: YoloDataset) -> list:
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("mosaic", [0.0, 1.0])
def test_outlined_labels_get_mirrored_instances_in_training_samples(datasets, mosaic):
    _, outlined = datasets
    assert read_outlines(next(outlined.parent.glob("labels/train/*.txt")), 3)[0].shape == (4, 2)
    plain, pasting = dataset(outlined, mosaic=mosaic), dataset(outlined, mosaic=mosaic, copy_paste=1.0)
    assert pasting.outlines is not None and not any("copy_paste" in p for p in pasting.problems)
    before, after = items(plain), items(pasting)
    more = [len(b[1]) > len(a[1]) for a, b in zip(before, after)]
    assert sum(more) >= len(more) // 2, more  # most samples have an instance free of its mirror
    for i, ((img_a, lab_a, *_), (img_b, lab_b, *_)) in enumerate(zip(before, after)):
        if len(lab_b) == len(lab_a):
            continue
        assert not np.array_equal(img_a.numpy(), img_b.numpy())
        if not mosaic:  # copies of the image's own instances
            assert set(lab_b[:, 0].tolist()) <= set(pasting.labels[i][:, 0].tolist())
    # The same item twice: nothing random is drawn by the paste.
    assert all(np.array_equal(a[0].numpy(), b[0].numpy()) for a, b in zip(after, items(pasting)))


def test_box_labels_paste_nothing_and_say_so_once(datasets):
    boxes, _ = datasets
    plain, pasting = dataset(boxes), dataset(boxes, copy_paste=1.0)
    assert pasting.outlines is None
    said = [p for p in pasting.problems if "copy_paste" in p]
    assert len(said) == 1 and "training labels are boxes, not instance outlines (polygons): nothing is pasted" \
        in said[0]
    for (img_a, lab_a, *_), (img_b, lab_b, *_) in zip(items(plain), items(pasting)):
        assert np.array_equal(img_a.numpy(), img_b.numpy()) and np.array_equal(lab_a.numpy(), lab_b.numpy())


def test_only_flip_is_implemented():
    with pytest.raises(ValueError, match="only flip is implemented"):
        AugmentHyp(copy_paste=0.5, copy_paste_mode="mixup")
