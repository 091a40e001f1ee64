"""YOLO26's NMS-free path (`--end2end`, ultralytics' nms=False) against
ultralytics' own figures on the reference checkpoint: the one-to-one head's
[B, 300, 6] output, validation, ONNX export; and a one-line refusal for
weights without a one-to-one head. (The default path, NMS over the
one-to-many head, is held to ultralytics' in test_weights, test_val and
test_export with the other families.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHARED

from hpcyolo_trainer.eval.export import end2end_diff, export_onnx, run_onnx
from hpcyolo_trainer.model.weights import build_from, read_weights

FIXTURES = SHARED / "fixtures" / "ultralytics"
Y26 = FIXTURES / "yolo26n-shapes"
HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
PRECISION = 1e-6  # relative, ours against ultralytics' (measured 1e-7 to 4e-7): what docs/training.md states


def test_the_one_to_one_head_gives_ultralytics_output(one_thread):
    model = build_from(read_weights(Y26 / "model.pt")).eval()
    x = torch.load(Y26 / "input.pt", weights_only=True)
    expected = torch.load(Y26 / "output_e2e.pt", weights_only=True)
    with torch.no_grad():
        out = model.predict(x, end2end=True)
    assert out.shape == expected.shape == (2, 300, 6)
    diff = ((out - expected).abs().max() / expected.abs().max()).item()
    print(f"yolo26n end2end: max abs diff / max abs value = {diff:.2e}")
    assert diff < PRECISION  # docs/training.md states it
    assert torch.equal(out[..., 5], expected[..., 5])  # the same class for every row


def test_val_end2end_matches_ultralytics():
    ref = json.loads((Y26 / "reference.json").read_text())
    r = subprocess.run([HPCYOLO, "val", str(Y26 / "model.pt"), "--data", str(Y26 / "data.yaml"), "--imgsz", "160",
                        "--batch", "16", "--json", "--end2end"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    print(f"yolo26n end2end: mAP50 {result['map50']:.4f} (ultralytics {ref['val_e2e_mAP50']}), "
          f"mAP50-95 {result['map50_95']:.4f} (ultralytics {ref['val_e2e_mAP50_95']})")
    assert round(result["map50"], 4) == ref["val_e2e_mAP50"]  # to the reference's fourth digit
    assert round(result["map50_95"], 4) == ref["val_e2e_mAP50_95"]


def test_onnx_end2end_is_ultralytics_output_batch_1_and_dynamic_2(tmp_path):
    x = torch.load(Y26 / "input.pt", weights_only=True)
    expected = torch.load(Y26 / "output_e2e.pt", weights_only=True).numpy()
    export_onnx(str(Y26 / "model.pt"), str(tmp_path / "fixed.onnx"), imgsz=160, end2end=True)
    one = run_onnx(str(tmp_path / "fixed.onnx"), x[:1].numpy())
    assert one.shape == (1, 300, 6) and end2end_diff(one, expected[:1]) <= PRECISION
    export_onnx(str(Y26 / "model.pt"), str(tmp_path / "dynamic.onnx"), imgsz=160, dynamic=True, end2end=True)
    two = run_onnx(str(tmp_path / "dynamic.onnx"), x.numpy())
    print(f"yolo26n end2end ONNX: batch 1 {end2end_diff(one, expected[:1]):.2e}, "
          f"dynamic batch 2 {end2end_diff(two, expected):.2e}")
    assert two.shape == (2, 300, 6) and end2end_diff(two, expected) <= PRECISION


@pytest.mark.parametrize("command", ["val", "predict", "export"])
def test_end2end_of_weights_without_a_one_to_one_head_is_one_line(command, tmp_path):
    v8 = FIXTURES / "yolov8n-shapes"
    args = {"val": ["--data", str(v8 / "data.yaml")], "predict": [str(v8 / "images"), "--out", str(tmp_path / "p")],
            "export": ["-o", str(tmp_path / "m.onnx")]}[command]
    r = subprocess.run([HPCYOLO, command, str(v8 / "model.pt"), *args, "--end2end"], capture_output=True, text=True,
                       env=ENV)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "yolov8n has no one-to-one head; --end2end (NMS-free, ultralytics' nms=False) is for YOLO26" in r.stderr
    assert not (tmp_path / "m.onnx").exists()
