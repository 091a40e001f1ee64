"""copy_paste, ultralytics' Copy-Paste: in its flip mode a sample's
instances pasted again, mirrored, inside their outlines (polygon label
rows), in its mixup mode those of a second sample, where they overlap no
other box much; with box labels nothing is pasted and the one warning says
so. And the outlines' other use: a warp that rotates boxes each outline."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.data.augment import AugmentHyp, copy_paste, copy_paste_flip, warp
from hpcyolo_trainer.data.dataset import YoloDataset, read_outlines


def test_an_instance_is_pasted_mirrored_inside_its_outline_and_one_on_its_own_mirror_is_not():
    img = np.zeros((60, 100, 3), np.uint8)
    triangle = np.array([[10, 10], [30, 10], [10, 40]], np.float32)  # its box: x 10-30, y 10-40
    centred = np.array([[45, 20], [55, 20], [55, 30], [45, 30]], np.float32)  # its mirror is itself
    cv2.fillPoly(img, [triangle.astype(np.int32)], (255, 0, 0))
    cv2.fillPoly(img, [centred.astype(np.int32)], (0, 255, 0))
    boxes = np.array([[3, 10, 10, 30, 40], [5, 45, 20, 55, 30]], np.float32)
    out, pasted, outlines = copy_paste_flip(img, boxes, [triangle, centred], 1.0)
    np.testing.assert_array_equal(pasted, [[3, 70, 10, 90, 40]])  # x mirrored: 100 - 30, 100 - 10
    np.testing.assert_array_equal(outlines[0], [[90, 10], [70, 10], [90, 40]])  # and its outline
    assert (out[15, 85] == (255, 0, 0)).all()  # inside the mirrored triangle (x 70-90: its right angle at 90)
    assert (out[38, 72] == 0).all()  # inside the mirrored box, outside the outline: untouched
    np.testing.assert_array_equal(out[:, :60], img[:, :60])  # the instances themselves stay
    assert (img[15, 85] == 0).all()  # the input is not changed
    # A share: round(0.4 x 2 free instances) = 1, the least overlapping first; 0 pastes nothing.
    third = np.array([[60, 45], [70, 45], [70, 55], [60, 55]], np.float32)  # its mirror (30-40) touches nothing
    boxes3 = np.concatenate([boxes, [[1, 60, 45, 70, 55]]]).astype(np.float32)
    _, some, _ = copy_paste_flip(img, boxes3, [triangle, centred, third], 0.4)
    assert len(some) == 1
    _, nothing, _ = copy_paste_flip(img, boxes3, [triangle, centred, third], 0.0)
    assert len(nothing) == 0


def test_instances_of_a_second_image_are_pasted_inside_their_outlines_where_they_cover_no_box_much():
    img = np.zeros((60, 100, 3), np.uint8)
    source = np.full((60, 100, 3), 200, np.uint8)
    boxes = np.array([[0, 10, 10, 40, 40]], np.float32)
    free = np.array([[60, 10], [90, 10], [60, 40]], np.float32)  # a triangle away from the box
    covering = np.array([[15, 15], [35, 15], [35, 35], [15, 35]], np.float32)  # inside the box: covers 0.44 of it
    source_boxes = np.array([[2, 60, 10, 90, 40], [1, 15, 15, 35, 35]], np.float32)
    out, chosen = copy_paste(img, boxes, source, source_boxes, [free, covering], 1.0)
    assert chosen.tolist() == [0]
    assert (out[15, 65] == 200).all() and (out[35, 85] == 0).all()  # inside the triangle; its box, not its outline
    assert (out[20, 20] == 0).all() and (img == 0).all()  # the covering one is not pasted; the input unchanged


def test_a_rotating_warp_boxes_each_outline_not_its_box():
    """A diamond turned 45 degrees is a square: its box is the square's,
    not the hull of its turned box (twice as wide); part of it off the
    image: the box of its part inside, exactly."""
    diamond = np.array([[50, 30], [70, 50], [50, 70], [30, 50]], np.float64)
    boxes = np.array([[0, 30, 30, 70, 70]], np.float32)
    turn = np.eye(3)
    turn[:2] = cv2.getRotationMatrix2D((50, 50), 45, 1.0)
    img = np.zeros((100, 100, 3), np.uint8)
    _, hull, _, _ = warp(img, boxes, np.array([1600.0]), turn, 1.0, 100)
    _, boxed, outlines, _ = warp(img, boxes, np.array([1600.0]), turn, 1.0, 100, [diamond])
    np.testing.assert_allclose(hull[0, 1:], [50 - 20 * 2 ** 0.5] * 2 + [50 + 20 * 2 ** 0.5] * 2, atol=1e-4)
    np.testing.assert_allclose(boxed[0, 1:], [50 - 10 * 2 ** 0.5] * 2 + [50 + 10 * 2 ** 0.5] * 2, atol=1e-4)
    assert len(outlines) == 1 and outlines[0].shape == (4, 2)
    shift = np.array([[1, 0, -55], [0, 1, 0], [0, 0, 1]], np.float64)  # all but the diamond's right tip off
    _, cut, _, _ = warp(img, boxes, np.array([1600.0]), shift, 0.1, 100, [diamond])
    np.testing.assert_allclose(cut[0, 1:], [0, 35, 15, 65], atol=1e-4)  # the clipped box would be 0, 30, 15, 70


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


def test_mixup_mode_pastes_instances_of_another_sample_and_neither_mode_pastes_once_mosaics_close(datasets):
    _, outlined = datasets
    plain, mixing = dataset(outlined), dataset(outlined, copy_paste=1.0, copy_paste_mode="mixup")
    before, after = items(plain), items(mixing)
    more = [len(b[1]) > len(a[1]) for a, b in zip(before, after)]
    assert sum(more) >= len(more) // 2, more
    assert all(np.array_equal(a[0].numpy(), b[0].numpy()) for a, b in zip(after, items(mixing)))  # no new draw
    for hyp in ({"copy_paste_mode": "mixup"}, {}):  # close_mosaic's epochs: ultralytics turns copy_paste off
        plain, pasting = dataset(outlined, degrees=5.0), dataset(outlined, degrees=5.0, copy_paste=1.0, **hyp)
        plain.mosaic = pasting.mosaic = False
        for (img_a, lab_a, *_), (img_b, lab_b, *_) in zip(items(plain), items(pasting)):
            assert np.array_equal(img_a.numpy(), img_b.numpy()) and np.array_equal(lab_a.numpy(), lab_b.numpy())
    with pytest.raises(ValueError, match="flip or mixup"):
        AugmentHyp(copy_paste=0.5, copy_paste_mode="paste")


def test_rotating_warps_read_the_outlines_and_box_labels_go_on_as_boxes_without_a_word(datasets):
    boxes, outlined = datasets
    assert dataset(outlined, degrees=10.0).outlines is not None and dataset(outlined).outlines is None
    quiet = dataset(boxes, degrees=10.0)
    assert quiet.outlines is None and not any("outline" in p for p in quiet.problems)
    # The same images and draws: a turned diamond's box is tighter than its turned box's hull.
    area = [sum(float((lab[:, 3] * lab[:, 4]).sum()) for _, lab, *_ in items(ds))
            for ds in (dataset(outlined, degrees=10.0), quiet)]
    assert area[0] < 0.95 * area[1], area
