"""Polygon labels rasterised as ultralytics does for its segmentation loss,
against ultralytics' own polygons2masks_overlap and polygons2masks
(tests/reference/ultralytics/masks.npz, written by
benchmarks/ultralytics_reference.py `masks` in the benchmark venv from the
polygons its `mask_polygons` makes): overlapping, nested, a sliver, one
partly outside the image, one of zero area; mask ratios 1 and 4."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO
from test_task_models import reference_script

from hpcyolo_trainer.data.masks import instance_masks, overlap_masks, semantic

REFERENCE = np.load(REPO / "tests" / "reference" / "ultralytics" / "masks.npz")


@pytest.mark.parametrize("ratio", [1, 4])
def test_masks_equal_ultralytics(ratio):
    script = reference_script()
    polygons = script.mask_polygons()
    overlap, order = overlap_masks(script.MASK_HW, polygons, ratio)
    assert overlap.dtype == REFERENCE[f"overlap_{ratio}"].dtype
    assert np.array_equal(overlap, REFERENCE[f"overlap_{ratio}"])
    assert np.array_equal(order, REFERENCE[f"order_{ratio}"])
    assert np.array_equal(instance_masks(script.MASK_HW, polygons, ratio), REFERENCE[f"instances_{ratio}"])
    assert len(np.unique(overlap)) > 5  # the instances show through one another: the test compares something


def test_semantic_map_is_each_pixels_instance_class():
    overlap = np.array([[0, 1, 2], [2, 2, 1]], np.uint8)
    classes = np.array([4, 7])  # the instances in the map's order
    sem = semantic(overlap, classes)
    assert sem[0, 1] == 4 and sem[0, 2] == 7 and sem[1, 2] == 4
    assert sem.dtype == np.float32 and semantic(overlap, np.zeros(0)).sum() == 0
