"""Predict with trained weights: boxes (a segmenter's with their masks'
outlines, as ultralytics' Results.masks.xy; a keypoint model's with its
keypoints, as Results.keypoints; an OBB model's oriented boxes with their
four corners, as Results.obb.xyxyxyxy) as YOLO txt or JSON, and drawn images.

    hpcyolo predict RUN/weights/best.pt images/ --out predictions
    hpcyolo predict yolov8n.pt images/          # an ultralytics checkpoint, read safely
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import torch

from ..common.errors import HpcyoloError
from ..common.fsutil import write_atomic
from ..common.registry import MAX_STRIDE as STRIDE
from ..data.augment import PAD_VALUE
from ..data.dataset import IMG_EXTS, decode_resized, probe_image
from ..model.boxes import non_max_suppression
from ..model.detector import check_end2end, confident, detections
from ..model.rboxes import non_max_suppression_obb, xywhr2xyxyxyxy
from ..model.segment import upsampled_masks
from ..model.weights import Weights, as_weights, build_from
from ..report.plots import draw_detections, save_image

DEFAULT_IMGSZ = 640  # where the weights do not say their training size


def load_weights(path: str | Path | Weights, device: torch.device):
    """(model in eval mode, class names, training image size): hpcyolo's
    weights or checkpoints, or an ultralytics checkpoint (or those read already)."""
    weights = as_weights(path)
    model = build_from(weights)
    return model.to(device).eval(), weights.names, weights.imgsz or DEFAULT_IMGSZ


def image_files(inputs: list[str]) -> list[Path]:
    """The files named and the images (by extension) in the folders named."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(p for p in item.rglob("*") if p.suffix.lower() in IMG_EXTS)
        elif item.is_file():
            files.append(item)
        else:
            raise HpcyoloError(f"{item}: no such file or directory")
    if not files:
        raise HpcyoloError(f"no images ({', '.join(sorted(IMG_EXTS))}) in {', '.join(inputs)}")
    return files


def rect_letterbox(img: np.ndarray, imgsz: int, stride: int = STRIDE) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Resize so the long side is `imgsz` (bilinear), then pad each side to the
    next multiple of `stride` only, centred, grey: ultralytics' inference
    letterbox (LetterBox with auto=True), so boxes match its predict. Returns
    (canvas, gain, (left, top))."""
    h, w = img.shape[:2]
    gain = min(imgsz / h, imgsz / w)
    new_h, new_w = round(h * gain), round(w * gain)
    if (new_h, new_w) != (h, w):
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    dh, dw = (imgsz - new_h) % stride / 2, (imgsz - new_w) % stride / 2
    # -0.1 / +0.1: an odd padding puts its extra pixel at the bottom/right.
    top, bottom, left, right = round(dh - 0.1), round(dh + 0.1), round(dw - 0.1), round(dw + 0.1)
    canvas = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(PAD_VALUE,) * 3)
    return canvas, gain, (left, top)


def to_original(det: np.ndarray, original: np.ndarray, gain: float, left: int, top: int) -> np.ndarray:
    """The gains (x, y) of `original`'s sides as the letterbox rounded them,
    after det's boxes (its first 4 columns, xyxy) are moved by the padding,
    divided by them and clipped to the image, in place: ultralytics 8.4's
    scale_boxes (each side's own gain, not the one of the long side)."""
    h, w = original.shape[:2]
    gains = np.array([max(round(w * gain), 1) / w, max(round(h * gain), 1) / h], dtype=np.float32)
    det[:, :4] = ((det[:, :4] - np.array([left, top] * 2, dtype=np.float32)) / np.tile(gains, 2)).clip(0, (w, h) * 2)
    return gains


def read_image(path: Path) -> np.ndarray:
    """RGB pixels as decoded, or ValueError saying why not. Probed first, as
    training checks its images: a truncated JPEG decodes to grey silently."""
    try:
        h, w = probe_image(path)
    except Exception as e:  # PIL raises many kinds for a bad file
        raise ValueError(f"{type(e).__name__}: {e}") from None
    original = decode_resized(path, (h, w))
    if original is None:
        raise ValueError("OpenCV cannot decode it")
    return original


@torch.no_grad()
def segment(model, original: np.ndarray, imgsz: int, conf: float, iou: float,
            device: torch.device, end2end: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
    """A segmenter's detections [n, 6] in `original`'s pixels and each one's
    mask outline [k, 2] there, as ultralytics' predict makes them: the masks
    upsampled to the input (bilinear), cut to their boxes, above 0; objects
    whose mask is empty dropped; each mask's outer contours (OpenCV), several
    joined into one outline at their nearest points; scaled and clipped to
    the image as its boxes. `end2end`: the one-to-one head's, no NMS."""
    h, w = original.shape[:2]
    canvas, gain, (left, top) = rect_letterbox(original, imgsz)
    x = torch.from_numpy(np.ascontiguousarray(canvas)).permute(2, 0, 1)[None].to(device).float() / 255
    raw, proto = model.predict(x, end2end=end2end)
    pred = confident(raw, conf)[0] if end2end else \
        non_max_suppression(raw, conf_thres=conf, iou_thres=iou, nc=model.nc)[0]
    masks = upsampled_masks(proto[0], pred[:, 6:], pred[:, :4], tuple(x.shape[2:]))
    keep = masks.flatten(1).amax(1) > 0 if len(masks) else torch.zeros(0, dtype=torch.bool)
    det, masks = pred[keep, :6].cpu().numpy(), masks[keep].cpu().numpy()
    gains = to_original(det, original, gain, left, top)
    outlines = [((outline(m) - (left, top)) / gains).clip(0, (w, h)) for m in masks]
    return det, outlines


def outline(mask: np.ndarray) -> np.ndarray:
    """A binary mask's outer contours as one outline [k, 2] (float32 x, y):
    each contour entered at its point nearest the outline so far and left
    the same way, so the joins add no area; (0, 2) for an empty mask."""
    contours = [c.reshape(-1, 2).astype(np.float32)
                for c in cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0]]
    if not contours:
        return np.zeros((0, 2), np.float32)
    joined = contours[0]
    for c in contours[1:]:
        distance = ((joined[:, None] - c[None]) ** 2).sum(-1)
        i, j = np.unravel_index(distance.argmin(), distance.shape)
        joined = np.concatenate([joined[:i + 1], np.roll(c, -j, axis=0), c[j:j + 1], joined[i:]])
    return joined


@torch.no_grad()
def pose(model, original: np.ndarray, imgsz: int, conf: float, iou: float, device: torch.device,
         end2end: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A keypoint model's detections [n, 6] in `original`'s pixels and each
    one's keypoints [n, K, D] there, as ultralytics' pose predict makes them:
    boxes and keypoints moved by the letterbox's padding and each side's
    gain and clipped to the image (keypoints: x, y; with D 3, the
    visibility's sigmoid as their confidence). `end2end`: the one-to-one
    head's, no NMS."""
    h, w = original.shape[:2]
    canvas, gain, (left, top) = rect_letterbox(original, imgsz)
    x = torch.from_numpy(np.ascontiguousarray(canvas)).permute(2, 0, 1)[None].to(device).float() / 255
    raw = model.predict(x, end2end=end2end)
    pred = confident(raw, conf)[0] if end2end else \
        non_max_suppression(raw, conf_thres=conf, iou_thres=iou, nc=model.nc)[0]
    det, keypoints = pred[:, :6].cpu().numpy(), pred[:, 6:].reshape(len(pred), *model.kpt_shape).cpu().numpy()
    gains = to_original(det, original, gain, left, top)  # keypoints alike: ultralytics 8.4's scale_coords
    keypoints[..., :2] = ((keypoints[..., :2] - np.array([left, top], dtype=np.float32)) / gains).clip(0, (w, h))
    return det, keypoints


@torch.no_grad()
def detect(model, original: np.ndarray, imgsz: int, conf: float, iou: float, device: torch.device,
           end2end: bool = False) -> np.ndarray:
    """Detections [n, 6] in `original`'s pixels: x1 y1 x2 y2 conf cls."""
    canvas, gain, (left, top) = rect_letterbox(original, imgsz)
    x = torch.from_numpy(np.ascontiguousarray(canvas)).permute(2, 0, 1)[None].to(device).float() / 255
    det = detections(model, x, conf=conf, iou=iou, end2end=end2end)[0].cpu().numpy()
    to_original(det, original, gain, left, top)
    return det


def pose_line(row: np.ndarray, keypoints: np.ndarray, w: int, h: int) -> str:
    """A keypoint detection as ultralytics' save_txt writes it (normalised):
    class cx cy w h, each keypoint's x y [confidence], then the confidence."""
    x1, y1, x2, y2, conf, cls = row
    points = keypoints / np.array([w, h, 1.0][:keypoints.shape[1]], dtype=np.float32)
    return " ".join([f"{int(cls)} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} "
                     f"{(y2 - y1) / h:.6f}", *(f"{v:.6f}" for v in points.flatten()), f"{conf:.4f}"])


@torch.no_grad()
def oriented(model, original: np.ndarray, imgsz: int, conf: float, iou: float, device: torch.device,
             end2end: bool = False) -> np.ndarray:
    """An OBB model's detections [n, 7] in `original`'s pixels: cx cy w h
    conf cls angle, as ultralytics' OBB predictor makes them: rotated NMS
    (best class per anchor), or the one-to-one head's picks; the centre
    moved by the padding, then cx and w divided by the width's gain, cy and
    h by the height's (scale_boxes with xywh=True: each side as the
    letterbox rounded it, nothing clipped)."""
    h, w = original.shape[:2]
    canvas, gain, (left, top) = rect_letterbox(original, imgsz)
    x = torch.from_numpy(np.ascontiguousarray(canvas)).permute(2, 0, 1)[None].to(device).float() / 255
    raw = model.predict(x, end2end=end2end)
    det = (confident(raw, conf) if end2end else non_max_suppression_obb(raw, conf_thres=conf, iou_thres=iou))[0]
    det = det.float().cpu().numpy()
    det[:, :2] -= np.array([left, top], dtype=np.float32)
    det[:, [0, 2]] /= round(w * gain) / w
    det[:, [1, 3]] /= round(h * gain) / h
    return det


def corners(det: np.ndarray) -> np.ndarray:
    """Oriented detections [n, 7] -> their four corners [n, 4, 2], in ultralytics' order."""
    return xywhr2xyxyxyxy(torch.from_numpy(det[:, [0, 1, 2, 3, 6]]).double()).numpy()


def obb_entries(det: np.ndarray, names: list[str]) -> list[dict]:
    """predict's JSON of oriented detections: class, name, confidence, xywhr
    (r in radians) and the four corners, in image pixels."""
    return [{"class": int(d[5]), "name": names[int(d[5])], "confidence": round(float(d[4]), 4),
             "xywhr": [round(float(v), 2) for v in d[[0, 1, 2, 3, 6]]],
             "corners_xy": [[round(float(x), 1), round(float(y), 1)] for x, y in c]} for d, c in zip(det, corners(det))]


def predict(weights: str | Weights, inputs: list[str], out: str, *, imgsz: int | None = None, conf: float = 0.25,
            iou: float = 0.7, fmt: str = "txt", device: str = "cpu", end2end: bool = False,
            warn=print) -> list[dict]:
    """Predict every image of `inputs`; one that cannot be read is skipped
    with one `warn` line, as training skips it, and the others are predicted.
    Nothing is written when the inputs hold no image or the weights do not load."""
    files = image_files(inputs)
    dev = torch.device(device)
    weights = as_weights(weights)
    model, names, train_size = load_weights(weights, dev)
    check_end2end(model, end2end, weights.path)
    masks, rotated = weights.task == "segment", weights.task == "obb"
    size = imgsz or train_size
    out_dir = Path(out)
    (out_dir / "labels").mkdir(parents=True, exist_ok=True)
    results = []
    for path in files:
        try:
            img = read_image(path)
        except ValueError as e:
            warn(f"warning: {path}: corrupt image skipped ({e})")
            continue
        h, w = img.shape[:2]
        if rotated:
            det = oriented(model, img, size, conf, iou, dev, end2end)
            results.append({"image": str(path), "width": w, "height": h, "detections": obb_entries(det, names)})
            if fmt == "txt":  # ultralytics' OBB txt: class x1 y1 ... x4 y4 (fractions of the image) conf
                lines = [" ".join([str(int(d[5])), *(f"{v:.6f}" for v in (c / (w, h)).flatten()), f"{d[4]:.4f}"])
                         for d, c in zip(det, corners(det))]
                write_atomic(out_dir / "labels" / f"{path.stem}.txt", "".join(f"{x}\n" for x in lines).encode())
            save_image(draw_detections(img, corners(det), det[:, 5].astype(int), det[:, 4], names),
                       out_dir / f"{path.stem}.jpg")
            continue
        keypoints = None
        if weights.task == "pose":
            (det, keypoints), outlines = pose(model, img, size, conf, iou, dev, end2end), None
        else:
            det, outlines = segment(model, img, size, conf, iou, dev, end2end) if masks else \
                (detect(model, img, size, conf, iou, dev, end2end), None)
        boxes = [{"class": int(c), "name": names[int(c)], "confidence": round(float(s), 4),
                  "box_xyxy": [round(float(v), 1) for v in b]} for *b, s, c in det]
        for box, o in zip(boxes, outlines or []):
            box["polygon_xy"] = [[round(float(x), 1), round(float(y), 1)] for x, y in o]
        for box, k in zip(boxes, keypoints if keypoints is not None else []):  # x, y px[, confidence]
            box["keypoints"] = [[round(float(v), 1) for v in p[:2]] + [round(float(v), 4) for v in p[2:]] for p in k]
        results.append({"image": str(path), "width": w, "height": h, "detections": boxes})
        if fmt == "txt":  # YOLO format, normalised: class cx cy w h conf; a segmenter's class x1 y1 ... xn yn conf;
            # a keypoint model's class cx cy w h, each keypoint's x y [confidence], conf (ultralytics' save_txt)
            if keypoints is not None:
                lines = [pose_line(row, k, w, h) for row, k in zip(det, keypoints)]
            elif masks:
                lines = [" ".join([str(int(c)), *(f"{v:.6f}" for v in (o / (w, h)).flatten()), f"{s:.4f}"])
                         for (*_, s, c), o in zip(det, outlines)]
            else:
                lines = [f"{int(c)} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} "
                         f"{(y2 - y1) / h:.6f} {s:.4f}" for x1, y1, x2, y2, s, c in det]
            write_atomic(out_dir / "labels" / f"{path.stem}.txt", "".join(f"{line}\n" for line in lines).encode())
        drawn = np.array(draw_detections(img, det[:, :4], det[:, 5].astype(int), det[:, 4], names))
        for o in outlines or []:
            cv2.polylines(drawn, [o.round().astype(np.int32)], True, (255, 255, 255), 1)
        for k in keypoints if keypoints is not None else []:  # those shown, as ultralytics: confidence above 0.5
            for p in k:
                if len(p) < 3 or p[2] > 0.5:
                    cv2.circle(drawn, (int(round(p[0])), int(round(p[1]))), 2, (255, 255, 255), -1)
        save_image(drawn, out_dir / f"{path.stem}.jpg")
    if fmt == "json":
        write_atomic(out_dir / "predictions.json", json.dumps(results, indent=1).encode())
    return results
