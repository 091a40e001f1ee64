"""The YOLOv8, YOLO11 and YOLO26 detectors: sizes against published counts, shapes, decoding, gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hpcyolo_trainer.model import families
from hpcyolo_trainer.common import registry
from hpcyolo_trainer.model.detector import ALIASES, MODELS, DetectionModel, build_model, count_parameters

# Published sizes at nc=80, as ultralytics prints them: each family module's
# PUBLISHED_PARAMETERS. Ultralytics counts 16 extra frozen weights where the
# head has a DFL (its projection is a Conv2d); ours is a constant, so we land
# 16 below. YOLO26 regresses the distances directly: no DFL, no offset.
PUBLISHED = {f"{family}{scale}": n for family in registry.FAMILIES
             for scale, n in families.load(family).PUBLISHED_PARAMETERS.items()}

NC = 3
H, W = 64, 96


@pytest.fixture(scope="module")
def model() -> DetectionModel:
    torch.manual_seed(0)
    return build_model("n", NC)


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return torch.rand(2, 3, H, W, generator=torch.Generator().manual_seed(0))


def test_every_model_is_pinned():
    assert sorted(PUBLISHED) == sorted(MODELS)


@pytest.mark.parametrize("family", registry.FAMILIES)
def test_a_family_module_has_what_a_family_needs(family):
    """What model.py and weights.py read of a family module: the registry's
    sizes, a body, the head's variant and ultralytics' layer map."""
    spec = families.load(family)
    assert tuple(spec.SCALES) == tuple(spec.PUBLISHED_PARAMETERS) == tuple(spec.CLASSIFY_SCALES) == registry.SCALES
    assert len(spec.classify_body(lambda c: c, lambda n: n, "n")) == spec.CLASSIFY_LAYERS
    assert callable(spec.body) and isinstance(spec.DEPTHWISE_CLS, bool) and isinstance(spec.END2END, bool)
    assert spec.REG_MAX in (1, 16)
    assert spec.ULTRALYTICS_LAYERS[-1] == "head"


def dfl_weights(name: str) -> int:
    reg_max = families.load(name[:-1]).REG_MAX
    return reg_max if reg_max > 1 else 0


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_matches_published(name):
    n = count_parameters(build_model(name, 80))
    print(f"{name} nc=80: {n:,} parameters (published {PUBLISHED[name]:,})")
    assert n == PUBLISHED[name] - dfl_weights(name)  # the architecture is exact, not merely close


# YOLO26's one-to-one head at nc=80 (ultralytics 8.4.190's own count, in the
# fixtures' README): a copy of the box and class branches, counted above too.
YOLO26_ONE2ONE = {"n": 154_828, "s": 496_892, "m": 1_460_988, "l": 1_460_988, "x": 3_220_476}


@pytest.mark.parametrize("scale", registry.SCALES)
def test_yolo26_has_a_one_to_one_copy_of_its_head(scale):
    model = build_model(f"yolo26{scale}", 80)
    assert sum(p.numel() for name, p in model.named_parameters() if ".one2one_" in name) == YOLO26_ONE2ONE[scale]
    assert model.reg_max == 1 and model.no == 4 + 80


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_old_sizes_are_yolov8(alias):
    model = build_model(alias, 80)
    assert model.arch == f"yolov8{alias}"
    assert count_parameters(model) == PUBLISHED[f"yolov8{alias}"] - 16
    # Weights saved under the alias load into the full name's model and back.
    assert model.state_dict().keys() == build_model(f"yolov8{alias}", 80).state_dict().keys()


@pytest.mark.parametrize("name", ["x", "yolov9n", "yolo11", "yolov8p"])
def test_unknown_scale_is_a_clear_error(name):
    with pytest.raises(ValueError, match=f"unknown model scale '{name}'"):
        build_model(name, 80)


@pytest.mark.parametrize("name", ["yolo11n", "yolo11m"])
def test_yolo11_forward_backward(name, image):
    torch.manual_seed(0)
    model = build_model(name, NC)
    feats = model(image)
    assert [tuple(f.shape) for f in feats] == [(2, 4 * 16 + NC, H // s, W // s) for s in (8, 16, 32)]
    (sum(f.square().mean() for f in feats) + model.decode(feats).mean()).backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model)).eval()
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model.predict(image), synced.predict(image))
        cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
        out = cl.predict(image.contiguous(memory_format=torch.channels_last))
        assert torch.allclose(model.predict(image), out, atol=1e-4, rtol=1e-4)


def test_forward_shapes(model, image):
    feats = model(image)
    assert model.stride.tolist() == [8.0, 16.0, 32.0]
    assert model.reg_max == 16 and model.nc == NC
    assert [tuple(f.shape) for f in feats] == [(2, 4 * 16 + NC, H // s, W // s) for s in (8, 16, 32)]


def test_forward_same_in_train_and_eval_shapes(model, image):
    model.eval()
    try:
        eval_shapes = [f.shape for f in model(image)]
    finally:
        model.train()
    assert eval_shapes == [f.shape for f in model(image)]


def test_decode_shape_and_sanity(model, image):
    out = model.predict(image)
    assert out.shape == (2, 4 + NC, 8 * 12 + 4 * 6 + 2 * 3)
    boxes, scores = out[:, :4], out[:, 4:]
    assert torch.isfinite(boxes).all()
    assert (boxes[:, 2:] > 0).all()
    # The class-bias prior keeps every initial score far below a detection threshold.
    assert scores.max() < 0.05 and scores.min() > 0


def test_decode_places_boxes_at_cell_centres(model):
    # Uniform box logits give the mean bin (reg_max-1)/2 on every side: boxes
    # centred on their cell, side 2 * 7.5 * stride. Maps of a 32x32 input.
    feats = [torch.zeros(1, 4 * 16 + NC, 32 // s, 32 // s) for s in (8, 16, 32)]
    out = model.decode(feats)[0]
    assert out.shape == (4 + NC, 16 + 4 + 1)
    assert out[:4, 0].tolist() == [4.0, 4.0, 120.0, 120.0]
    assert out[:4, 1].tolist() == [12.0, 4.0, 120.0, 120.0]  # x varies fastest, as in flatten
    assert out[:4, 4].tolist() == [4.0, 12.0, 120.0, 120.0]
    assert out[:4, 16].tolist() == [8.0, 8.0, 240.0, 240.0]
    assert out[:4, 20].tolist() == [16.0, 16.0, 480.0, 480.0]
    assert torch.allclose(out[4:], torch.full((NC, 21), 0.5))


def test_backward_reaches_every_parameter(image):
    torch.manual_seed(0)
    model = build_model("n", NC)
    feats = model(image)
    loss = sum(f.float().square().mean() for f in feats) + model.decode(feats).mean()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_eval_is_deterministic(model, image):
    model.eval()
    try:
        with torch.no_grad():
            a, b = model.predict(image), model.predict(image)
    finally:
        model.train()
    assert torch.equal(a, b)


def test_sync_batchnorm_conversion(model, image):
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    assert not any(type(m) is nn.BatchNorm2d for m in synced.modules())
    bns = [m for m in synced.modules() if isinstance(m, nn.SyncBatchNorm)]
    assert bns and all(m.eps == 1e-3 and m.momentum == 0.03 for m in bns)
    # Without a process group SyncBatchNorm runs only in eval; there it must match BN.
    model.eval(), synced.eval()
    try:
        with torch.no_grad():
            assert torch.allclose(model.predict(image), synced.predict(image))
    finally:
        model.train()


def test_channels_last_matches(model, image):
    cl = copy.deepcopy(model).to(memory_format=torch.channels_last).eval()
    model.eval()
    try:
        with torch.no_grad():
            ref = model.predict(image)
            out = cl.predict(image.contiguous(memory_format=torch.channels_last))
    finally:
        model.train()
    assert torch.allclose(ref, out, atol=1e-4, rtol=1e-4)


def test_stride_is_not_checkpoint_state(model):
    assert "stride" not in model.state_dict()
