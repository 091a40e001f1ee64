"""`hpcyolo export`: weights (ours or an ultralytics checkpoint) as an ONNX model.

The graph is the model's eval-mode `predict`: input `images` float32
[B, 3, H, W] in [0, 1], output `output0` [B, 4 + nc, anchors]: boxes (cx, cy,
w, h) in input pixels, then the class scores after sigmoid, before NMS, as
ultralytics' ONNX export gives. `dynamic`: batch, height and width are free
(height and width multiples of 32). A segmenter's, as ultralytics' too:
`output0` [B, 4 + nc + 32, anchors], each anchor's 32 mask coefficients after
its class scores, and `output1` [B, 32, H/4, W/4], the prototypes. The file
is checked with onnx's checker and run once with onnxruntime against torch
(every output) before it is written (atomically). A classifier's, as
ultralytics': `output0` [B, nc], the classes' softmax probabilities. A
keypoint model's, as ultralytics': `output0` [B, 4 + nc + K*D, anchors],
each anchor's decoded keypoints (x, y in input pixels[, visibility after
sigmoid]) after its class scores, and its kpt_shape in the metadata. An
OBB model's, as ultralytics': `output0` [B, 4 + nc + 1, anchors], each
anchor's angle (radians) after its class scores; NMS-free (YOLO26's
one-to-one head), [B, 300, 7]: cx, cy, w, h, score, class, angle.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import torch

from ..common.errors import HpcyoloError
from ..common.fsutil import write_atomic
from ..model.detector import check_end2end
from ..model.weights import Weights, as_weights, build_from

OPSET = 17
TOLERANCE = 1e-4  # max abs difference, relative to the output's max abs value
SCORE = 4  # an NMS-free row's score: x1 y1 x2 y2 (or cx cy w h) score class ...
TIE = 1e-5  # two scores this close are a tie that rounding may break either way
HINT = "hpcyolo export needs onnx and onnxruntime: pip install 'hpcyolo[export]'"


class Predict(torch.nn.Module):
    """The exported graph: raw maps decoded to boxes and class scores."""

    def __init__(self, model, end2end: bool = False):
        super().__init__()
        self.model, self.end2end = model, end2end

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.predict(images, end2end=True) if self.end2end else self.model.predict(images)


def _need_onnx():
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise HpcyoloError(HINT) from None
    return onnx, onnxruntime


def relative_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: the parity measure of the exported model."""
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))


def end2end_diff(got: np.ndarray, want: np.ndarray) -> float:
    """relative_diff for NMS-free outputs [B, K, 6 + ...], rows by score:
    two detections whose scores tie to rounding come in either order, and at
    the cut (the K-th row) either may be kept, as each runtime's own float
    rounding decides (onnxruntime 1.32 swapped two rows whose scores differ
    by 1.7e-7). Each row is compared with the other side's nearest row; a row
    with none near counts only where its score is not at the cut. Rows must
    be by score, highest first."""
    scale = max(float(np.abs(want).max()), 1e-12)
    worst = 0.0
    for g, w in zip(got.reshape(-1, *got.shape[-2:]), want.reshape(-1, *want.shape[-2:])):
        if np.any(np.diff(g[:, SCORE]) > TIE):
            return float("inf")  # not by score
        apart = np.abs(g[:, None, :] - w[None, :, :]).max(-1) / scale  # [got row, want row]
        cut = min(g[:, SCORE].min(), w[:, SCORE].min()) + TIE
        for nearest, rows in ((apart.min(axis=0), w), (apart.min(axis=1), g)):
            counted = nearest[rows[:, SCORE] > cut]
            worst = max(worst, float(counted.max()) if counted.size else 0.0)
    return worst


def run_onnx(data: bytes | str, images: np.ndarray) -> np.ndarray:
    """The model's first output (output0) on `images`."""
    return run_onnx_outputs(data, images)[0]


def run_onnx_outputs(data: bytes | str, images: np.ndarray) -> list[np.ndarray]:
    _, ort = _need_onnx()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {"images": images})


def export_onnx(weights: str | Weights, output: str | None = None, *, imgsz: int | None = None, batch: int = 1,
                dynamic: bool = False, opset: int = OPSET, end2end: bool = False) -> dict:
    """Write the ONNX file; returns {path, imgsz, batch, dynamic, bytes, parity}."""
    onnx, _ = _need_onnx()
    w = as_weights(weights)
    weights = w.path
    size = imgsz or w.imgsz or 640
    path = Path(output) if output else Path(weights).with_suffix(".onnx")
    if not path.parent.is_dir():
        raise HpcyoloError(f"{path}: no such folder {path.parent}")
    model = build_from(w)
    check_end2end(model, end2end, weights)
    graph = Predict(model, end2end).eval()
    example = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    # end2end: [B, 300, 6]; a classifier's: [B, nc]
    output_axes = {0: "batch"} if end2end or w.task == "classify" else {0: "batch", 2: "anchors"}
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": output_axes}
    outputs = ["output0"]
    if w.task == "segment":  # the prototypes, as ultralytics' second output
        outputs.append("output1")
        axes["output1"] = {0: "batch", 2: "mask_height", 3: "mask_width"}
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(graph, (example,), buffer, dynamo=False, opset_version=opset, input_names=["images"],
                          output_names=outputs, dynamic_axes=axes if dynamic else None, do_constant_folding=True)
    proto = onnx.load_from_string(buffer.getvalue())
    meta = {"names": json.dumps(dict(enumerate(w.names))), "imgsz": json.dumps([size, size]),
            "batch": str(batch), "stride": "32", "arch": w.arch, "source": Path(weights).name,
            "end2end": json.dumps(end2end), "task": w.task, "producer": "hpcyolo"}
    if w.kpt_shape:  # as ultralytics' metadata: how output0's keypoint rows split
        meta["kpt_shape"] = json.dumps(list(w.kpt_shape))
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    data = proto.SerializeToString()
    with torch.no_grad():
        expected = graph(example)
    expected = [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
    got = run_onnx_outputs(data, example.numpy())
    parity = max([end2end_diff(got[0], expected[0]) if end2end else relative_diff(got[0], expected[0]),
                  *(relative_diff(a, b) for a, b in zip(got[1:], expected[1:]))])
    if parity > TOLERANCE:
        raise HpcyoloError(f"{path}: not written: onnxruntime's output differs from torch's by {parity:.2e} "
                           f"(relative), more than {TOLERANCE}")
    try:
        write_atomic(path, data)
    except OSError as e:
        raise HpcyoloError(f"cannot write {path}: {e.strerror}") from None
    return {"path": str(path), "imgsz": size, "batch": batch, "dynamic": dynamic, "bytes": len(data),
            "parity": parity, "arch": w.arch, "nc": w.nc}
