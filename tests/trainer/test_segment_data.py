"""A segmentation's polygons through every augmentation of the detection
path: after mosaic, the affine warp with rotation, shear and perspective,
flips, copy-paste (both modes), mixup and cutmix, each instance's mask
(rasterised from its outline, as ultralytics' Format does) lies inside its
box and fills a shape's share of it, so that outlines and boxes moved
together; the batch's layout is ultralytics' (overlap maps or one mask per
object); a box row in a segmentation's labels is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.data.dataset import AugmentHyp, YoloDataset, collate, load_data_spec

IMGSZ, RATIO = 96, 2
HYPS = {
    "mosaic": {},  # ultralytics' defaults: mosaic, scale 0.5, translate 0.1, fliplr 0.5
    "warp": {"mosaic": 0.0, "degrees": 30.0, "shear": 5.0, "perspective": 0.0005, "flipud": 0.5},
    "mosaic-warp-paste": {"degrees": 20.0, "shear": 3.0, "copy_paste": 0.8},
    "mixup-paste": {"copy_paste": 1.0, "copy_paste_mode": "mixup", "mixup": 1.0},
    "cutmix": {"cutmix": 1.0, "flipud": 0.5},
}


@pytest.fixture(scope="module")
def seg_yaml(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("seg") / "shapes", n_train=16, n_val=4, imgsz=IMGSZ, task="segment",
                       seed=5)


def dataset(yaml, hyp: dict, overlap: bool, augment: bool = True) -> YoloDataset:
    spec = load_data_spec(yaml)
    return YoloDataset(spec.train, IMGSZ, augment=augment, hyp=AugmentHyp(**hyp), seed=2, names_count=4,
                       segments=True, mask_ratio=RATIO, overlap_mask=overlap)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "per-object"])
@pytest.mark.parametrize("name", HYPS)
def test_each_instance_mask_lies_in_its_box_and_fills_it_after_the_augmentations(seg_yaml, name, overlap):
    ds = dataset(seg_yaml, HYPS[name], overlap)
    checked = 0
    for epoch in range(2):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            img, (rows, masks), _, _ = ds[i]
            h, w = img.shape[1:]
            assert masks.shape[-2:] == (h // RATIO, w // RATIO)
            per = [masks == k + 1 for k in range(len(rows))] if overlap else list(masks.bool())
            assert len(per) == len(rows) and (not overlap or masks.dim() == 2)
            for row, mask in zip(rows.numpy(), per):
                cx, cy, bw, bh = row[1:] * (w, h, w, h)
                ys, xs = np.nonzero(mask.numpy())
                area = mask.sum().item() * RATIO * RATIO
                if overlap and bw * bh > 0 and area < 0.05 * bw * bh:
                    continue  # mostly hidden under a smaller instance drawn over it
                assert len(xs), (name, i, row)
                tol = RATIO + 1.5
                assert xs.min() * RATIO >= cx - bw / 2 - tol and (xs.max() + 1) * RATIO <= cx + bw / 2 + tol, \
                    (name, i, row, xs.min(), xs.max())
                assert ys.min() * RATIO >= cy - bh / 2 - tol and (ys.max() + 1) * RATIO <= cy + bh / 2 + tol, \
                    (name, i, row, ys.min(), ys.max())
                if not overlap and bw > 6 * RATIO and bh > 6 * RATIO:
                    assert area >= 0.25 * bw * bh, (name, i, row, area)  # a shape fills a share of its box
                checked += 1
    assert checked > 40


def test_a_batch_holds_ultralytics_layouts_of_the_same_masks(seg_yaml):
    """Per object: [M, h, w] in the labels' order. Overlapping: [B, h, w],
    pixel k marking the image's k-th object, the objects sorted by mask area,
    largest first, each drawn over the ones before."""
    items = range(6)
    _, (rows, masks), _, _ = collate([dataset(seg_yaml, {}, overlap=False, augment=False)[i] for i in items])
    imgs, (rows_o, maps), _, _ = collate([dataset(seg_yaml, {}, overlap=True, augment=False)[i] for i in items])
    assert imgs.shape == (6, 3, IMGSZ, IMGSZ) and rows.shape == rows_o.shape and rows.shape[1] == 6
    assert masks.shape == (len(rows), IMGSZ // RATIO, IMGSZ // RATIO) and masks.dtype == torch.uint8
    assert maps.shape == (6, IMGSZ // RATIO, IMGSZ // RATIO)
    assert sum(int((rows[:, 0] == k).sum()) > 1 for k in items) >= 2  # images with several objects
    for k in items:
        mine = rows[:, 0] == k
        order = torch.argsort(-masks[mine].sum(dim=(1, 2)), stable=True)
        assert torch.equal(rows_o[rows_o[:, 0] == k], rows[mine][order])
        expected = torch.zeros_like(maps[k])
        for j, m in enumerate(masks[mine][order]):
            expected = torch.maximum(expected, m.to(expected.dtype) * (j + 1))
        assert torch.equal(maps[k], expected)


def test_a_box_row_in_a_segmentations_labels_is_refused_in_one_line(seg_yaml, tmp_path):
    spec = load_data_spec(seg_yaml)
    label = next(p for p in sorted((seg_yaml.parent / "labels" / "train").iterdir()) if p.read_text().strip())
    copy = tmp_path / "labels"
    import shutil

    shutil.copytree(seg_yaml.parent, tmp_path / "set")
    label = tmp_path / "set" / "labels" / "train" / label.name
    rows = label.read_text().splitlines()
    label.write_text("\n".join(["", *rows, "not a row", "1 0.5 0.5 0.2 0.2"]) + "\n")  # the box on line len + 3
    files = [tmp_path / "set" / "images" / "train" / p.name for p in spec.train]
    with pytest.raises(HpcyoloError) as e:
        YoloDataset(files, IMGSZ, augment=True, names_count=4, segments=True)
    assert str(e.value).count("\n") == 0 and str(e.value).startswith(f"{label}:{len(rows) + 3}: a box")
    assert not copy.exists()


@pytest.mark.parametrize("case", ["box-row", "yolo11-end2end"])
def test_a_segment_run_that_cannot_train_is_one_line_before_anything_is_written(seg_yaml, tmp_path, case):
    """A box among the polygons, or a YOLO11 segmenter asked to validate
    NMS-free (--end2end: it has no one-to-one head, YOLO26's):
    `hpcyolo train --task segment` says so in one line and leaves no run
    directory."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    data, model, extra = seg_yaml, "yolo11n", []
    if case == "box-row":
        shutil.copytree(seg_yaml.parent, tmp_path / "set")
        label = sorted((tmp_path / "set" / "labels" / "train").glob("*.txt"))[0]
        label.write_text(label.read_text() + "2 0.5 0.5 0.25 0.25\n")
        data = tmp_path / "set" / "data.yaml"
    else:
        model, extra = "yolo11n", ["--end2end"]
    r = subprocess.run([str(Path(sys.executable).parent / "hpcyolo"), "train", "--run-dir", str(tmp_path / "run"),
                        "--data", str(data), "--task", "segment", "--model", model, "--epochs", "1", "--imgsz", "96",
                        "--batch", "4", "--workers", "0", *extra], capture_output=True, text=True)
    assert r.returncode == 1 and not (tmp_path / "run").exists(), r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("hpcyolo: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert (": a box (class cx cy w h)" in errors[0]) if case == "box-row" else \
        ("yolo11n has no one-to-one head" in errors[0])
