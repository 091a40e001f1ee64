"""`predict` of a keypoint model against ultralytics' own predictions
(tests/reference/ultralytics/pose_predict.json, written by
benchmarks/ultralytics_reference.py `pose-predict`): yolo11n-pose and
yolo26n-pose (NMS, and YOLO26's NMS-free head) with the same weights (the
script's `fill`, class branches sharpened) on generated images of other
shapes than the input: the same objects (class, confidence, box), each
keypoint within 2 px and its confidence within 1e-3."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import REPO
from test_task_models import FORWARD, KEPT, reference_script

from hpcyolo_trainer.eval.predict import pose, predict, read_image
from hpcyolo_trainer.model.heads import HEADS
from hpcyolo_trainer.model.weights import Weights, _rename, build_from

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "pose_predict.json").read_text())


def weights_like_the_reference(script, arch: str, path: str) -> Weights:
    """The reference's tensors (ultralytics' names and shapes: the forward reference's 3-class, [17, 3] model)
    under hpcyolo's names."""
    ref = torch.load(FORWARD / f"{arch}-pose.pt", weights_only=True)
    shapes = {name: tuple(shape) for name, shape in zip(ref["names"], ref["shapes"])}
    theirs = script.pose_predict_tensors({name: torch.zeros(shape) for name, shape in shapes.items()})
    for name, shape in shapes.items():  # what fill leaves: the DFL's bins, the flow's constants, BN's counters
        if name not in theirs:
            theirs[name] = torch.arange(shape[1], dtype=torch.float32).view(shape) if ".dfl." in name else \
                KEPT.get(name.rsplit(".", 1)[1], lambda: torch.zeros(shape, dtype=torch.long))()
    state = _rename(theirs, arch, HEADS["pose"], path)
    names = [f"class{i}" for i in range(script.FORWARD_CLASSES)]
    return Weights(arch, names, 160, state, "reference", path, "pose", (17, 3))


@pytest.mark.parametrize("key", sorted(k for k in REFERENCE if "/" in k))
def test_pose_predictions_find_ultralytics_objects_and_keypoints(key, tmp_path, one_thread):
    """Per image the same number of objects; each of ultralytics' found
    among ours with its class and confidence (1e-3), its box's corners
    within 0.01 px (the reference's rounding; boxes of a few pixels, or
    none, among them: an IoU would not tell), and every keypoint within 2 px
    with its confidence (1e-3).
    Then predict's JSON of the same: its objects with their keypoints."""
    script = reference_script()
    name, path = key.split("/")
    images = script.pose_predict_images(tmp_path)
    weights = weights_like_the_reference(script, name.split("-")[0], str(tmp_path / "model.pt"))
    model = build_from(weights).eval()
    end2end = path == "end2end"
    theirs = REFERENCE[key]
    assert [r["image"] for r in theirs] == [i.name for i in images]
    worst = 0.0
    for image, ref in zip(images, theirs):
        det, keypoints = pose(model, read_image(image), REFERENCE["imgsz"], REFERENCE["conf"], 0.7,
                              torch.device("cpu"), end2end)
        assert len(det) == len(ref["objects"]) > 0, ref["image"]
        for obj in ref["objects"]:
            same = (det[:, 5] == obj["class"]) & (np.abs(det[:, 4] - obj["conf"]) <= 1e-3)
            corners = np.where(same, np.abs(det[:, :4] - np.array(obj["box"])).max(1), np.inf)
            k = int(corners.argmin())
            assert corners[k] <= 0.01, (ref["image"], obj["box"], corners[k])
            distance = np.linalg.norm(keypoints[k, :, :2] - np.array(obj["keypoints"])[:, :2], axis=1).max()
            assert distance <= 2.0, (ref["image"], distance)
            assert np.abs(keypoints[k, :, 2] - np.array(obj["keypoints"])[:, 2]).max() <= 1e-3
            worst = max(worst, distance)
    print(f"{key}: the farthest keypoint {worst:.4f} px from ultralytics'")
    out = predict(weights, [str(i) for i in images], str(tmp_path / "out"), imgsz=REFERENCE["imgsz"],
                  conf=REFERENCE["conf"], fmt="json", end2end=end2end)
    assert [len(r["detections"]) for r in out] == [len(r["objects"]) for r in theirs]
    assert all(len(d["keypoints"]) == 17 and len(d["keypoints"][0]) == 3 for r in out for d in r["detections"])
