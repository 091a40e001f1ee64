"""Polygon geometry both sides need: the shapes generator (hpcyolo, before
torch loads) clips its outlines to the image, the augmentations clip a
transformed outline to the crop. numpy is imported where it is used (common/
loads none at module level)."""

from __future__ import annotations


def clip_polygon(points, x0: float, y0: float, x1: float, y1: float):
    """The part of the polygon `points` (k, 2) inside the rectangle x0..x1,
    y0..y1 (Sutherland-Hodgman, one side at a time): a float64 (m, 2) array,
    empty where none is inside."""
    import numpy as np

    p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    for axis, bound, sign in ((0, x0, 1), (0, x1, -1), (1, y0, 1), (1, y1, -1)):
        f = sign * (p[:, axis] - bound)
        if (f >= 0).all():
            continue
        q, g = np.roll(p, -1, axis=0), np.roll(f, -1)
        inside, crossing = f >= 0, (f >= 0) != (g >= 0)
        t = np.divide(f, f - g, out=np.zeros_like(f), where=crossing)[:, None]
        both = np.stack([p, p + t * (q - p)], axis=1)  # each vertex, then where its edge crosses
        p = both[np.stack([inside, crossing], axis=1)]
        if not len(p):
            break
    return p
