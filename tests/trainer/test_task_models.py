"""The segmentation, classification, oriented-box and keypoint models of every family and size,
against the parameter counts ultralytics itself gives for its YAMLs
(tests/reference/ultralytics/parameters.json, written by
benchmarks/ultralytics_reference.py in the benchmark venv), and their outputs'
shapes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO

from hpcyolo_trainer.common import registry
from hpcyolo_trainer.model import families
from hpcyolo_trainer.model.classify import ClassificationModel
from hpcyolo_trainer.model.detector import DetectionModel, count_parameters
from hpcyolo_trainer.model.obb import OBBModel
from hpcyolo_trainer.model.pose import PoseModel
from hpcyolo_trainer.model.segment import MASKS, SegmentationModel
from hpcyolo_trainer.tasks.task import load

REFERENCE = json.loads((REPO / "tests" / "reference" / "ultralytics" / "parameters.json").read_text())
MODEL_OF = {"detect": DetectionModel, "segment": SegmentationModel, "classify": ClassificationModel,
            "obb": OBBModel, "pose": PoseModel}  # pose: at ultralytics' default kpt_shape [17, 3]


def test_the_reference_covers_every_model_of_every_task_built_here():
    assert REFERENCE["ultralytics"].startswith("8.4.")
    for task in MODEL_OF:
        assert sorted(REFERENCE["tasks"][task]["models"]) == sorted(registry.MODELS)


def test_the_login_nodes_list_of_folder_datasets_is_the_tasks_own():
    """registry.FOLDER_TASKS (what validate and doctor check a dataset's layout by, without torch) is the
    tasks whose Task record takes a folder of class folders."""
    assert set(registry.FOLDER_TASKS) == {name for name in registry.TASKS if load(name).folders}


@pytest.mark.parametrize("task", sorted(MODEL_OF))
def test_parameter_counts_equal_ultralytics(task):
    """At ultralytics' default classes; its DFL holds 16 frozen weights that
    hpcyolo computes instead (the families with reg_max 16)."""
    reference = REFERENCE["tasks"][task]
    wrong = []
    for name in registry.MODELS:
        with torch.device("meta"):  # the structure only: counted, never initialised
            model = MODEL_OF[task](reference["classes"], name)
        dfl = families.load(name[:-1]).REG_MAX if task != "classify" else 0
        ours, theirs = count_parameters(model), reference["models"][name]
        if ours + (dfl if dfl > 1 else 0) != theirs:
            wrong.append(f"{name}: {ours:,} (ultralytics {theirs:,})")
    assert not wrong, wrong


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolo26n"])
def test_segmentation_outputs(name, one_thread):
    """Coefficients per anchor on every level, prototypes at a quarter of the
    input; YOLO26's semantic logits at an eighth, one per class."""
    torch.manual_seed(0)
    model = SegmentationModel(3, name).eval()
    x = torch.rand(2, 3, 64, 96)
    feats = model.neck(model.backbone(x))
    coefficients = model.head.coefficients(feats)
    assert [tuple(c.shape) for c in coefficients] == [(2, MASKS, 8, 12), (2, MASKS, 4, 6), (2, MASKS, 2, 3)]
    assert tuple(model.head.prototypes(feats).shape) == (2, MASKS, 16, 24)
    if model.end2end:
        assert tuple(model.head.proto.semantic(feats).shape) == (2, 3, 8, 12)
        assert [c.shape for c in model.head.coefficients(feats, one2one=True)] == [c.shape for c in coefficients]
    out = model(x)  # what the loss trains on
    if model.end2end:  # both heads' outputs; eval mode: no semantic map (as ultralytics validates)
        (maps, coefficients_trained, prototypes, semantic), one2one = out
        assert semantic is None and one2one[3] is None and torch.equal(one2one[2], prototypes)
        assert all(torch.equal(a, b) for a, b in zip(one2one[0], model.head.one2one(feats)))
        assert all(torch.equal(a, b) for a, b in zip(one2one[1], model.head.coefficients(feats, one2one=True)))
    else:
        maps, coefficients_trained, prototypes = out
    assert [m.shape for m in maps] == [m.shape for m in model.head(feats)]
    assert all(torch.equal(a, b) for a, b in zip(coefficients_trained, coefficients))
    assert torch.equal(prototypes, model.head.prototypes(feats))
    if model.end2end:  # training mode: the semantic map too, the one-to-one head's detached
        model.train()
        (_, _, prototypes, semantic), (_, _, one2one_proto, one2one_semantic) = model(x)
        feats = model.neck(model.backbone(x))
        assert torch.allclose(semantic, model.head.proto.semantic(feats), rtol=1e-5, atol=1e-6)
        assert torch.allclose(prototypes, model.head.prototypes(feats), rtol=1e-5, atol=1e-6)
        assert semantic.requires_grad and not one2one_semantic.requires_grad and not one2one_proto.requires_grad
        assert torch.equal(one2one_semantic, semantic) and torch.equal(one2one_proto, prototypes)
    if not model.end2end:  # the detector's decoded boxes and scores, then each anchor's coefficients
        preds, proto = model.predict(x)
        assert tuple(preds.shape) == (2, 4 + 3 + MASKS, 8 * 12 + 4 * 6 + 2 * 3)
        assert torch.equal(preds[:, :7], model.decode(maps)) and torch.equal(proto, prototypes)
        assert torch.equal(preds[:, 7:], torch.cat([c.flatten(2) for c in coefficients], 2))


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolo26n"])
def test_classification_outputs(name, one_thread):
    torch.manual_seed(0)
    model = ClassificationModel(5, name).eval()
    x = torch.rand(2, 3, 64, 64)
    logits = model(x)
    assert tuple(logits.shape) == (2, 5)
    assert torch.allclose(model.predict(x), logits.softmax(1)) and torch.allclose(model.predict(x).sum(1), torch.ones(2))


# == layer for layer: the same weights give ultralytics' outputs ================

def reference_script():
    """benchmarks/ultralytics_reference.py, for its `fill` (the reference weights by tensor name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ultralytics_reference", REPO / "benchmarks" /
                                                  "ultralytics_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FORWARD = REPO / "tests" / "reference" / "ultralytics" / "forward"
# Pose26's RealNVP buffers, as ultralytics makes them (a standard normal's loc and cov, the coupling masks)
KEPT = {"loc": lambda: torch.zeros(2), "cov": lambda: torch.eye(2),
        "mask": lambda: torch.tensor([[0.0, 1.0], [1.0, 0.0]] * 3)}


def reference_model(name: str, task: str):
    """(our model of `task` holding the forward reference's weights, the
    reference, its input): ultralytics' tensors as `fill` sets them, renamed
    by the task's HeadMap as a checkpoint of that task is read."""
    from hpcyolo_trainer.model.heads import HEADS
    from hpcyolo_trainer.model.weights import _rename

    script = reference_script()
    ref = torch.load(FORWARD / f"{name}-{task}.pt", weights_only=True)
    x = torch.rand(script.FORWARD_INPUT, generator=torch.Generator().manual_seed(0))
    assert float(x.double().sum()) == ref["input_sum"]  # the input the reference was computed on
    theirs = {}
    for tensor, shape in zip(ref["names"], ref["shapes"]):
        value = script.fill(tensor, tuple(shape))
        if value is None:  # what ultralytics keeps: its DFL's fixed bins, Pose26's flow's constants, BN's counters
            value = KEPT.get(tensor.rsplit(".", 1)[1], lambda: torch.zeros(shape, dtype=torch.long))()
            if ".dfl." in tensor:
                value = torch.arange(shape[1], dtype=torch.float32).view(shape)
        theirs[tensor] = value
    model = MODEL_OF[task](script.FORWARD_CLASSES, name).eval()
    model.load_state_dict(_rename(theirs, name, HEADS[task], "reference"), strict=True)
    return model, ref, x


@pytest.mark.parametrize("task", ["segment", "classify", "pose"])
@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolo26n"])
def test_ultralytics_weights_mapped_by_name_give_ultralytics_outputs(name, task, one_thread):
    """Ultralytics' model of each family, its every tensor set from its name
    (benchmarks/ultralytics_reference.py `fill`) and evaluated there; the same
    tensors renamed by the task's HeadMap (model/heads.py, as a checkpoint of
    that task is read) into hpcyolo's model: the neck's outputs, every branch's
    raw maps, the prototypes and YOLO26's semantic map, or the classifier's
    logits, equal within float32 rounding."""
    model, ref, x = reference_model(name, task)

    def close(ours, reference, what):
        scale = reference.abs().max().item()
        assert ours.shape == reference.shape, what
        assert (ours - reference).abs().max().item() <= 1e-4 * max(scale, 1.0), what

    with torch.no_grad():
        if task == "classify":
            close(model(x), ref["logits"], "logits")
            return
        feats = model.neck(model.backbone(x))
        for i, (ours, reference) in enumerate(zip(feats, ref["feats"])):
            close(ours, reference, f"the neck's level {i}")
        if task == "pose":
            return compare_pose(model, x, feats, ref, close)
        branches = {"box": model.head.box, "cls": model.head.cls, "mask": model.head.mask}
        if model.end2end:
            branches.update(one2one_box=model.head.one2one_box, one2one_cls=model.head.one2one_cls,
                            one2one_mask=model.head.one2one_mask)
        assert sorted(branches) == sorted(k for k in ref if k in ("box", "cls", "mask") or k.startswith("one2one"))
        for key, modules in branches.items():
            for i, (module, f) in enumerate(zip(modules, feats)):
                close(module(f), ref[key][i], f"{key} level {i}")
        close(model.head.prototypes(feats), ref["proto"], "prototypes")
        if "semantic" in ref:
            close(model.head.proto.semantic(feats), ref["semantic"], "semantic map")


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolo26n"])
def test_pose_models_take_any_keypoint_shape(name, one_thread):
    """K*D keypoint values per anchor on every level, for [K, 2] and [K, 3];
    YOLO26's sigma maps (2K) in training mode only, as ultralytics'."""
    torch.manual_seed(0)
    for kpt_shape in ((4, 2), (5, 3)):
        model = PoseModel(2, name, kpt_shape).eval()
        k, dims = kpt_shape
        x = torch.rand(1, 3, 64, 96)
        out = model(x)
        kpts = out[0][1] if model.end2end else out[1]
        assert [tuple(m.shape) for m in kpts] == [(1, k * dims, 8, 12), (1, k * dims, 4, 6), (1, k * dims, 2, 3)]
        assert tuple(model.predict(x).shape) == (1, 4 + 2 + k * dims, 8 * 12 + 4 * 6 + 2 * 3)
        if model.end2end:
            assert out[0][2] is None and out[1][2] is None
            assert tuple(model.predict(x, end2end=True).shape) == (1, 126, 6 + k * dims)
            model.train()
            (_, _, sigmas), _ = model(x)
            assert [tuple(m.shape) for m in sigmas] == [(1, 2 * k, 8, 12), (1, 2 * k, 4, 6), (1, 2 * k, 2, 3)]
    with pytest.raises(ValueError, match="kpt_shape"):
        PoseModel(2, name, (17, 4))


def compare_pose(model, x, feats, ref, close) -> None:
    """The keypoint model's raw maps of every branch (both heads'), its
    decoded keypoints, and YOLO26's one-to-one top 300, against ultralytics'."""
    head, ours = model.head, {}
    for prefix in ("", "one2one_") if model.end2end else ("",):
        one2one = bool(prefix)
        ours[prefix + "box"] = [m(f) for m, f in zip(getattr(head, prefix + "box"), feats)]
        ours[prefix + "cls"] = [m(f) for m, f in zip(getattr(head, prefix + "cls"), feats)]
        if head.pose26:
            ours[prefix + "kpt"], ours[prefix + "kpt_sigma"] = head.keypoints_and_sigmas(feats, one2one)
        else:
            ours[prefix + "kpt"] = head.keypoints(feats, one2one)
    assert sorted(ours) == sorted(k for k in ref if k not in ("names", "shapes", "input_sum", "feats", "decoded",
                                                              "end2end"))
    for key, maps in ours.items():
        for i, m in enumerate(maps):
            close(m, ref[key][i], f"{key} level {i}")
    nc, nk = model.nc, head.nk
    decoded = model.predict(x)
    close(decoded[:, 4 + nc:], ref["decoded"][:, 4 + nc:], "decoded keypoints")
    close(decoded, ref["decoded"], "decoded boxes, scores and keypoints")
    if model.end2end:
        picks, theirs = model.predict(x, end2end=True), ref["end2end"]
        assert picks.shape == theirs.shape == (2, 126, 6 + nk)
        close(picks, theirs, "the one-to-one head's top picks, with their keypoints")
