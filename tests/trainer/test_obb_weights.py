"""An ultralytics OBBModel checkpoint read by its records: an untrained
yolo11n-obb at 2 classes as ultralytics' Model.save writes it
(tests/reference/ultralytics/obb/, benchmarks/ultralytics_reference.py
`obb-checkpoint`), read through the restricted unpickler, mapped by the OBB
head map onto hpcyolo's OBBModel: ultralytics' own eval output; a record
hpcyolo does not build is refused in one line; and `read_weights` (what
val, predict and train read) takes it now that the obb task trains."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO

from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.model import safe_pickle
from hpcyolo_trainer.model.weights import read_ultralytics, build_from, check_records, load_into, read_weights, \
    task_model

OBB = REPO / "tests" / "reference" / "ultralytics" / "obb"
CHECKPOINT = OBB / "yolo11n-obb.pt"


def test_an_ultralytics_obb_checkpoint_gives_ultralytics_output(one_thread):
    weights = read_ultralytics(str(CHECKPOINT), tasks=("obb",))
    assert (weights.task, weights.arch, weights.names) == ("obb", "yolo11n", ["plane", "ship"])
    model = task_model("obb", weights.arch, weights.nc)
    n = len(model.state_dict())
    assert load_into(model, weights) == f"weights: {n}/{n} tensors from yolo11n-obb.pt (ultralytics yolo11n, 2 classes)"
    reference = torch.load(OBB / "yolo11n-obb-output.pt", weights_only=True)
    x = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    assert float(x.double().sum()) == reference["input_sum"]
    with torch.no_grad():
        out = build_from(weights).eval().predict(x)
    expected = reference["output"]
    assert out.shape == expected.shape == (1, 4 + 2 + 1, 8 * 12 + 4 * 6 + 2 * 3)
    diff = per_channel(out, expected)
    print(f"yolo11n-obb checkpoint: max abs diff / max abs value, each channel: {diff:.1e}")
    assert diff < 1e-4


def per_channel(out: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference over the reference's largest magnitude, each channel
    by its own (the angle's radians beside boxes of hundreds of pixels)."""
    return ((out - expected).abs().amax(dim=(0, 2)) / expected.abs().amax(dim=(0, 2))).max().item()


def test_read_weights_takes_it_as_the_obb_task_trains():
    weights = read_weights(CHECKPOINT)
    assert (weights.task, weights.arch, weights.names, weights.nc) == ("obb", "yolo11n", ["plane", "ship"], 2)
    model = build_from(weights).eval()
    assert type(model).__name__ == "OBBModel" and model.nc == 2


def head_record(model):
    """(the head's parent's modules, the head's index, its record)."""
    layers = model.state["_modules"]["model"].state["_modules"]
    last = max(layers, key=int)
    return layers, last, layers[last]


def as_kind(record, kind: str):
    """The same record as a module of another ultralytics class."""
    other = object.__new__(safe_pickle._standin("ultralytics.nn.modules.head", kind))
    other.__setstate__(record.state)
    return other


def test_its_records_pass_and_a_flipped_one_is_refused_in_one_line():
    model = safe_pickle.load(CHECKPOINT)["model"]
    check_records(model, "yolo11n", "model.pt")
    layers, last, head = head_record(model)
    layers[last] = as_kind(head, "OBB26")  # YOLO26's head: the angle taken raw, not (sigmoid - 1/4) pi
    with pytest.raises(HpcyoloError) as refused:
        check_records(model, "yolo11n", "model.pt")
    assert str(refused.value) == (f"model.pt: layer {last} (OBB26 at model.{last}) has a head class 'OBB26' where "
                                  "hpcyolo's yolo11n has 'OBB': a variant hpcyolo does not build, refused rather "
                                  "than loaded to compute something else")
    layers[last] = head
    head.state["ne"] = 2
    with pytest.raises(HpcyoloError, match=r"has angle values per anchor \(ne\) 2 where hpcyolo's yolo11n has 1"):
        check_records(model, "yolo11n", "model.pt")


def test_a_wrong_mapping_would_be_caught(one_thread):
    """The output comparison can fail: two same-shaped angle-branch tensors swapped, and it does."""
    weights = read_ultralytics(str(CHECKPOINT), tasks=("obb",))
    state = dict(weights.state)
    a, b = "head.angle.0.1.0.weight", "head.angle.1.1.0.weight"
    assert state[a].shape == state[b].shape
    state[a], state[b] = state[b], state[a]
    model = task_model("obb", "yolo11n", 2)
    load_into(model, type(weights)(**{**weights.__dict__, "state": state}))
    x = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    expected = torch.load(OBB / "yolo11n-obb-output.pt", weights_only=True)["output"]
    with torch.no_grad():
        out = model.eval().predict(x)
    assert per_channel(out, expected) > 1e-3
