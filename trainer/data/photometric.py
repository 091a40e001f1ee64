"""The HSV jitter on the device, for a whole batch at once.

On a GPU node the loader draws each training image's hue, saturation and
value gains (augment.hsv_gains, the same draws as on the CPU) but leaves the
pixels alone, and the trainer applies them here to the batch on the GPU: the
colour-space round trip is a third of a loader worker's time per image on
the CPU (benchmarks/bench_loader.py) and microseconds per image on a GPU.

The arithmetic is augment.apply_hsv's in floating point: OpenCV's 8-bit
HSV (hue in 0..180, wrapping; saturation and value clipped at the top), the
result rounded to the 8-bit grid. It differs from the CPU's lookup tables by
their rounding (a grey level on average, a few at most).
"""

from __future__ import annotations

import torch


def hsv_jitter_batch(imgs: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """imgs float [B, 3, H, W] RGB in 0..1; gains [B, 3] (hue, saturation,
    value), one row per image. Returns a new tensor of the same shape."""
    g = gains.to(imgs.device, imgs.dtype, non_blocking=True)[:, :, None, None]  # no wait for the GPU
    r, gr, b = imgs[:, 0:1], imgs[:, 1:2], imgs[:, 2:3]
    v = imgs.amax(1, keepdim=True)
    delta = v - imgs.amin(1, keepdim=True)
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    # Hue in OpenCV's 8-bit units: 30 per sextant, 180 around.
    hue = torch.where(v == r, (gr - b) / safe, torch.where(v == gr, 2 + (b - r) / safe, 4 + (r - gr) / safe))
    # OpenCV's 8-bit HSV, then its lookup tables' truncation (augment.apply_hsv).
    hue = torch.where(delta > 0, hue * 30, torch.zeros_like(hue)).round().remainder(180)
    sat = torch.where(v > 0, delta / torch.where(v > 0, v, torch.ones_like(v)), torch.zeros_like(v))
    hue = (hue * g[:, 0:1]).remainder(180).floor()
    sat = ((sat * 255).round() * g[:, 1:2]).clamp(0, 255).floor() / 255
    v = ((v * 255).round() * g[:, 2:3]).clamp(0, 255).floor() / 255
    # Back to RGB: channel n (5 red, 3 green, 1 blue) is v - v*s*clamp(min(k, 4 - k), 0, 1), k = (n + h/30) mod 6.
    sextant = hue / 30
    out = torch.cat([v - v * sat * torch.minimum((n + sextant).remainder(6), 4 - (n + sextant).remainder(6))
                     .clamp(0, 1) for n in (5, 3, 1)], dim=1)
    return (out * 255).round() / 255


def gains_of(metas: list[dict]) -> torch.Tensor | None:
    """[B, 3] gains from a batch's metas (YoloDataset with hsv_on_device),
    None when the batch has none (strengths all zero)."""
    rows = [m.get("hsv") for m in metas]
    if not rows or rows[0] is None:
        return None
    return torch.tensor(rows, dtype=torch.float32)
