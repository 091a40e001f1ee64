"""Plots: results.csv -> PNG, and detection overlays."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from hpcyolo_trainer.report.plots import PALETTE, draw_detections, plot_results, save_image

HEADER = (
    "epoch,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision,"
    "metrics/recall,metrics/mAP50,metrics/mAP50-95,lr,time\n"
)


def write_results(path, rows: int = 4) -> None:
    lines = [HEADER]
    for e in range(1, rows + 1):
        lines.append(f"{e},{2 / e:.4f},{3 / e:.4f},{1.5 / e:.4f},{0.1 * e},{0.12 * e},{0.08 * e},{0.05 * e},0.01,{60 * e}\n")
    path.write_text("".join(lines))


def test_results_csv_to_png(tmp_path):
    csv_path, png = tmp_path / "results.csv", tmp_path / "results.png"
    write_results(csv_path)
    plot_results(csv_path, png)
    with Image.open(png) as im:
        im.verify()  # a complete, valid PNG
    with Image.open(png) as im:
        assert im.format == "PNG"
        assert im.width > 600 and im.height > 300  # 9 plots in a 5x2 grid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.png"]  # no temp left


def test_results_csv_with_optional_and_padded_columns(tmp_path):
    # A val/box_loss column, space-padded headers and cells, an empty cell and a
    # text column: all must plot without error (the text column is skipped).
    csv_path, png = tmp_path / "results.csv", tmp_path / "out" / "results.png"
    csv_path.write_text(
        " epoch, train/box_loss, val/box_loss, metrics/mAP50, note\n"
        "     1,          2.0,             ,          0.1, warmup\n"
        "     2,          1.5,          1.7,          0.2, ok\n"
    )
    plot_results(csv_path, png)
    with Image.open(png) as im:
        assert im.size[0] > 300


def test_overwrites_an_existing_png(tmp_path):
    csv_path, png = tmp_path / "results.csv", tmp_path / "results.png"
    csv_path.write_text("epoch,train/box_loss\n1,2.0\n")
    plot_results(csv_path, png)
    csv_path.write_text("epoch,train/box_loss\n1,2.0\n2,1.5\n")
    plot_results(csv_path, png)  # the epoch-by-epoch use: replace in place
    with Image.open(png) as im:
        im.verify()


def test_drawing_a_box_changes_its_border_only():
    img = np.zeros((200, 300, 3), np.uint8)
    out = draw_detections(img, np.array([[50, 80, 150, 160]]), np.array([2]), np.array([0.87]), ["a", "b", "c"])
    assert out.shape == img.shape and out.dtype == np.uint8
    assert not img.any()  # the input is left untouched
    colour = PALETTE[2]
    for y, x in [(80, 100), (160, 100), (120, 50), (120, 150)]:  # top, bottom, left, right edge
        assert tuple(out[y, x]) == colour
    assert not out[120, 100].any()  # the box's inside stays clear
    assert out[50:80, 50:150].any()  # the label tag sits above the box


def test_label_without_confidence_and_boxes_off_the_image():
    img = np.full((64, 64, 3), 255, np.uint8)
    out = draw_detections(img, [[-10, -10, 30, 30], [70, 70, 50, 50]], [0, 7], None, ["person"])
    assert (out != 255).any()


def test_rejects_a_non_rgb_image():
    with pytest.raises(ValueError, match="HxWx3"):
        draw_detections(np.zeros((8, 8), np.uint8), [], [], None, [])


def test_save_image_round_trip(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    save_image(img, tmp_path / "x.png")
    with Image.open(tmp_path / "x.png") as im:
        assert np.array_equal(np.asarray(im.convert("RGB")), img)
