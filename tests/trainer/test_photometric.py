"""The HSV jitter on the device (photometric.py) against the loader's OpenCV
lookup tables, and a dataset that leaves the colours to the device: the same
draws, flips and boxes, and the same colours once the trainer applies them."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hpcyolo_trainer.data.augment import AugmentHyp, apply_hsv, hsv_gains
from hpcyolo_trainer.data.dataset import YoloDataset, collate
from hpcyolo_trainer.data.photometric import gains_of, hsv_jitter_batch

IMGSZ = 96
NC = 3


def make_image(path, k: int) -> None:
    """A 160x120 picture with two coloured boxes and their labels."""
    rng = np.random.default_rng(k)
    img = natural(rng, 120, 160)
    rows = []
    for j, (x1, y1, x2, y2) in enumerate([(10, 10, 60, 50), (80, 40, 150, 110)]):
        img[y1:y2, x1:x2] = rng.integers(0, 256, 3)
        rows.append(f"{(k + j) % NC} {(x1 + x2) / 320} {(y1 + y2) / 240} {(x2 - x1) / 160} {(y2 - y1) / 120}")
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    labels = path.parent.parent / "labels" / f"{path.stem}.txt"
    labels.parent.mkdir(parents=True, exist_ok=True)
    labels.write_text("\n".join(rows) + "\n")


def natural(rng: np.random.Generator, h: int = 96, w: int = 128) -> np.ndarray:
    """Smooth colour gradients with noise, like a photo's pixels."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([127 + 120 * np.sin(xx / rng.uniform(5, 40) + rng.uniform(0, 6)) *
                     np.cos(yy / rng.uniform(5, 40)) for _ in range(3)], axis=-1)
    return np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)


def on_device(img: np.ndarray, gains: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
    out = hsv_jitter_batch(t, torch.tensor(gains, dtype=torch.float32)[None])
    return (out[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()


@pytest.mark.parametrize("kind", ["natural", "noise"])
def test_batch_hsv_matches_the_lookup_tables(kind):
    rng = np.random.default_rng(3)
    hyp = AugmentHyp(hsv_h=0.5, hsv_s=0.9, hsv_v=0.6)  # stronger than the defaults: more to get wrong
    for _ in range(6):
        img = natural(rng) if kind == "natural" else rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)
        gains = hsv_gains(hyp, rng)
        diff = np.abs(apply_hsv(img, gains).astype(int) - on_device(img, gains).astype(int))
        assert diff.mean() < 0.5 and (diff > 3).mean() < 0.02, (gains, diff.mean(), (diff > 3).mean())
        assert np.abs(img.astype(int) - on_device(img, gains).astype(int)).mean() > 2  # it did change colours


def test_each_image_gets_its_own_gains():
    rng = np.random.default_rng(4)
    imgs = [natural(rng) for _ in range(2)]
    gains = np.array([[1.0, 1.5, 0.6], [0.98, 0.4, 1.3]])
    batch = torch.stack([torch.from_numpy(i).permute(2, 0, 1) for i in imgs]).float() / 255
    out = (hsv_jitter_batch(batch, torch.tensor(gains)) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for k in range(2):
        assert np.array_equal(out[k], on_device(imgs[k], gains[k]))
        assert not np.array_equal(out[k], on_device(imgs[k], gains[1 - k]))


def test_a_dataset_leaving_colours_to_the_device_draws_the_same(tmp_path):
    paths = []
    for k in range(6):
        paths.append(tmp_path / "images" / f"{k}.png")
        make_image(paths[-1], k)
    plain = YoloDataset(paths * 2, IMGSZ, augment=True, seed=5, names_count=NC)
    device = YoloDataset(paths * 2, IMGSZ, augment=True, seed=5, names_count=NC, hsv_on_device=True)
    for ds in (plain, device):
        ds.set_epoch(2)
    batch = list(range(10))
    want = collate(plain.__getitems__(batch))
    got = next(iter(DataLoader(device, batch_size=len(batch), num_workers=1, collate_fn=collate)))
    assert torch.equal(want[1], got[1])  # same mosaics, warps and flips: the same boxes
    gains = gains_of(got[3])
    assert gains.shape == (len(batch), 3) and "hsv" not in want[3][0]
    assert not torch.equal(want[0], got[0])  # the colours were left alone...
    coloured = (hsv_jitter_batch(got[0].float() / 255, gains) * 255).round()
    diff = (coloured - want[0].float()).abs()
    assert diff.mean() < 0.5 and (diff > 3).float().mean() < 0.02  # ...and the device gives them back
    grey = YoloDataset(paths, IMGSZ, augment=True, hyp=AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0), names_count=NC,
                       hsv_on_device=True)
    assert gains_of([grey[0][3]]) is None
