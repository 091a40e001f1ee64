"""Training curves and detection overlays, written by rank 0.

matplotlib and Pillow are imported inside the functions: importing the
trainer (and every test that does) should not pay for them. Figures are built
on matplotlib's object API with the Agg canvas, not pyplot: no global figure
registry to leak from a long run, no GUI backend picked up from a login
node's $DISPLAY. Files are written to a temporary name and renamed, so a
dashboard or `rsync` polling the run directory never sees half a PNG.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import numpy as np

from .fsutil import atomic_file

# Distinct, print-safe colours (RGB); class i uses PALETTE[i % len(PALETTE)].
PALETTE = [
    (230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180),
    (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128),
    (220, 190, 255), (170, 110, 40), (255, 225, 25), (128, 0, 0), (170, 255, 195),
    (128, 128, 0), (255, 215, 180), (0, 0, 128), (128, 128, 128), (255, 255, 255),
]
GRID_COLUMNS = 5


# --------------------------------------------------------------------------- files


# --------------------------------------------------------------------------- results.csv


def _parse_float(text: str) -> float | None:
    """A number, NaN for an empty cell (a metric not logged that epoch), or
    None for text (the column is then not plotted)."""
    text = text.strip()
    if not text:
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


def _read_columns(csv_path: str | os.PathLike) -> dict[str, list[float]]:
    """Numeric columns of a CSV, by header name (whitespace stripped: some
    writers pad columns to line them up)."""
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{csv_path}: empty file, expected a header row")
    header, body = [h.strip() for h in rows[0]], [r for r in rows[1:] if any(c.strip() for c in r)]
    columns = {}
    for j, name in enumerate(header):
        values = [_parse_float(r[j]) if j < len(r) else math.nan for r in body]
        if name and all(v is not None for v in values):
            columns[name] = values
    return columns


def _plot_column(ax, x: list[float], y: list[float], name: str) -> None:
    ax.plot(x, y, marker="o", markersize=3, linewidth=1.5, color="#1f77b4")
    ax.set_title(name, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    # Epochs are whole numbers; a 0.5 tick on the x axis would only confuse.
    ax.xaxis.get_major_locator().set_params(integer=True)


def plot_results(csv_path: str | os.PathLike, png_path: str | os.PathLike) -> None:
    """One small line plot per numeric column of results.csv against epoch
    (or the row number without an epoch column), in a grid, to png_path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = _read_columns(csv_path)
    n_rows = max((len(v) for v in columns.values()), default=0)
    x = columns.pop("epoch", list(range(1, n_rows + 1)))
    names = list(columns) or ["(no numeric columns)"]
    ncols = min(GRID_COLUMNS, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig = Figure(figsize=(3.2 * ncols, 2.6 * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        if name in columns:
            _plot_column(ax, x, columns[name], name)
        else:
            ax.set_title(name, fontsize=9)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(png_path) as f:
        fig.savefig(f, format="png")


# --------------------------------------------------------------------------- detections


def _label_font(image_height: int):
    from PIL import ImageFont

    size = max(10, round(image_height / 40))
    try:
        return ImageFont.load_default(size=size)  # scalable font (Pillow >= 10.1, FreeType)
    except (TypeError, ImportError, OSError):
        return ImageFont.load_default()  # fixed-size bitmap font


def _text_colour(background: tuple[int, int, int]) -> tuple[int, int, int]:
    # Black on light colours, white on dark ones (ITU-R BT.601 luma).
    r, g, b = background
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)


def _label_text(c: int, conf: float | None, names: list[str]) -> str:
    name = names[c] if 0 <= c < len(names) else str(c)
    return name if conf is None else f"{name} {conf:.2f}"


def _clip_box(box: np.ndarray, w: int, h: int) -> tuple[int, int, int, int]:
    # Pillow rejects x1 < x0; predictions may run off the image or be inverted.
    x0, x1 = sorted((float(box[0]), float(box[2])))
    y0, y1 = sorted((float(box[1]), float(box[3])))
    clip = lambda v, hi: int(round(min(max(v, 0.0), hi - 1)))  # noqa: E731
    return clip(x0, w), clip(y0, h), clip(x1, w), clip(y1, h)


def _draw_label(draw, font, box: tuple[int, int, int, int], text: str, colour) -> None:
    """A filled tag with the text, above the box, or inside it at the image's top edge."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    tw, th = right - left + 4, bottom - top + 2
    y = box[1] - th if box[1] - th >= 0 else box[1]
    draw.rectangle((box[0], y, box[0] + tw, y + th), fill=colour)
    draw.text((box[0] + 2 - left, y + 1 - top), text, fill=_text_colour(colour), font=font)


def draw_detections(img: np.ndarray, boxes, cls, conf, names: list[str]) -> np.ndarray:
    """A copy of img (HxWx3 uint8 RGB) with class-coloured boxes (xyxy pixels)
    and "name 0.87" labels ("name" alone when conf is None)."""
    from PIL import Image, ImageDraw

    img = np.asarray(img)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f"draw_detections: expected an HxWx3 uint8 image, got {img.shape} {img.dtype}")
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    cls = np.asarray(cls).reshape(-1).astype(int)
    confs = [None] * len(boxes) if conf is None else np.asarray(conf, dtype=float).reshape(-1).tolist()
    h, w = img.shape[:2]
    pil = Image.fromarray(img.copy())  # draw on a copy: the caller keeps its array
    draw, font = ImageDraw.Draw(pil), _label_font(h)
    width = max(1, round(min(h, w) / 200))
    for box, c, p in zip(boxes, cls, confs):
        colour = PALETTE[c % len(PALETTE)]
        xyxy = _clip_box(box, w, h)
        draw.rectangle(xyxy, outline=colour, width=width)
        _draw_label(draw, font, xyxy, _label_text(c, p, names), colour)
    return np.asarray(pil)


def save_image(img: np.ndarray, path: str | os.PathLike) -> None:
    """Write an HxWx3 uint8 RGB array; the format follows the file suffix."""
    from PIL import Image

    pil = Image.fromarray(np.asarray(img, dtype=np.uint8))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        pil.save(f, format=Image.registered_extensions()[path.suffix.lower()])
