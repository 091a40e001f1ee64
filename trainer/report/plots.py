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

from ..common.fsutil import atomic_file
from ..common.rundir import TIMING_COLUMNS

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
    # the losses and figures first, the timing (time second in the file, as ultralytics') last
    names = sorted(columns, key=lambda name: name in TIMING_COLUMNS) or ["(no numeric columns)"]
    ncols = min(GRID_COLUMNS, len(names))
    nrows = math.ceil(len(names) / ncols)
    width, height = 3.2 * ncols, 2.6 * nrows
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    # Fixed margins in inches (room for tick labels and titles): matplotlib's
    # constrained layout measured every text box and took as long as the drawing.
    fig.subplots_adjust(left=0.45 / width, right=1 - 0.15 / width, bottom=0.3 / height, top=1 - 0.3 / height,
                        wspace=0.35, hspace=0.45)
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
    """A copy of img (HxWx3 uint8 RGB) with class-coloured boxes (xyxy pixels,
    or an oriented box's four corners [n, 4, 2], drawn as its polygon, as
    ultralytics draws OBB) and "name 0.87" labels ("name" alone when conf is None)."""
    from PIL import Image, ImageDraw

    img = np.asarray(img)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f"draw_detections: expected an HxWx3 uint8 image, got {img.shape} {img.dtype}")
    boxes = np.asarray(boxes, dtype=np.float64)
    corners = boxes.reshape(-1, 4, 2) if boxes.ndim == 3 else None
    boxes = np.concatenate([corners.min(1), corners.max(1)], 1) if corners is not None else boxes.reshape(-1, 4)
    cls = np.asarray(cls).reshape(-1).astype(int)
    confs = [None] * len(boxes) if conf is None else np.asarray(conf, dtype=float).reshape(-1).tolist()
    h, w = img.shape[:2]
    pil = Image.fromarray(img.copy())  # draw on a copy: the caller keeps its array
    draw, font = ImageDraw.Draw(pil), _label_font(h)
    width = max(1, round(min(h, w) / 200))
    for k, (box, c, p) in enumerate(zip(boxes, cls, confs)):
        colour = PALETTE[c % len(PALETTE)]
        xyxy = _clip_box(box, w, h)
        if corners is None:
            draw.rectangle(xyxy, outline=colour, width=width)
        else:
            draw.polygon([tuple(q) for q in corners[k]], outline=colour, width=width)
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


# --------------------------------------------------------------------------- the plots ultralytics users read


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save_figure(fig, path: str | os.PathLike) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        fig.savefig(f, format=Path(path).suffix.lstrip(".").replace("jpg", "jpeg"))


def batch_grid(imgs: np.ndarray, drawn: list[tuple], names: list[str], path: str | os.PathLike,
               max_images: int = 16, max_side: int = 1920) -> None:
    """Up to `max_images` images of a batch (uint8 [B, 3, H, W]) in a square
    grid, each with its boxes (`drawn`: per image (boxes xyxy pixels, classes,
    confidences or None[, masks or None[, keypoints [n, K, 3] or None]])), at
    most `max_side` pixels wide, as ultralytics' train_batch and val_batch images."""
    from PIL import Image

    n = min(len(imgs), max_images)
    if n == 0:
        return
    h, w = imgs.shape[2:]
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    grid = np.full((rows * h, cols * w, 3), 255, np.uint8)
    for k in range(n):
        boxes, cls, conf, *extra = drawn[k]
        tile = np.ascontiguousarray(imgs[k].transpose(1, 2, 0))
        if extra and extra[0] is not None:
            tile = with_masks(tile, extra[0], cls)
        tile = draw_detections(tile, boxes, cls, conf, names)
        if len(extra) > 1 and extra[1] is not None:
            tile = with_keypoints(tile, extra[1])
        r, c = divmod(k, cols)
        grid[r * h:(r + 1) * h, c * w:(c + 1) * w] = tile
    scale = min(1.0, max_side / max(grid.shape[:2]))
    if scale < 1.0:
        size = (round(grid.shape[1] * scale), round(grid.shape[0] * scale))
        grid = np.asarray(Image.fromarray(grid).resize(size, Image.BILINEAR))
    save_image(grid, path)


def with_keypoints(img: np.ndarray, keypoints, visible: float = 0.5) -> np.ndarray:
    """A copy of img (HxWx3 uint8) with each object's keypoints ([n, K, 2
    or 3], pixels) as dots, each keypoint index in its own colour (as
    ultralytics colours a skeleton's points): those whose third value
    (visibility, or a prediction's confidence) is above `visible`."""
    import cv2

    out = np.ascontiguousarray(img).copy()
    points = np.asarray(keypoints, np.float64)
    if points.size == 0:
        return out
    points = points.reshape(len(points), -1, points.shape[-1])
    radius = max(2, round(min(img.shape[:2]) / 120))
    for person in points:
        for j, p in enumerate(person):
            if p.shape[0] > 2 and p[2] <= visible:
                continue
            colour = PALETTE[(j + 3) % len(PALETTE)]
            cv2.circle(out, (int(round(p[0])), int(round(p[1]))), radius, colour, -1, lineType=cv2.LINE_AA)
    return out


def with_masks(img: np.ndarray, masks, cls) -> np.ndarray:
    """A copy of img (HxWx3 uint8) with each instance's mask ([n, h, w], any
    resolution of the image's) blended in its class's colour, half opaque."""
    import cv2

    out = img.astype(np.float32)
    h, w = img.shape[:2]
    for mask, c in zip(np.asarray(masks), np.asarray(cls).reshape(-1).astype(int)):
        area = cv2.resize(mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(bool)
        out[area] = 0.5 * out[area] + 0.5 * np.array(PALETTE[c % len(PALETTE)], np.float32)
    return out.astype(np.uint8)


def plot_confusion(matrix: np.ndarray, names: list[str], path: str | os.PathLike, normalize: bool,
                   background: bool = True) -> None:
    """Ultralytics' confusion_matrix.png (counts) or
    confusion_matrix_normalized.png (each true class's column summing to 1):
    rows predicted, columns true, background last (a classifier's: none)."""
    m = matrix.astype(np.float64)
    if normalize:
        m = m / (m.sum(0, keepdims=True) + 1e-9)
    shown = np.where(m < (0.005 if normalize else 1), np.nan, m)
    labels = [*names, "background"] if background else list(names)
    side = max(6.0, 0.45 * len(labels) + 3)
    fig = _figure(side, side * 0.85)
    ax = fig.subplots()
    im = ax.imshow(shown, cmap="Blues", vmin=0.0, vmax=1.0 if normalize else None)
    fig.colorbar(im, ax=ax, shrink=0.8)
    if len(labels) <= 30:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        for (i, j), v in np.ndenumerate(m):
            if not np.isnan(shown[i, j]):
                text = f"{v:.2f}" if normalize else f"{int(v)}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if v > (0.5 if normalize else 0.5 * np.nanmax(shown)) else "black")
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix" + (" Normalized" if normalize else ""))
    _save_figure(fig, path)


def _smooth(y: np.ndarray, share: float = 0.05) -> np.ndarray:
    """A box filter over `share` of the points, as ultralytics smooths its mean curves."""
    k = round(len(y) * share * 2) // 2 + 1
    padded = np.concatenate([np.full(k // 2, y[0]), y, np.full(k // 2, y[-1])])
    return np.convolve(padded, np.ones(k) / k, mode="valid")


def plot_curves(c: dict, names: list[str], folder: str | os.PathLike, map50: float, prefix: str = "Box") -> None:
    """Ultralytics' BoxPR_curve.png, BoxF1_curve.png, BoxP_curve.png and
    BoxR_curve.png in `folder`, from metrics.curves: one thin line per class
    (up to 20 classes), the mean over classes with ground truth thick; a
    segmentation's masks' as Mask*_curve.png (`prefix` Mask)."""
    folder = Path(folder)
    x, present = c["x"], c["present"]
    per_class = len(names) <= 20
    # PR: precision over recall.
    fig = _figure(9, 6)
    ax = fig.subplots()
    for k in np.flatnonzero(present) if per_class else ():
        ax.plot(x, c["pr"][k], linewidth=1, label=f"{names[k]}")
    mean_pr = c["pr"][present].mean(0) if present.any() else np.zeros_like(x)
    ax.plot(x, mean_pr, linewidth=3, color="blue", label=f"all classes {map50:.3f} mAP@0.5")
    ax.set(xlabel="Recall", ylabel="Precision", xlim=(0, 1), ylim=(0, 1), title="Precision-Recall Curve")
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)
    _save_figure(fig, folder / f"{prefix}PR_curve.png")
    # F1, P and R over confidence.
    for key, label, name in (("f1", "F1", f"{prefix}F1_curve.png"), ("precision", "Precision", f"{prefix}P_curve.png"),
                             ("recall", "Recall", f"{prefix}R_curve.png")):
        fig = _figure(9, 6)
        ax = fig.subplots()
        for k in np.flatnonzero(present) if per_class else ():
            ax.plot(x, c[key][k], linewidth=1, label=f"{names[k]}")
        mean = _smooth(c[key][present].mean(0)) if present.any() else np.zeros_like(x)
        best = int(mean.argmax())
        ax.plot(x, mean, linewidth=3, color="blue", label=f"all classes {mean[best]:.2f} at {x[best]:.3f}")
        ax.set(xlabel="Confidence", ylabel=label, xlim=(0, 1), ylim=(0, 1), title=f"{label}-Confidence Curve")
        ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)
        _save_figure(fig, folder / name)


def write_val_plots(summary: dict, names: list[str], folder: str | os.PathLike) -> list[Path]:
    """A validation's plots (evaluate.validate with plots=True) in `folder`,
    by ultralytics' names; returns their paths."""
    folder = Path(folder)
    plot_confusion(summary["confusion"], names, folder / "confusion_matrix.png", normalize=False)
    plot_confusion(summary["confusion"], names, folder / "confusion_matrix_normalized.png", normalize=True)
    plot_curves(summary["curves"], names, folder, summary["map50"])
    kinds = ["Box"]
    if "mask_curves" in summary:  # a segmentation's
        plot_curves(summary["mask_curves"], names, folder, summary["map50_mask"], prefix="Mask")
        kinds.append("Mask")
    if "pose_curves" in summary:  # a keypoint model's, matched by OKS
        plot_curves(summary["pose_curves"], names, folder, summary["map50_pose"], prefix="Pose")
        kinds.append("Pose")
    return [folder / n for n in ("confusion_matrix.png", "confusion_matrix_normalized.png")] + \
        [folder / f"{kind}{curve}_curve.png" for kind in kinds for curve in ("PR", "F1", "P", "R")]


def plot_labels(labels: list[np.ndarray], names: list[str], path: str | os.PathLike) -> None:
    """Ultralytics' labels.jpg: the training labels' instances per class,
    their boxes drawn about one centre, and histograms of their centres
    (x, y) and sizes (width, height), as fractions of the image."""
    rows = np.concatenate([np.asarray(lb, np.float64).reshape(-1, 5) for lb in labels]) if labels else \
        np.zeros((0, 5))
    cls, xy, wh = rows[:, 0].astype(int), rows[:, 1:3], rows[:, 3:5]
    fig = _figure(9, 9)
    axes = fig.subplots(2, 2).ravel()
    counts = np.bincount(cls, minlength=len(names))[:len(names)]
    axes[0].bar(range(len(names)), counts, color=[np.array(PALETTE[k % len(PALETTE)]) / 255 for k in
                                                  range(len(names))])
    axes[0].set_ylabel("instances")
    if len(names) <= 30:
        axes[0].set_xticks(range(len(names)), names, rotation=90, fontsize=8)
    shown = rows[:500]
    for (c, _, _, w, h) in shown:
        colour = np.array(PALETTE[int(c) % len(PALETTE)]) / 255
        axes[1].add_patch(_rectangle((0.5 - w / 2, 0.5 - h / 2), w, h, colour))
    axes[1].set(xlim=(0, 1), ylim=(0, 1), title=f"boxes ({len(shown)} of {len(rows)})", aspect="equal")
    axes[1].axis("off")
    for ax, (a, b), (xl, yl) in ((axes[2], xy.T, ("x", "y")), (axes[3], wh.T, ("width", "height"))):
        ax.hist2d(a, b, bins=50, range=((0, 1), (0, 1)), cmap="Blues")
        ax.set(xlabel=xl, ylabel=yl)
    _save_figure(fig, path)


def _rectangle(xy, w, h, colour):
    from matplotlib.patches import Rectangle

    return Rectangle(xy, w, h, fill=False, edgecolor=colour, linewidth=0.6, alpha=0.5)
