"""A classification dataset in ultralytics' folder layout: its classes and
images, the one-line errors of a bad layout, and the transforms (the
validation's resize and centre crop; the training's draws fixed by seed,
epoch and image)."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common.datayaml import classify_spec, folder_class, load_data_spec
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.data.classify import ClassifyDataset, ClassifyHyp, crop_box, train_transform, val_transform


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    return make_shapes(tmp_path_factory.mktemp("cls") / "shapes", n_train=9, n_val=6, imgsz=64, classes=3, seed=5,
                       task="classify")


def test_class_names_are_the_sorted_train_folders_and_each_image_has_its_folders_class(folders):
    spec = load_data_spec(folders)
    assert spec.folders and spec.names == sorted(p.name for p in (folders / "train").iterdir())
    assert len(spec.train) == 9 and len(spec.val) == 6 and spec.test is None
    for image in spec.train:
        assert spec.names[folder_class(str(image), spec.names)] == image.parent.name
    assert load_data_spec(folders, listed=False).train is None  # a rank but 0: the names alone
    data = ClassifyDataset(spec.val, spec.names, 32)
    assert [spec.names[c] for c in data.classes] == [Path(p).parent.name for p in data.paths]
    img, target, path, _ = data[0]
    assert img.shape == (3, 32, 32) and target.tolist() == [[float(data.classes[0])]] and path == data.paths[0]


def test_test_folder_stands_for_a_missing_val_folder(folders, tmp_path):
    copy = shutil.copytree(folders, tmp_path / "copy")
    (copy / "val").rename(copy / "test")
    assert [p.parent.parent.name for p in classify_spec(copy).val] == ["test"] * 6


@pytest.mark.parametrize("breakage, words", [
    (lambda d: shutil.rmtree(d / "train"), "there is no train/ folder"),
    (lambda d: shutil.rmtree(d / "val"), "there is neither val/ nor test/"),
    (lambda d: [shutil.rmtree(p) for p in (d / "train").iterdir()], "train: no class folders"),
    (lambda d: shutil.rmtree(d / "val" / "circle"), "val: no folder for class 'circle'"),
    (lambda d: (d / "val" / "hexagon").mkdir(), "val: class 'hexagon' is not among train/'s"),
    (lambda d: [p.unlink() for p in (d / "train" / "square").iterdir()], "train/square: no images"),
])
def test_a_bad_layout_is_one_line_naming_the_folder(folders, tmp_path, breakage, words):
    copy = shutil.copytree(folders, tmp_path / "copy")
    breakage(copy)
    with pytest.raises(HpcyoloError) as e:
        load_data_spec(copy)
    assert words in str(e.value) and str(copy) in str(e.value) and "\n" not in str(e.value)


def test_val_transform_resizes_the_shorter_side_and_keeps_the_centre():
    """A 40 x 80 image of three vertical bands (20, 40 and 20 px): resized to
    32 x 64, its centre 32 x 32 is the middle band (the filter blends the
    outer columns with the black bands beside)."""
    img = np.zeros((40, 80, 3), np.uint8)
    img[:, 20:60] = (200, 100, 50)
    out = val_transform(img, 32)
    assert out.shape == (32, 32, 3)
    assert (np.abs(out[:, 1:-1].astype(int) - (200, 100, 50)) <= 1).all() and (out[:, [0, -1]] < 200).all()
    tall = val_transform(np.ascontiguousarray(img.transpose(1, 0, 2)), 32)
    assert (np.abs(tall[1:-1].astype(int) - (200, 100, 50)) <= 1).all() and (tall[[0, -1]] < 200).all()


def test_random_crops_keep_to_their_area_and_aspect_ranges():
    rng = np.random.default_rng(0)
    for _ in range(200):
        top, left, h, w = crop_box(60, 90, (0.5, 1.0), rng)
        assert 0 <= top and top + h <= 60 and 0 <= left and left + w <= 90
        assert 0.5 * 60 * 90 * 0.95 <= h * w <= 60 * 90 and 3 / 4 * 0.95 <= w / h <= 4 / 3 * 1.05


def test_training_draws_follow_seed_epoch_and_image_alone(folders):
    spec = load_data_spec(folders)
    data = ClassifyDataset(spec.train, spec.names, 48, augment=True, hyp=ClassifyHyp(erasing=0.5), seed=3)
    again = ClassifyDataset(spec.train, spec.names, 48, augment=True, hyp=ClassifyHyp(erasing=0.5), seed=3)
    a = data.image(2, epoch=1)
    assert a.shape == (48, 48, 3) and np.array_equal(a, again.image(2, epoch=1))
    assert not np.array_equal(a, data.image(2, epoch=2))
    assert not np.array_equal(a, ClassifyDataset(spec.train, spec.names, 48, augment=True, hyp=ClassifyHyp(),
                                                 seed=4).image(2, epoch=1))


def test_randaugment_takes_the_colour_jitters_place_and_is_drawn_from_the_same_seed(folders):
    spec = load_data_spec(folders)
    rand = ClassifyHyp(auto_augment="randaugment", erasing=0.0)
    data = ClassifyDataset(spec.train, spec.names, 48, augment=True, hyp=rand, seed=3)
    jitter = ClassifyDataset(spec.train, spec.names, 48, augment=True, hyp=ClassifyHyp(erasing=0.0), seed=3)
    a = data.image(4, epoch=0)
    assert np.array_equal(a, ClassifyDataset(spec.train, spec.names, 48, augment=True, hyp=rand, seed=3).image(4, 0))
    assert not np.array_equal(a, jitter.image(4, epoch=0))
    ops = [data.image(i, epoch=e) for i in range(len(data)) for e in range(3)]
    assert len({o.tobytes() for o in ops}) == len(ops)  # every image and epoch drawn anew


def test_with_every_augmentation_off_a_training_image_is_the_whole_image_resized(folders):
    """scale 0 keeps the crop's area the whole image's: a square image is taken whole."""
    image = sorted((folders / "train").rglob("*.jpg"))[0]
    rgb = cv2.cvtColor(cv2.imread(str(image)), cv2.COLOR_BGR2RGB)
    off = ClassifyHyp(scale=0.0, fliplr=0.0, flipud=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, erasing=0.0)
    out = train_transform(rgb, 32, off, np.random.default_rng(0))
    assert np.array_equal(out, val_transform(rgb, 32))
    flipped = train_transform(rgb, 32, ClassifyHyp(scale=0.0, fliplr=1.0, hsv_h=0, hsv_s=0, hsv_v=0, erasing=0),
                              np.random.default_rng(0))
    assert np.array_equal(flipped, out[:, ::-1])
    erased = train_transform(rgb, 32, ClassifyHyp(scale=0.0, fliplr=0.0, hsv_h=0, hsv_s=0, hsv_v=0, erasing=1.0),
                             np.random.default_rng(0))
    changed = (erased != out).any(2)
    assert changed.any() and (erased[changed] == 0).all()


def test_a_fraction_of_a_class_folder_set_is_spread_over_its_classes_as_ultralytics_takes_it(folders):
    """ultralytics' ClassificationDataset keeps np.linspace(0, n - 1, count, dtype=int) of its samples."""
    from hpcyolo_trainer.common.datayaml import training_files

    spec = load_data_spec(folders)
    for fraction in (0.1, 0.34, 0.5, 0.9):
        count = max(1, round(len(spec.train) * fraction))
        kept = training_files(spec.train, fraction, spread=True)
        assert kept == [spec.train[i] for i in np.linspace(0, len(spec.train) - 1, count, dtype=int)]
    assert {p.parent.name for p in training_files(spec.train, 0.34, spread=True)} == set(spec.names)
    assert {p.parent.name for p in training_files(spec.train, 0.34)} == {spec.names[0]}  # a YAML's rule: the first
    for n in range(1, 60):
        for fraction in (0.01, 0.3, 0.77):
            count = max(1, round(n * fraction))
            assert training_files(list(range(n)), fraction, spread=True) == \
                np.linspace(0, n - 1, count, dtype=int).tolist()
