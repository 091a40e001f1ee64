"""A label file's row read and checked, as every task's reader starts
from it (data/dataset.py's files, data/keypoints.py's pose rows): the
class and the box, normalised to the image, or why the row is malformed."""

from __future__ import annotations

import math

import numpy as np

COORD_TOL = 0.01  # label tools write 1.0000001 or -0.0004; beyond this a coordinate is wrong


def parse_label_row(text: str, nc: int) -> np.ndarray | str:
    """One row -> (cls, cx, cy, w, h) normalised and clipped to the image, or
    the reason it is malformed. `class cx cy w h` is a box; `class x1 y1 x2 y2
    x3 y3 ...` (an odd count >= 7) a polygon, which becomes its bounding box."""
    try:
        values = [float(v) for v in text.split()]
    except ValueError:
        return "not all numbers"
    n = len(values)
    if n != 5 and (n < 7 or n % 2 == 0):
        return f"{n} numbers (a box has 5, a polygon a class and at least 3 x y pairs)"
    if not all(math.isfinite(v) for v in values):
        return "not finite"
    cls, coords = values[0], np.array(values[1:])
    if cls != int(cls) or not 0 <= cls < nc:
        return f"class {values[0]:g} is not one of 0..{nc - 1}"
    if ((coords < -COORD_TOL) | (coords > 1 + COORD_TOL)).any():
        return "coordinates outside [0, 1]"
    if n == 5:
        cx, cy, w, h = coords
        x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    else:
        x1, y1, x2, y2 = coords[0::2].min(), coords[1::2].min(), coords[0::2].max(), coords[1::2].max()
    x1, y1, x2, y2 = (min(max(v, 0.0), 1.0) for v in (x1, y1, x2, y2))
    if x2 <= x1 or y2 <= y1:
        return "box of zero size"
    return np.array([cls, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], dtype=np.float32)
