"""Ultralytics checkpoints are mapped by what their records say, not by
their tensor shapes alone: an option that changes what a module computes
without changing its tensors (an activation, SPPF's pooling, a residual
add, attention heads, the head's regression) must be what hpcyolo builds,
or the file is refused in one line naming the layer and what differs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED

from hpcyolo_trainer.model import safe_pickle
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.model.weights import check_records, read_weights

FIXTURES = SHARED / "fixtures" / "ultralytics"
HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")


def records(arch: str = "yolo11n"):
    ckpt = safe_pickle.load(FIXTURES / f"{arch}-shapes" / "model.pt")
    return ckpt.get("ema") or ckpt.get("model")


def module(model, name: str):
    """The record of ultralytics module `name` (model.9.cv1)."""
    for part in name.split("."):
        model = model.state["_modules"][part]
    return model


def stand_in(module_name: str, cls: str):
    obj = object.__new__(safe_pickle._standin(module_name, cls))
    obj.__setstate__({"training": False})
    return obj


def test_the_bare_sppf_checkpoint_is_refused_in_one_line():
    """ultralytics 8.4-era builds wrote SPPF.cv1 without an activation (same
    tensors): hpcyolo builds it with SiLU, so it refuses the file."""
    path = FIXTURES / "yolo11n-bare-sppf" / "model.pt"
    with pytest.raises(HpcyoloError, match=r"layer 9 \(Conv at model\.9\.cv1\) has activation 'Identity' where "
                                           r"hpcyolo's yolo11n has 'SiLU'"):
        read_weights(path)
    r = subprocess.run([HPCYOLO, "val", str(path), "--data", str(FIXTURES / "yolo11n-bare-sppf" / "data.yaml")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "layer 9" in r.stderr, r.stderr


@pytest.mark.parametrize("arch", ["yolov8n", "yolo11n", "yolo26n"])
def test_ultralytics_own_checkpoints_pass(arch):
    check_records(records(arch), arch, "model.pt")


FLIPS = {
    "an activation": ("model.4.cv2", lambda m: m.state["_modules"].__setitem__(
        "act", stand_in("torch.nn.modules.activation", "ReLU")), "layer 4 (Conv at model.4.cv2) has activation 'ReLU'"),
    "SPPF's repeats": ("model.9", lambda m: m.state.__setitem__("n", 4), "has pooling repeats (n) 4"),
    "SPPF's shortcut": ("model.9", lambda m: m.state.__setitem__("add", True), "has a residual add (shortcut) True"),
    "a bottleneck's add": ("model.2.m.0", lambda m: m.state.__setitem__("add", False),
                           "layer 2 (Bottleneck at model.2.m.0) has a residual add (shortcut) False"),
    "attention heads": ("model.10.m.0.attn", lambda m: m.state.__setitem__("num_heads", 4), "has attention heads 4"),
    "the head's regression": ("model.23", lambda m: m.state.__setitem__("reg_max", 1),
                              "layer 23 (Detect at model.23) has box regression bins (reg_max) 1 where hpcyolo's "
                              "yolo11n has 16"),
    "upsampling": ("model.11", lambda m: m.state.__setitem__("mode", "bilinear"), "has upsampling (2.0, 'bilinear')"),
}


@pytest.mark.parametrize("flip", FLIPS)
def test_one_flipped_record_is_refused(flip):
    name, change, said = FLIPS[flip]
    model = records()
    change(module(model, name))
    with pytest.raises(HpcyoloError) as refused:
        check_records(model, "yolo11n", "model.pt")
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_every_task_has_the_map_of_its_head_in_an_ultralytics_checkpoint():
    from hpcyolo_trainer.common import registry
    from hpcyolo_trainer.model.heads import HEADS

    assert set(HEADS) >= set(registry.TASKS)  # every task trained, and the next ones' as they come
    assert {registry.ULTRALYTICS_MODELS[k] for k in registry.ULTRALYTICS_MODELS} >= set(HEADS)
