"""Polygon geometry both sides need: the shapes generator (hpcyolo, before
torch loads) clips its outlines to the image and fits oriented boxes, the
augmentations clip a transformed outline to the crop, and the data path and
the metrics convert an oriented box's corners as ultralytics does
(xyxyxyxy2xywhr). numpy is imported where it is used (common/
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


def convex_hull(points):
    """The convex hull of `points` (k, 2), counter-clockwise (y up), without
    collinear points (Andrew's monotone chain): a float64 (m, 2) array."""
    import numpy as np

    p = np.unique(np.asarray(points, dtype=np.float64).reshape(-1, 2), axis=0)  # sorted by x, then y
    if len(p) < 3:
        return p

    def half(seq):
        out = []
        for q in seq:
            while len(out) >= 2 and (out[-1][0] - out[-2][0]) * (q[1] - out[-2][1]) - \
                    (out[-1][1] - out[-2][1]) * (q[0] - out[-2][0]) <= 0:
                out.pop()
            out.append(q)
        return out[:-1]

    return np.array(half(p) + half(p[::-1]))


def min_area_rect(points):
    """The corners (4, 2) of the smallest rectangle around `points` (k, 2),
    float64: one of its sides lies along an edge of the points' convex hull
    (Freeman and Shapira), so each hull edge's frame is tried, as OpenCV's
    minAreaRect does (rotating calipers). A hull of under three points gives
    a rectangle of zero width."""
    import numpy as np

    hull = convex_hull(points)
    if len(hull) < 2:
        return np.repeat(hull[:1], 4, axis=0) if len(hull) else np.zeros((4, 2))
    edges = np.roll(hull, -1, axis=0) - hull
    edges = edges[np.hypot(*edges.T) > 0]
    units = edges / np.hypot(*edges.T)[:, None]
    best = None
    for u in units:
        v = np.array([-u[1], u[0]])
        a, b = hull @ u, hull @ v
        area = (a.max() - a.min()) * (b.max() - b.min())
        if best is None or area < best[0]:
            best = area, u, v, (a.min(), a.max(), b.min(), b.max())
    _, u, v, (a0, a1, b0, b1) = best
    return np.array([a0 * u + b0 * v, a1 * u + b0 * v, a1 * u + b1 * v, a0 * u + b1 * v])


def xyxyxyxy2xywhr(corners: np.ndarray) -> np.ndarray:
    """Corners (or any polygon) [N, 8] or [N, P, 2] -> xywhr [N, 5] (float64): each
    one's minimum-area rectangle (OpenCV's, from float32 points, as
    ultralytics'), w the longer side, r in radians folded into [-pi/4, 3pi/4)."""
    import cv2
    import numpy as np

    points = np.asarray(corners, dtype=np.float32).reshape(len(corners), -1, 2)
    out = np.zeros((len(points), 5), dtype=np.float64)
    for i, p in enumerate(points):
        (cx, cy), (w, h), degrees = cv2.minAreaRect(p)
        r = degrees / 180 * np.pi
        if w < h:
            w, h, r = h, w, r + np.pi / 2
        while r >= 3 * np.pi / 4:
            r -= np.pi
        while r < -np.pi / 4:
            r += np.pi
        out[i] = cx, cy, w, h, r
    return out
