"""Multi-scale sizes: a pure function of (seed, batch number), in range, on the stride."""

from __future__ import annotations

import torch

from hpcyolo_trainer.data.multiscale import rescale, step_size


def test_step_size_is_a_function_of_seed_and_batch_in_range_on_the_stride():
    sizes = [step_size(640, 0.5, 3, k) for k in range(200)]
    assert sizes == [step_size(640, 0.5, 3, k) for k in range(200)]  # another process, rank or resume: the same
    assert sizes != [step_size(640, 0.5, 4, k) for k in range(200)]
    assert all(s % 32 == 0 and 320 <= s <= 960 for s in sizes) and len(set(sizes)) > 10
    assert {step_size(64, 0.9, 0, k) for k in range(100)} >= {32}  # never below one stride


def test_rescale_keeps_a_rectangular_batch_aspect():
    imgs = torch.rand(2, 3, 96, 160)
    assert rescale(imgs, 320, 160).shape == (2, 3, 192, 320)
    assert rescale(imgs, 160, 160) is imgs
