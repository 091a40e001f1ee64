"""Weights files: ultralytics checkpoints read without running them, mapped
onto our models layer for layer; our own weights and checkpoints; refusals."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHARED
from PIL import Image

from hpcyolo_trainer.model import safe_pickle
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.model.weights import Weights, build_from, load_into, read_weights

FIXTURES = SHARED / "fixtures" / "ultralytics"
FAMILIES = ["yolov8n", "yolo11n", "yolo26n"]
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"no reference fixtures in {FIXTURES}")


def fixture(arch: str) -> Path:
    return FIXTURES / f"{arch}-shapes"


@needs_fixtures
@pytest.mark.parametrize("arch", FAMILIES)
def test_ultralytics_checkpoint_gives_ultralytics_output(arch, one_thread):
    """Our model, loaded from ultralytics' best.pt, computes ultralytics' own
    eval-mode Detect output (boxes cx,cy,w,h in pixels, sigmoid scores)."""
    weights = read_weights(fixture(arch) / "model.pt")
    reference = json.loads((fixture(arch) / "reference.json").read_text())
    assert weights.arch == arch
    assert weights.names == [reference["names"][str(i)] for i in range(reference["nc"])]
    assert weights.imgsz == reference["imgsz"]
    model = build_model(weights.arch, weights.nc)
    line = load_into(model, weights)
    n = len(model.state_dict())
    assert line == f"weights: {n}/{n} tensors from model.pt (ultralytics {arch}, 4 classes)"
    # Ultralytics' count includes a DFL's 16 fixed weights, which we compute (YOLO26 has no DFL).
    assert sum(p.numel() for p in model.parameters()) == reference["parameters"] - (16 if model.reg_max > 1 else 0)
    x = torch.load(fixture(arch) / "input.pt", weights_only=True)
    expected = torch.load(fixture(arch) / "output.pt", weights_only=True)
    with torch.no_grad():
        out = model.eval().predict(x)
    assert out.shape == expected.shape == tuple(reference["output_shape"])
    diff = ((out - expected).abs().max() / expected.abs().max()).item()
    print(f"{arch}: max abs diff / max abs value = {diff:.2e}")
    assert diff < 1e-6  # docs/training.md: within 1e-6 relative (measured 1e-7 to 3e-7)


@needs_fixtures
def test_a_wrong_mapping_would_be_caught(one_thread):
    """The output comparison can fail: swap two same-shaped tensors and it does."""
    weights = read_weights(fixture("yolov8n") / "model.pt")
    state = dict(weights.state)
    a, b = "neck.td3.m.0.cv1.0.weight", "neck.td3.m.0.cv2.0.weight"
    assert state[a].shape == state[b].shape
    state[a], state[b] = state[b], state[a]
    model = build_model("yolov8n", 4)
    load_into(model, type(weights)(**{**weights.__dict__, "state": state}))
    x = torch.load(fixture("yolov8n") / "input.pt", weights_only=True)
    expected = torch.load(fixture("yolov8n") / "output.pt", weights_only=True)
    with torch.no_grad():
        out = model.eval().predict(x)
    assert ((out - expected).abs().max() / expected.abs().max()).item() > 1e-3


@needs_fixtures
def test_loading_never_imports_ultralytics(tmp_path):
    """A package named ultralytics first on the path writes a canary if imported:
    reading the checkpoint leaves none and imports no ultralytics module."""
    fake = tmp_path / "site" / "ultralytics"
    fake.mkdir(parents=True)
    canary = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(canary)!r}, 'w').close()\n")
    code = ("import sys\n"
            f"sys.path.insert(0, {str(tmp_path / 'site')!r})\n"
            "from hpcyolo_trainer.model.weights import read_weights\n"
            f"w = read_weights({str(fixture('yolo11n') / 'model.pt')!r})\n"
            "assert w.arch == 'yolo11n'\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ultralytics'))\n")
    r = subprocess.run(["nice", "-n", "19", sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    assert not canary.exists()


# ---------------------------------------------------------------- crafted pickles

def torch_zip(path: Path, pickled: bytes) -> Path:
    """A file laid out as torch.save writes one: NAME/data.pkl, NAME/byteorder, ..."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickled)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    return path


class Call:
    """Pickles as a call of `fn(*args)`: what a malicious checkpoint does."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def nested_payload(payload) -> bytes:
    """A plausible checkpoint: ultralytics-looking keys, the payload inside."""
    return pickle.dumps({"date": "2026-01-01", "version": "8.4.0", "model": None, "train_args": {"x": payload}},
                        protocol=2)


@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "builtins.exec", "builtins.getattr", "subprocess"])
def test_dangerous_pickle_is_refused_and_runs_nothing(kind, tmp_path, capsys):
    canary = tmp_path / "canary"
    command = f"touch {canary}"
    payload, refused = {
        "os.system": (Call(os.system, command), f"{os.system.__module__}.system"),
        "builtins.eval": (Call(eval, f"__import__('os').system({command!r})"), "builtins.eval"),
        "builtins.exec": (Call(exec, f"__import__('os').system({command!r})"), "builtins.exec"),
        "builtins.getattr": (Call(getattr, Call(__import__, "os"), "system"), "builtins.getattr"),
        "subprocess": (Call(subprocess.call, ["touch", str(canary)]), "subprocess.call"),
    }[kind]
    path = torch_zip(tmp_path / "evil.pt", nested_payload(payload))
    with pytest.raises(HpcyoloError) as e:
        read_weights(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: refused to load") and refused in message
    assert not canary.exists()
    # The CLI says it in one line, exit code non-zero, no traceback.
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (64, 48)).save(images / "a.jpg")
    r = subprocess.run(["nice", "-n", "19", str(Path(sys.executable).parent / "hpcyolo"), "predict", str(path),
                        str(images), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"hpcyolo: error: {message}"]
    assert not canary.exists()


def test_an_interpolation_mode_is_read_as_its_value_and_nothing_else_is_called(tmp_path):
    """An ultralytics classifier records its torchvision transforms, their
    interpolation an enum rebuilt by a call with its value: that call gives
    the plain value; with anything but a str or an int it is refused; the
    transforms' classes are inert stand-ins, never called."""
    mode = b"ctorchvision.transforms.functional\nInterpolationMode\n"
    read = safe_pickle.load(torch_zip(tmp_path / "ok.pt", b"\x80\x02" + mode + b"X\x08\x00\x00\x00bilinear\x85R."))
    assert read == "bilinear"
    with pytest.raises(safe_pickle.RefusedPickle, match="an enum rebuilt from something other than a str or int"):
        safe_pickle.load(torch_zip(tmp_path / "list.pt", b"\x80\x02" + mode + b"]\x85R."))
    with pytest.raises(safe_pickle.RefusedPickle, match="calls torchvision.transforms.transforms.Compose"):
        safe_pickle.load(torch_zip(tmp_path / "call.pt", b"\x80\x02ctorchvision.transforms.transforms\nCompose\n)R."))
    with pytest.raises(safe_pickle.RefusedPickle, match="torchvision.ops.nms"):
        safe_pickle.load(torch_zip(tmp_path / "ops.pt", b"\x80\x02ctorchvision.ops\nnms\n)R."))


def test_calling_a_stand_in_class_is_refused(tmp_path):
    """Classes from ultralytics/torch.nn become inert stand-ins; a pickle that
    calls one (REDUCE) instead of building it is refused."""
    pickled = b"\x80\x02cultralytics.nn.tasks\nDetectionModel\n)R."
    with pytest.raises(safe_pickle.RefusedPickle, match="calls ultralytics.nn.tasks.DetectionModel"):
        safe_pickle.load(torch_zip(tmp_path / "m.pt", pickled))


def test_stand_ins_record_state_and_nothing_else(tmp_path):
    # NEWOBJ + BUILD, as torch.save writes a module: the state is kept as given.
    pickled = b"\x80\x02cultralytics.nn.modules.conv\nConv\n)\x81}X\x01\x00\x00\x00aK\x01sb."
    obj = safe_pickle.load(torch_zip(tmp_path / "m.pt", pickled))
    assert isinstance(obj, safe_pickle.Inert) and obj.kind == "Conv" and obj.state == {"a": 1}


class _TensorPickler(pickle.Pickler):
    """Writes a tensor as torch.save does: _rebuild_tensor_v2 over a persistent storage id."""

    def persistent_id(self, obj):
        return ("storage", torch.FloatStorage, "0", "cpu", 2) if obj == "STORAGE" else None


def tensor_pickle(hooks) -> bytes:
    buf = io.BytesIO()
    rebuild = Call(torch._utils._rebuild_tensor_v2, "STORAGE", 0, (2,), (1,), False, hooks)
    _TensorPickler(buf, protocol=2).dump({"t": rebuild})
    return buf.getvalue()


def test_tensor_hooks_are_refused(tmp_path):
    """A tensor rebuilt with backward hooks would carry callables: refused, as torch does."""
    import collections

    storage = torch.tensor([1.0, 2.0]).numpy().tobytes()
    ok = safe_pickle.load(torch_zip_with(tmp_path / "ok.pt", tensor_pickle(collections.OrderedDict()), storage))
    assert torch.equal(ok["t"], torch.tensor([1.0, 2.0]))
    hooked = tensor_pickle(collections.OrderedDict([(1, collections.OrderedDict())]))
    with pytest.raises(safe_pickle.RefusedPickle, match="hooks"):
        safe_pickle.load(torch_zip_with(tmp_path / "hooked.pt", hooked, storage))


def torch_zip_with(path: Path, pickled: bytes, storage: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickled)
        zf.writestr("archive/data/0", storage)
        zf.writestr("archive/byteorder", "little")
    return path


# ---------------------------------------------------------------- our own files

def test_our_weights_and_checkpoints_load(tmp_path):
    torch.manual_seed(0)
    model = build_model("yolo11n", 3)
    with torch.no_grad():
        model.head.cls[0][2].bias.add_(1.0)  # differs from a fresh model
    torch.save({"model": model.state_dict(), "scale": "yolo11n", "names": ["a", "b", "c"], "imgsz": 320},
               tmp_path / "best.pt")
    weights = read_weights(tmp_path / "best.pt")
    assert (weights.arch, weights.names, weights.imgsz, weights.origin) == ("yolo11n", ["a", "b", "c"], 320,
                                                                          "hpcyolo weights")
    loaded = build_from(weights)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    # A checkpoint: the EMA is what loads, as weights/*.pt keep the EMA.
    torch.save({"model": build_model("yolo11n", 3).state_dict(), "ema": {"module": model.state_dict(), "updates": 5},
                "config": {"model": "yolo11n", "imgsz": 320}, "format": 1, "complete": True}, tmp_path / "ckpt.pt")
    weights = read_weights(tmp_path / "ckpt.pt")
    assert (weights.arch, weights.nc, weights.origin) == ("yolo11n", 3, "hpcyolo checkpoint")
    assert torch.equal(build_from(weights).head.cls[0][2].bias, model.head.cls[0][2].bias)


def test_weights_saved_as_n_are_yolov8n(tmp_path):
    """Weights written before the model families say scale "n": still YOLOv8n."""
    model = build_model("n", 2)
    torch.save({"model": model.state_dict(), "scale": "n", "names": ["a", "b"], "imgsz": 64}, tmp_path / "old.pt")
    weights = read_weights(tmp_path / "old.pt")
    assert weights.arch == "yolov8n"
    build_from(weights)


def test_mismatches_are_one_line(tmp_path):
    torch.save({"model": build_model("yolov8n", 2).state_dict(), "scale": "yolov8n", "names": ["a", "b"],
                "imgsz": 64}, tmp_path / "w.pt")
    weights = read_weights(tmp_path / "w.pt")
    with pytest.raises(HpcyoloError, match=r"w\.pt: holds yolov8n, not yolo11n$"):
        load_into(build_model("yolo11n", 3), weights)
    with pytest.raises(HpcyoloError, match=r"w\.pt: holds yolov8n, not yolo11n$"):
        load_into(build_model("yolo11n", 2), weights)
    # Right names, wrong tensors: nothing loads.
    torch.save({"model": build_model("yolov8s", 2).state_dict(), "scale": "yolov8n", "names": ["a", "b"],
                "imgsz": 64}, tmp_path / "s.pt")
    with pytest.raises(HpcyoloError, match=r"s\.pt: does not fit yolov8n \(0 missing, 0 extra, \d+ of another shape"):
        build_from(read_weights(tmp_path / "s.pt"))


@pytest.mark.parametrize("content", [b"not a zip at all", None])
def test_not_weights_is_one_line(tmp_path, content):
    path = tmp_path / "x.pt"
    if content is None:
        torch.save({"something": torch.zeros(2)}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(HpcyoloError, match=r"x\.pt: not hpcyolo weights such as RUN/weights/best\.pt, "
                                          r"nor an ultralytics checkpoint \("):
        read_weights(path)


# ---------------------------------------------------------------- hpcyolo predict

def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@needs_fixtures
@pytest.mark.parametrize("arch, end2end", [(arch, False) for arch in FAMILIES] + [("yolo26n", True)])
def test_predict_finds_ultralytics_boxes(arch, end2end, tmp_path):
    """`hpcyolo predict` on ultralytics' checkpoint finds the boxes ultralytics'
    own predict found (conf 0.25, iou 0.7): every box of confidence >= 0.3
    matched one to one by a box of the same class with IoU >= 0.9. YOLO26
    both ways: NMS over the one-to-many head (ultralytics' default) and
    --end2end (its one-to-one head, ultralytics' nms=False)."""
    folder = fixture(arch)
    r = subprocess.run(["nice", "-n", "19", str(Path(sys.executable).parent / "hpcyolo"), "predict",
                        str(folder / "model.pt"), str(folder / "images"), "--out", str(tmp_path), "--format", "json",
                        "--conf", "0.25", "--iou", "0.7", *(["--end2end"] if end2end else [])],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = {Path(p["image"]).name: p["detections"] for p in json.loads((tmp_path / "predictions.json").read_text())}
    theirs = json.loads((folder / ("predictions_e2e.json" if end2end else "predictions.json")).read_text())
    assert sorted(ours) == sorted(theirs)
    checked, worst = 0, 1.0
    for image, ref in theirs.items():
        free = list(ours[image])
        for box, conf, cls in zip(ref["xyxy"], ref["conf"], ref["cls"]):
            if conf < 0.3:
                continue
            candidates = [d for d in free if d["class"] == cls]
            best = max(candidates, key=lambda d: iou(box, d["box_xyxy"]), default=None)
            assert best is not None, f"{image}: no class {cls} box for {box}"
            overlap = iou(box, best["box_xyxy"])
            assert overlap >= 0.9, f"{image}: best match of {box} has IoU {overlap:.3f}"
            free.remove(best)
            checked, worst = checked + 1, min(worst, overlap)
    print(f"{arch}{' end2end' if end2end else ''}: {checked} boxes matched, worst IoU {worst:.4f}")
    assert checked >= 40
    assert sum(len(d) for d in ours.values()) == sum(len(p["conf"]) for p in theirs.values())


@pytest.mark.parametrize("shape, canvas, gain, offset", [
    ((160, 160), (160, 160), 1.0, (0, 0)),
    ((100, 160), (128, 160), 1.0, (0, 14)),  # pad to a multiple of 32 only, centred
    ((300, 200), (160, 128), 160 / 300, (10, 0)),  # 107 px wide: 21 px of padding, the odd one right
    ((50, 80), (128, 160), 2.0, (0, 14)),  # enlarged to the size, as ultralytics' predict does
])
def test_predict_letterbox_is_ultralytics_rectangle(shape, canvas, gain, offset):
    from hpcyolo_trainer.eval.predict import rect_letterbox

    img = np.zeros((*shape, 3), dtype=np.uint8)
    out, g, (left, top) = rect_letterbox(img, 160)
    assert out.shape[:2] == canvas and g == pytest.approx(gain) and (left, top) == offset
    assert (out[:top] == 114).all() and (out[top + round(shape[0] * g):] == 114).all()


@pytest.mark.parametrize("arch", FAMILIES)
def test_weights_of_other_classes_give_all_but_the_class_convs(tmp_path, arch):
    """Fine-tuning to other classes: every tensor but the last conv of each
    class branch comes from the file; those keep the fresh model's init."""
    source = build_model(arch, 4)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)  # unlike any fresh initialisation
    torch.save({"model": source.state_dict(), "scale": arch, "names": list("abcd"), "imgsz": 64}, tmp_path / "w.pt")
    weights = read_weights(tmp_path / "w.pt")
    torch.manual_seed(5)
    fresh = build_model(arch, 3)
    torch.manual_seed(5)
    model = build_model(arch, 3)
    line = load_into(model, weights)
    total = len(model.state_dict())
    # The last conv of each level's class branch, in both heads where there are two (YOLO26).
    new = {f"head.{head}.{i}.2.{p}" for head in ("cls", "one2one_cls")[:2 if arch == "yolo26n" else 1]
           for i in range(3) for p in ("weight", "bias")}
    assert line == (f"weights: {total - len(new)}/{total} tensors from w.pt (hpcyolo weights, 4 classes); "
                    "class convs new for 3 classes")
    for k, v in model.state_dict().items():
        if k in new:
            assert torch.equal(v, fresh.state_dict()[k]), k  # the model's own init, bias prior included
        else:
            assert torch.equal(v, source.state_dict()[k]), k
    assert model.state_dict()["head.cls.0.2.bias"].shape == (3,)
    assert model.head.cls[0][2].bias[0].item() == pytest.approx(math.log(5 / 3 / (640 / 8) ** 2))


def test_weights_whose_classes_widen_the_class_branches_give_all_but_those():
    """COCO's 80 classes make the n model's class branches 80 wide, 3 classes
    64: the whole class branches start fresh (as ultralytics), the rest loads."""
    torch.manual_seed(0)
    source = build_model("yolov8n", 80)
    weights = Weights("yolov8n", [str(i) for i in range(80)], 640, source.state_dict(), "ultralytics yolov8n", "y.pt")
    torch.manual_seed(1)
    fresh = build_model("yolov8n", 3)
    torch.manual_seed(1)
    model = build_model("yolov8n", 3)
    line = load_into(model, weights)
    branch = [k for k in model.state_dict() if k.startswith("head.cls.")]
    total = len(model.state_dict())
    assert len(branch) == 42
    assert line == (f"weights: {total - 42}/{total} tensors from y.pt (ultralytics yolov8n, 80 classes); class "
                    "branches new for 3 classes")
    for k, v in model.state_dict().items():
        assert torch.equal(v, (fresh if k in branch else source).state_dict()[k]), k


@pytest.mark.parametrize("recorded, trained", [(100, 128), (640, 640), (33, 64), (None, None), ("640", None), (0, None)])
def test_an_ultralytics_size_is_the_one_it_trained_at(recorded, trained):
    # ultralytics records imgsz as asked and trains at it rounded up to the
    # stride: val, predict and export default to that, a size the models take.
    from hpcyolo_trainer.model.weights import _trained_size

    assert _trained_size(recorded) == trained
