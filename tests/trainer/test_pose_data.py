"""Keypoints through the data path (issue 50): the data YAML's kpt_shape,
flip_idx and kpt_oks_sigmas read and checked (one line naming the file and
the key), pose rows read by kpt_shape and kept in the dataset's index, and
every augmentation of the detection path moving each object's keypoints
with its box: on make-dataset's pose set, whose keypoints are each shape's
leftmost, topmost, rightmost and bottommost points, a whole object's
keypoints stay on its box's edges through mosaic, scale, translation,
flips (reordered by flip_idx), mixup, CutMix, letterbox and rectangular
batches, and stay inside its box through rotation, shear and perspective."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common.errors import ConfigError, HpcyoloError
from hpcyolo_trainer.data import index as dataindex
from hpcyolo_trainer.data.dataset import AugmentHyp, YoloDataset, check_files, collate, load_data_spec

IMGSZ = 160
LEFT, TOP, RIGHT, BOTTOM = range(4)  # make-dataset's keypoint order


@pytest.fixture(scope="module")
def pose_set(tmp_path_factory) -> Path:
    return make_shapes(tmp_path_factory.mktemp("pose") / "shapes", n_train=24, n_val=8, imgsz=IMGSZ, task="pose",
                       seed=1)


def with_yaml(data: Path, tmp_path: Path, extra: str) -> Path:
    """The pose set's data.yaml with its keypoint lines replaced by `extra`."""
    text = "".join(line + "\n" for line in data.read_text().splitlines()
                   if not line.startswith(("kpt_shape", "flip_idx")))
    out = tmp_path / "data.yaml"
    out.write_text(text.replace("path: .", f"path: {data.parent}") + extra)
    return out


def test_the_data_yaml_keypoint_keys_are_read(pose_set):
    spec = load_data_spec(pose_set)
    assert (spec.kpt_shape, spec.flip_idx, spec.kpt_oks_sigmas) == ((4, 3), (2, 1, 0, 3), None)


@pytest.mark.parametrize("extra, key, said", [
    ("kpt_shape: [4, 4]\n", "kpt_shape", "must be [keypoints, 2 or 3]"),
    ("kpt_shape: 4\n", "kpt_shape", "must be [keypoints, 2 or 3]"),
    ("kpt_shape: [0, 3]\n", "kpt_shape", "must be [keypoints, 2 or 3]"),
    ("kpt_shape: [4, 3]\nflip_idx: [2, 1, 0, 0]\n", "flip_idx", "is not a permutation of 0..3"),
    ("kpt_shape: [4, 3]\nflip_idx: [1, 0, 2]\n", "flip_idx", "is not a permutation of 0..3"),
    ("kpt_shape: [4, 3]\nkpt_oks_sigmas: [0.1, 0.1]\n", "kpt_oks_sigmas", "must be 4 positive numbers"),
    ("flip_idx: [1, 0]\n", "flip_idx", "without kpt_shape"),
])
def test_a_bad_keypoint_key_is_one_line_naming_file_and_key(pose_set, tmp_path, extra, key, said):
    data = with_yaml(pose_set, tmp_path, extra)
    with pytest.raises(ConfigError) as e:
        load_data_spec(data)
    assert (e.value.file, e.value.key) == (str(data), key) and said in str(e.value) and "\n" not in str(e.value)


def test_pose_rows_are_read_by_kpt_shape_and_kept_in_the_index(pose_set, tmp_path):
    """A pose row's box is its first four numbers (read as a detection row, 17
    numbers would be a polygon's points), its keypoints the rest; the
    dataset's index keeps them, read back equal, and an index made for
    another kpt_shape is not used."""
    spec = load_data_spec(pose_set)
    kept, problems, _ = check_files(list(spec.train), 4, (4, 3))
    assert not problems and kept.keypoints is not None
    for path, labels, points in zip(kept.paths, kept.labels, kept.keypoints):
        rows = [line.split() for line in Path(str(path).replace("images", "labels")).with_suffix(".txt")
                .read_text().splitlines()]
        np.testing.assert_allclose(labels, np.array([r[:5] for r in rows], np.float32).reshape(-1, 5), atol=1e-6)
        np.testing.assert_allclose(points, np.array([r[5:] for r in rows], np.float32).reshape(-1, 4, 3), atol=1e-6)
    assert any(p[..., 2].min() == 0 for p in kept.keypoints if len(p))  # some keypoints outside their image
    file = tmp_path / "index.npz"
    results, index, checked, _ = dataindex.refresh(spec.train, 4, spec.root, file, kpt_shape=(4, 3))
    assert checked == len(spec.train)
    dataindex.write(file, index)
    again, index, checked, _ = dataindex.refresh(spec.train, 4, spec.root, file, kpt_shape=(4, 3))
    assert index is None and checked == 0  # current: nothing checked again
    sifted = again.sift()[0]
    for a, b in zip(sifted.keypoints, kept.keypoints):
        np.testing.assert_array_equal(a, b)
    _, index, checked, _ = dataindex.refresh(spec.train, 4, spec.root, file)  # rows read as detection's
    assert checked == len(spec.train) and index.keypoints is None


@pytest.mark.parametrize("row, said", [
    ("1 0.5 0.5 0.2 0.2 0.4 0.5 2 0.5 0.4 2 0.6 0.5 2", "14 numbers (kpt_shape [4, 3]: 5 + 12)"),
    ("1 0.5 0.5 0.2 0.2 0.4 0.5 2 0.5 0.4 5 0.6 0.5 2 0.5 0.6 2", "keypoint visibility 5 is not 0, 1 or 2"),
])
def test_a_bad_pose_row_stops_the_dataset_in_one_line_naming_file_and_line(pose_set, tmp_path, row, said):
    shutil.copytree(pose_set.parent, tmp_path / "set")
    label = sorted((tmp_path / "set" / "labels" / "train").glob("*.txt"))[3]
    number = len(label.read_text().splitlines()) + 1
    label.write_text(label.read_text() + row + "\n")
    spec = load_data_spec(tmp_path / "set" / "data.yaml")
    with pytest.raises(HpcyoloError) as e:
        YoloDataset(spec.train, IMGSZ, augment=True, names_count=4, kpt_shape=(4, 3), flip_idx=(2, 1, 0, 3))
    assert str(e.value).startswith(f"{label}:{number}: malformed pose row ({said})") and "\n" not in str(e.value)


def items(ds: YoloDataset, epochs: int = 3):
    """Every item of `epochs` epochs: (image size (h, w), boxes xyxy in pixels, classes, keypoints in pixels)."""
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            img, (rows, points), _, _ = ds[i]
            h, w = img.shape[1:]
            rows, points = rows.numpy(), points.numpy()
            cx, cy, bw, bh = rows[:, 1] * w, rows[:, 2] * h, rows[:, 3] * w, rows[:, 4] * h
            boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
            yield (h, w), boxes, points * np.array([w, h, 1.0], np.float32)


def on_edges(ds: YoloDataset, tol: float = 2.5) -> int:
    """Assert that each object with all four keypoints labelled and a box
    wider and taller than 8 px has its leftmost keypoint on its box's left
    edge, the topmost on the top edge, and so on; the count of such objects."""
    seen = 0
    for _, boxes, points in items(ds):
        assert len(boxes) == len(points)
        for box, p in zip(boxes, points):
            if p[:, 2].min() == 0 or min(box[2] - box[0], box[3] - box[1]) <= 8:
                continue
            seen += 1
            edges = [p[LEFT, 0] - box[0], p[TOP, 1] - box[1], box[2] - p[RIGHT, 0], box[3] - p[BOTTOM, 1]]
            assert np.abs(edges).max() < tol, (box, p)
    return seen


@pytest.mark.parametrize("hyp", [
    {},  # ultralytics' defaults: mosaic, scale 0.5, translate 0.1, fliplr 0.5
    {"mosaic": 0.0, "fliplr": 1.0, "scale": 0.3},
    {"mixup": 0.8, "cutmix": 0.8, "flipud": 0.0},
])
def test_keypoints_stay_on_their_box_edges_through_the_augmentations(pose_set, hyp):
    spec = load_data_spec(pose_set)
    ds = YoloDataset(spec.train, IMGSZ, augment=True, hyp=AugmentHyp(**hyp), names_count=4, kpt_shape=(4, 3),
                     flip_idx=spec.flip_idx)
    assert on_edges(ds) >= 30


def test_a_flip_without_flip_idx_would_swap_the_keypoints(pose_set):
    """The check above can fail: flipped but not reordered (an identity
    flip_idx), the leftmost keypoint ends on the right edge."""
    spec = load_data_spec(pose_set)
    ds = YoloDataset(spec.train, IMGSZ, augment=True, hyp=AugmentHyp(mosaic=0.0, fliplr=1.0), names_count=4,
                     kpt_shape=(4, 3), flip_idx=(0, 1, 2, 3))
    with pytest.raises(AssertionError):
        on_edges(ds)


def test_no_flip_idx_turns_both_flips_off_as_ultralytics(pose_set):
    spec = load_data_spec(pose_set)
    ds = YoloDataset(spec.train, IMGSZ, augment=True, hyp=AugmentHyp(mosaic=0.0, fliplr=1.0, flipud=0.5),
                     names_count=4, kpt_shape=(4, 3))
    assert (ds.hyp.fliplr, ds.hyp.flipud) == (0.0, 0.0)
    assert any("no flip_idx" in p and "fliplr and flipud are off" in p for p in ds.problems)
    assert on_edges(ds) >= 30


def test_warped_keypoints_stay_inside_their_boxes_and_the_image(pose_set):
    """Rotation, shear and perspective, in mosaics and alone: every labelled
    keypoint inside its (warped, clipped) box and the image; those the warp
    takes out of the image unlabelled."""
    spec = load_data_spec(pose_set)
    ds = YoloDataset(spec.train, IMGSZ, augment=True, names_count=4, kpt_shape=(4, 3), flip_idx=spec.flip_idx,
                     hyp=AugmentHyp(mosaic=0.5, degrees=30.0, shear=5.0, perspective=0.0005, mixup=0.3))
    labelled = unlabelled = 0
    for (h, w), boxes, points in items(ds):
        for box, p in zip(boxes, points):
            shown = p[:, 2] > 0
            labelled += int(shown.sum())
            unlabelled += int((~shown).sum())
            assert (p[shown, 0] >= box[0] - 1.5).all() and (p[shown, 0] <= box[2] + 1.5).all()
            assert (p[shown, 1] >= box[1] - 1.5).all() and (p[shown, 1] <= box[3] + 1.5).all()
            assert (p[:, 0] >= 0).all() and (p[:, 0] <= w).all() and (p[:, 1] >= 0).all() and (p[:, 1] <= h).all()
    assert labelled > 200 and unlabelled > 10


@pytest.mark.parametrize("rect", [False, True])
def test_validation_items_letterbox_keypoints_with_their_boxes(pose_set, rect):
    spec = load_data_spec(pose_set)
    ds = YoloDataset(spec.val, IMGSZ, augment=False, names_count=4, kpt_shape=(4, 3), rect_batch=4 if rect else 0)
    assert on_edges(ds) >= 5
    batch = collate([ds[i] for i in range(4)])
    rows, points = batch[1]
    assert points.shape == (len(rows), 4, 3) and rows.shape[1] == 6


def test_a_staged_copy_keeps_the_keypoint_keys_and_reads_the_sources_index(pose_set, tmp_path, monkeypatch):
    """hpcyolo stage's copy: its data.yaml keeps kpt_shape and flip_idx, and
    a run on it starts from the index of the source in the user's cache
    (nothing checked again), the same keypoints."""
    from hpcyolo.node import stage

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = load_data_spec(pose_set)
    shared = lambda spec, yaml: (lambda: dataindex.shared_file(spec.root, "train", yaml))  # noqa: E731
    source, index, checked, _ = dataindex.refresh(spec.train, 4, spec.root, tmp_path / "a.npz",
                                                  shared=shared(spec, pose_set), keep=True, kpt_shape=(4, 3))
    assert checked == len(spec.train)
    staged_yaml = stage.stage(pose_set, tmp_path / "scratch" / "data")
    staged = load_data_spec(staged_yaml)
    assert (staged.kpt_shape, staged.flip_idx) == (spec.kpt_shape, spec.flip_idx) and staged.root != spec.root
    copy, index, checked, _ = dataindex.refresh(staged.train, 4, staged.root, tmp_path / "b.npz",
                                                shared=shared(staged, staged_yaml), kpt_shape=(4, 3))
    assert checked == 0 and index.origin is not None
    for a, b in zip(copy.sift()[0].keypoints, source.sift()[0].keypoints):
        np.testing.assert_array_equal(a, b)
