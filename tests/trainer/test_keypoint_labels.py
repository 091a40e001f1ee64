"""Pose label rows and keypoint flips against ultralytics' own reading and
flipping (tests/reference/ultralytics/keypoints.json, written by
benchmarks/ultralytics_reference.py `keypoints`): the rows it keeps give its
keypoints, the rows it refuses are refused in one line; its RandomFlip with a
flip_idx, horizontal and vertical; its random perspective's warp and its
clip to the image. Beyond ultralytics, issue 50's refusals:
a visibility outside {0, 1, 2}, a flip_idx that is not a permutation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO

from hpcyolo_trainer.data.keypoints import (check_flip_idx, clip_keypoints, flip_keypoints, parse_pose_row,
                                            warp_keypoints)

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "keypoints.json").read_text())


@pytest.mark.parametrize("case", range(len(REFERENCE["rows"])))
def test_a_pose_row_reads_as_ultralytics_reads_it(case):
    ref = REFERENCE["rows"][case]
    parsed = parse_pose_row(ref["row"], 3, tuple(ref["kpt_shape"]))
    if ref["corrupt"]:
        assert isinstance(parsed, str) and "\n" not in parsed, parsed
        return
    if any(v not in (0, 1, 2) for *_, v in ref["keypoints"]):  # ultralytics keeps visibility 5; hpcyolo refuses it
        assert parsed == "keypoint visibility 5 is not 0, 1 or 2"
        return
    assert not isinstance(parsed, str), parsed
    row, keypoints = parsed
    np.testing.assert_allclose(keypoints, np.array(ref["keypoints"]), rtol=0, atol=1e-7)
    np.testing.assert_allclose(row, [float(v) for v in ref["row"].split()[:5]], atol=1e-7)


def test_the_cases_cover_kept_and_refused_rows():
    kept = [r for r in REFERENCE["rows"] if not r["corrupt"]]
    assert len(kept) >= 2 and len(REFERENCE["rows"]) - len(kept) >= 3
    assert any(r["keypoints"][2][2] == 0 for r in kept)  # an unlabelled keypoint kept as 0 0 0


@pytest.mark.parametrize("direction, axis, size", [("horizontal", 0, 96), ("vertical", 1, 64)])
def test_flips_move_keypoints_as_ultralytics_randomflip(direction, axis, size):
    """Mirrored and reordered by flip_idx, on either flip (ultralytics 8.4.190 reorders on both)."""
    keypoints = np.array(REFERENCE["flips"]["input"], dtype=np.float32)
    ours = flip_keypoints(keypoints, size, REFERENCE["flip_idx"], axis)
    theirs = np.array(REFERENCE["flips"][direction])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    assert not np.allclose(theirs, keypoints)


@pytest.mark.parametrize("flip_idx, said", [
    ([1, 0, 2], None), (None, None), ([1, 0], "is not a permutation of 0..2"), ([1, 1, 2], "is not a permutation"),
    ([0, 1, 3], "is not a permutation"), ("0 1 2", "must be a list of keypoint indices"),
    ([0, 1.0, 2], "must be a list of keypoint indices")])
def test_flip_idx_must_reorder_every_keypoint(flip_idx, said):
    problem = check_flip_idx(flip_idx, 3)
    assert problem is None if said is None else said in problem


@pytest.mark.parametrize("kind", ["affine", "perspective"])
def test_a_warp_moves_keypoints_as_ultralytics_randomperspective(kind):
    """Moved by the matrix; those that leave the image unlabelled, as ultralytics' apply_keypoints."""
    warps = REFERENCE["warps"]
    keypoints = np.array(REFERENCE["flips"]["input"], dtype=np.float32)
    ours = warp_keypoints(keypoints, np.array(warps[kind], dtype=np.float32), tuple(warps["size"]))
    theirs = np.array(warps[f"{kind}_out"])
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)
    assert (theirs[..., 2] == 0).sum() > (keypoints[..., 2] == 0).sum()  # some left the image
    assert warp_keypoints(keypoints[:0], np.eye(3), (10, 10)).shape == (0, 5, 3)


def test_clipping_keypoints_to_the_image_as_ultralytics_instances_clip():
    warps = REFERENCE["warps"]
    ours = clip_keypoints(np.array(warps["affine_out"], dtype=np.float32), *warps["size"])
    np.testing.assert_allclose(ours, np.array(warps["clipped"]), rtol=1e-6, atol=1e-5)
    assert not np.allclose(np.array(warps["clipped"]), np.array(warps["affine_out"]))  # some were outside
