"""Ultralytics keypoint checkpoints (PoseModel: Pose, and YOLO26's Pose26
with its flow) read without running them and mapped by their records:
tests/reference/ultralytics/checkpoints/NAME/, made by ultralytics' own
Model.save in benchmarks/ultralytics_reference.py (`pose-checkpoint`), with
the output ultralytics computes from the same file."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO

from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.model import safe_pickle
from hpcyolo_trainer.model.heads import HEADS
from hpcyolo_trainer.model.weights import build_from, read_ultralytics, read_weights

CHECKPOINTS = REPO / "tests" / "reference" / "ultralytics" / "checkpoints"
MODELS = {"yolo11n-pose": (4, 3), "yolo26n-pose": (3, 2)}  # the reference script's POSE_CHECKPOINTS


@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_ultralytics_pose_checkpoint_gives_ultralytics_output(name, one_thread):
    """Every tensor finds its place (the flow's constants checked, not
    stored), the kpt_shape comes from the head's record, and the model built
    from the file computes what ultralytics computes from it."""
    path = CHECKPOINTS / name / "model.pt"
    weights = read_ultralytics(path, tasks=tuple(HEADS))
    reference = torch.load(CHECKPOINTS / name / "output.pt", weights_only=True)
    assert (weights.task, weights.arch, weights.names) == ("pose", name.split("-")[0], ["shape"])
    assert weights.kpt_shape == MODELS[name] == tuple(reference["kpt_shape"])
    model = build_from(weights).eval()
    assert model.kpt_shape == MODELS[name]
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    assert float(x.double().sum()) == reference["input_sum"]
    with torch.no_grad():
        out = model.predict(x)
    expected = reference["output"]
    assert out.shape == expected.shape == (2, 4 + 1 + MODELS[name][0] * MODELS[name][1], 8 * 12 + 4 * 6 + 2 * 3)
    diff = ((out - expected).abs().max() / expected.abs().max()).item()
    print(f"{name}: max abs diff / max abs value = {diff:.2e}")
    assert diff < 1e-4


FLIPS = {
    "the keypoint shape": ("yolo11n-pose", lambda head: head.state.__setitem__("kpt_shape", [4, 4]),
                           "its keypoint head records kpt_shape [4, 4], not [keypoints, 2 or 3]"),
    "the head's regression": ("yolo11n-pose", lambda head: head.state.__setitem__("reg_max", 1),
                              "layer 23 (Pose at model.23) has box regression bins (reg_max) 1 where hpcyolo's "
                              "yolo11n has 16"),
    "an end-to-end head": ("yolo26n-pose", lambda head: head.state["_modules"].pop("one2one_cv2"),
                           "layer 23 (Pose26 at model.23) has an end-to-end head (end2end) False"),
}


@pytest.mark.parametrize("flip", FLIPS)
def test_a_pose_record_hpcyolo_does_not_build_is_refused_in_one_line(flip, monkeypatch):
    """The checkpoint as its unpickler gives it, one record changed: read
    through read_ultralytics, refused in one line saying what differs."""
    name, change, said = FLIPS[flip]
    path = CHECKPOINTS / name / "model.pt"
    ckpt = safe_pickle.load(path)
    change(ckpt["model"].state["_modules"]["model"].state["_modules"]["23"])
    monkeypatch.setattr(safe_pickle, "load", lambda _: ckpt)
    with pytest.raises(HpcyoloError) as refused:
        read_ultralytics(path, tasks=tuple(HEADS))
    assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_a_flow_whose_constants_differ_is_refused():
    """Pose26's RealNVP masks are constants hpcyolo computes; a file whose
    masks differ would compute another flow: refused, naming the tensor."""
    from hpcyolo_trainer.model.weights import _module_tensors, _rename

    ckpt = safe_pickle.load(CHECKPOINTS / "yolo26n-pose" / "model.pt")
    tensors = dict(_module_tensors(ckpt["model"], ""))
    name = "model.23.flow_model.mask"
    assert torch.equal(tensors[name].float(), torch.tensor([[0.0, 1.0], [1.0, 0.0]] * 3))
    tensors[name] = 1 - tensors[name]
    with pytest.raises(HpcyoloError, match=r"model\.23\.flow_model\.mask is not the constant"):
        _rename(tensors, "yolo26n", HEADS["pose"], "model.pt")


def filled_yolo26n_pose(tmp_path):
    """yolo26n-pose (3 classes, [17, 3]) with the reference script's `fill`
    weights (test_task_models): class scores that differ from anchor to
    anchor, so that the one-to-one head's top 300 has no ties (an untrained
    head's scores are all its bias)."""
    from test_task_models import reference_script

    from hpcyolo_trainer.model.pose import PoseModel
    from hpcyolo_trainer.model.weights import Weights

    script = reference_script()
    model = PoseModel(3, "yolo26n")
    state = {name: script.fill(f"model.{name}", tuple(v.shape)) if v.is_floating_point() else v
             for name, v in model.state_dict().items()}
    return Weights("yolo26n", ["a", "b", "c"], 64, state, "filled", str(tmp_path / "filled.pt"), "pose", (17, 3))


@pytest.mark.parametrize("name, end2end", [("yolo11n-pose", False), ("yolo26n-pose", False), ("filled", True)])
def test_a_pose_model_exports_to_onnx_in_ultralytics_layout(name, end2end, tmp_path, one_thread):
    """output0 as ultralytics' ONNX of a keypoint model: [B, 4 + nc + K*D,
    anchors] (YOLO26 NMS-free: [B, 300, 6 + K*D]), onnxruntime within 1e-4 of
    torch (export_onnx refuses to write otherwise), kpt_shape in the metadata."""
    import onnx

    from hpcyolo_trainer.eval.export import export_onnx, run_onnx

    if name == "filled":
        weights, (k, dims) = filled_yolo26n_pose(tmp_path), (17, 3)
    else:
        weights, (k, dims) = read_ultralytics(CHECKPOINTS / name / "model.pt", tasks=tuple(HEADS)), MODELS[name]
    out = export_onnx(weights, str(tmp_path / "model.onnx"), imgsz=64, end2end=end2end)
    assert out["parity"] < 1e-4
    meta = {p.key: p.value for p in onnx.load(out["path"]).metadata_props}
    assert meta["task"] == "pose" and meta["kpt_shape"] == f"[{k}, {dims}]"
    output = run_onnx(out["path"], torch.rand(1, 3, 64, 64).numpy())
    assert output.shape == ((1, 8 * 8 + 4 * 4 + 2 * 2, 6 + k * dims) if end2end else
                            (1, 4 + weights.nc + k * dims, 8 * 8 + 4 * 4 + 2 * 2))
