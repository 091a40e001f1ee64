"""Weights from a file: hpcyolo's own (weights/*.pt, checkpoints) or ultralytics'.

hpcyolo's files are plain dicts of tensors: torch.load(weights_only=True)
reads them. An ultralytics checkpoint pickles its model object; it is read
with `safe_pickle` (nothing in it runs), and its tensors are renamed from
ultralytics' layer indices (`model.N.…`) to this package's module names:

- `model.N` -> the module holding layer N of the published table (the family module's ULTRALYTICS_LAYERS);
- ultralytics' Conv keeps `conv`/`bn` attributes, ours is a Sequential: `0`/`1`;
- the head's modules by its task's `HeadMap` (model/heads.py: detection's
  `cv2`/`cv3` are our `box`/`cls`, its DFL weights the fixed bins 0..15,
  which ours computes rather than stores).

Every tensor must find its place with the same shape, or nothing is loaded;
and every module's options that its tensors do not show (activations, SPPF's
pooling, residual adds, attention heads, the head's options) must be, by
the checkpoint's own records, what hpcyolo builds (check_records).

How the head of an ultralytics file's task maps is that head's HeadMap
(model/heads.py).
"""

from __future__ import annotations

import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common import registry
from ..common.errors import HpcyoloError, shown
from ..common.registry import MAX_STRIDE
from ..common.rundir import WEIGHTS
from . import safe_pickle
from .heads import HEADS, HeadMap
from .detector import DetectionModel, build_model, resolve_model

# A keypoint model's branches whose widths follow its kpt_shape (model/pose.py PoseHead; YOLO26's one-to-one copies)
KEYPOINT_BRANCHES = ("head.kpt", "head.one2one_kpt")
_NOT_WEIGHTS = f"not hpcyolo weights such as RUN/{WEIGHTS}/best.pt, nor an ultralytics checkpoint"
_ULTRALYTICS_NAME = re.compile(f"({'|'.join(registry.FAMILIES)})([{''.join(registry.SCALES)}])?(-seg|-cls|-pose|-obb)?")
_SUFFIX = {"detect": None, "segment": "-seg", "classify": "-cls", "pose": "-pose", "obb": "-obb"}  # yolo11n-seg.yaml


@dataclass(frozen=True)
class Weights:
    """A detector's tensors under our names, and what is known about them."""

    arch: str  # yolov8n ... yolo11x
    names: list[str]  # class names
    imgsz: int | None  # the training image size, where the file says
    state: dict[str, torch.Tensor]
    origin: str  # "ultralytics yolov8n", "hpcyolo weights", "hpcyolo checkpoint"
    path: str
    task: str = registry.DEFAULT_TASK  # what the model was trained for (registry.TASKS)
    kpt_shape: tuple[int, int] | None = None  # a keypoint model's (keypoints, 2 or 3): its head's record

    @property
    def nc(self) -> int:
        return len(self.names)


def as_weights(source: str | Path | Weights) -> Weights:
    """`source` read (read_weights), where it is a path."""
    return source if isinstance(source, Weights) else read_weights(source)


def read_weights(path: str | Path) -> Weights:
    """The weights in `path`; HpcyoloError (one line naming the file) if it holds none we can use."""
    path = str(path)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights-only refuses its globals: maybe an ultralytics object pickle
        return read_ultralytics(path)
    except FileNotFoundError:
        raise HpcyoloError(f"{path}: no such file") from None
    except Exception as e:  # not a torch file at all: many kinds
        raise HpcyoloError(f"{path}: {_NOT_WEIGHTS} ({type(e).__name__} while loading)") from None
    return _ours(saved, path)


def _ours(saved, path: str) -> Weights:
    """hpcyolo's weights/*.pt ({model, scale, names, imgsz}) or a checkpoint ({model, ema, config, ...})."""
    if isinstance(saved, dict) and isinstance(saved.get("model"), dict) and "scale" in saved and "names" in saved:
        task = _task(saved.get("task"), path)
        return Weights(_canonical(saved["scale"], path), [str(n) for n in saved["names"]], int(saved["imgsz"]),
                       saved["model"], "hpcyolo weights", path, task, _saved_kpt_shape(saved, task, path))
    if isinstance(saved, dict) and isinstance(saved.get("ema"), dict) and isinstance(saved.get("config"), dict):
        config, state = saved["config"], saved["ema"]["module"]  # the EMA, as weights/*.pt holds
        nc, task = _head_classes(state, path), _task(config.get("task"), path)
        return Weights(_canonical(config.get("model") or "n", path), [str(i) for i in range(nc)],
                       config.get("imgsz"), state, "hpcyolo checkpoint", path, task,
                       _saved_kpt_shape(saved, task, path))
    raise HpcyoloError(f"{path}: {_NOT_WEIGHTS} (a torch file of something else)")


def _task(name: object, path: str) -> str:
    """The task a file of ours says it holds (files before train.task: detect)."""
    name = registry.DEFAULT_TASK if name is None else name
    if name not in registry.TASKS:
        raise HpcyoloError(f"{path}: holds a {shown(name)} model; hpcyolo trains {', '.join(registry.TASKS)}")
    return name


def _canonical(name: str, path: str) -> str:
    try:
        family, scale = resolve_model(str(name))
    except ValueError as e:
        raise HpcyoloError(f"{path}: {e}") from None
    return family + scale


def _saved_kpt_shape(saved: dict, task: str, path: str) -> tuple[int, int] | None:
    """A keypoint model's kpt_shape, as our weights and checkpoints record it (None for other tasks)."""
    if task != "pose":
        return None
    shape = saved.get("kpt_shape")
    if not (isinstance(shape, (list, tuple)) and len(shape) == 2 and all(isinstance(v, int) for v in shape)
            and shape[0] >= 1 and shape[1] in (2, 3)):
        raise HpcyoloError(f"{path}: a keypoint model without its kpt_shape ([keypoints, 2 or 3]), got {shown(shape)}")
    return (shape[0], shape[1])


def _head_classes(state: dict, path: str) -> int:
    """The classes of a checkpoint's head: a detector's class conv, or a classifier's linear layer."""
    bias = state.get("head.cls.0.2.bias", state.get("head.linear.bias"))
    if bias is None:
        raise HpcyoloError(f"{path}: a checkpoint without a detection or classification head (head.cls.0.2.bias, "
                           "head.linear.bias)")
    return int(bias.shape[0])


# ---------------------------------------------------------------- ultralytics

def read_ultralytics(path: str, tasks=registry.TASKS) -> Weights:
    """An ultralytics checkpoint's model, mapped by its records, if it is one
    of `tasks` (by default the tasks hpcyolo trains; model/heads.py's HEADS
    also names the ones whose models it builds and reads before it trains
    them)."""
    try:
        ckpt = safe_pickle.load(path)
    except HpcyoloError:
        raise
    except (zipfile.BadZipFile, ValueError, pickle.UnpicklingError, EOFError, TypeError, AttributeError) as e:
        raise HpcyoloError(f"{path}: {_NOT_WEIGHTS} ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict):
        raise HpcyoloError(f"{path}: not an ultralytics checkpoint (no dict at its top)")
    model = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
    if not isinstance(model, safe_pickle.Inert) or not isinstance(model.state, dict):
        raise HpcyoloError(f"{path}: not an ultralytics checkpoint (no model or ema object)")
    info = model.state
    task = registry.ULTRALYTICS_MODELS.get(model.kind)
    if task not in tasks:  # by its records: the model class its pickle names
        holds = f"a {task} model" if task else "no model of a task hpcyolo knows"
        raise HpcyoloError(f"{path}: holds an ultralytics {model.kind} ({holds}); hpcyolo trains "
                           f"{', '.join(registry.TASKS)} models ({', '.join(k for k, t in registry.ULTRALYTICS_MODELS.items() if t in registry.TASKS)})")
    head = HEADS[task]
    arch = _ultralytics_arch(info.get("yaml"), path, task)
    names = info.get("names")
    names = [str(names[k]) for k in sorted(names)] if isinstance(names, dict) else [str(n) for n in names or []]
    tensors = dict(_module_tensors(model, ""))
    state = _rename(tensors, arch, head, path)
    kpt_shape = _kpt_shape(model, path) if task == "pose" else None
    check_records(model, arch, path, kpt_shape)
    args = info.get("args") if isinstance(info.get("args"), dict) else ckpt.get("train_args") or {}
    imgsz = args.get("imgsz") if isinstance(args, dict) else None
    return Weights(arch, names, _trained_size(imgsz), state, f"ultralytics {arch}", path, task, kpt_shape)


def _kpt_shape(model: safe_pickle.Inert, path: str) -> tuple[int, int]:
    """A keypoint model's (keypoints, 2 or 3), as its head (the last layer) records it."""
    layers = dict(_modules(model.state.get("_modules", {}).get("model"), "model"))
    last = max((n for n in layers if n.count(".") == 1), key=lambda n: int(n.split(".")[1]), default=None)
    recorded = layers[last].state.get("kpt_shape") if last else None
    if not isinstance(recorded, (list, tuple)) or len(recorded) != 2 or recorded[1] not in (2, 3) \
            or not isinstance(recorded[0], int) or recorded[0] < 1:
        raise HpcyoloError(f"{path}: its keypoint head records kpt_shape {shown(recorded)}, not [keypoints, 2 or 3]")
    return int(recorded[0]), int(recorded[1])


def _trained_size(imgsz) -> int | None:
    """The size an ultralytics run trained at: it records the size asked for
    and rounds it up to a multiple of the stride (its check_imgsz) itself."""
    if not isinstance(imgsz, int) or imgsz < 1:
        return None
    return -(-imgsz // MAX_STRIDE) * MAX_STRIDE


def _ultralytics_arch(yaml, path: str, task: str = "detect") -> str:
    """yolov8n ... yolo11x from the model's recorded yaml (yaml_file 'yolov8n.yaml' or, for
    another task, 'yolo11n-seg.yaml'; scale 'n'); its suffix must be its model class's task's."""
    if not isinstance(yaml, dict):
        raise HpcyoloError(f"{path}: the model records no architecture (yaml)")
    stem = Path(str(yaml.get("yaml_file") or "")).stem
    m = _ULTRALYTICS_NAME.fullmatch(stem)
    scale = yaml.get("scale") or (m.group(2) if m else None)
    if not m or scale not in registry.SCALES:
        raise HpcyoloError(f"{path}: ultralytics architecture {shown(yaml.get('yaml_file'))} is not one hpcyolo builds "
                           f"({', '.join(f'{f}{registry.SCALES[0]}-{registry.SCALES[-1]}' for f in registry.FAMILIES)})")
    if m.group(3) != _SUFFIX.get(task):
        raise HpcyoloError(f"{path}: its architecture {shown(yaml.get('yaml_file'))} is not a {task} model's, "
                           f"though it holds one")
    return m.group(1) + scale


def _module_tensors(module: safe_pickle.Inert, prefix: str):
    """(state-dict name, tensor) of a pickled nn.Module tree, as module.state_dict() would list them."""
    state = module.state if isinstance(module.state, dict) else {}
    skip = state.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for name, value in (state.get(group) or {}).items():
            if isinstance(value, torch.Tensor) and name not in skip:
                yield prefix + name, value
    for name, child in (state.get("_modules") or {}).items():
        if isinstance(child, safe_pickle.Inert):
            yield from _module_tensors(child, f"{prefix}{name}.")


def _rename(tensors: dict[str, torch.Tensor], arch: str, head: HeadMap, path: str) -> dict[str, torch.Tensor]:
    """Ultralytics' names -> ours, checking each tensor against a model of `arch`."""
    layers = head.layers(arch[:-1])
    ours: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        parts = name.split(".")
        target = _our_name(name, layers, head) if len(parts) >= 3 else None
        if target is None:
            raise HpcyoloError(f"{path}: tensor {name} has no place in {arch}")
        computed = _computed(parts[2:], head) if target == "head" else None
        if computed is not None:
            head.computed[computed](value, name, path)
            continue
        ours[target] = value
    return ours


def _our_name(name: str, layers: tuple, head: HeadMap) -> str | None:
    """Our name of an ultralytics tensor or module (`model.N.…`); None where it has no place.
    A child of the head that hpcyolo computes (detection's DFL) ends at its layer: `head`."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "model" or not parts[1].isdigit() or int(parts[1]) >= len(layers) \
            or layers[int(parts[1])] is None:
        return None
    target, rest = layers[int(parts[1])], parts[2:]
    named = []  # a head's child the HeadMap names: that name, as it is
    if target == "head" and rest:
        if _computed(rest, head) is not None:
            return target
        if rest[0] in head.branches:
            named, rest = [head.branches[rest[0]]], rest[1:]
    # Ultralytics' Conv names its layers conv, bn, act; ours is a Sequential.
    rest = [{"conv": "0", "bn": "1", "act": "2"}.get(p, p) for p in rest]
    return ".".join([target, *named, *rest])


def _computed(rest: list[str], head: HeadMap) -> str | None:
    """The key of head.computed that a head-relative name (["dfl", "conv", "weight"]) is or lies under."""
    for i in range(1, len(rest) + 1):
        if ".".join(rest[:i]) in head.computed:
            return ".".join(rest[:i])
    return None


# == records, not shapes =======================================================
# A module's options that change what it computes but not its tensors (an
# activation, SPPF's pooling, a residual add, attention heads, the head's
# regression): each is read from the checkpoint's records and must be what
# hpcyolo builds for the architecture, or the file is refused. Ultralytics
# writes them as attributes of the module objects; a record an older release
# did not write takes that release's behaviour (the default below).

def check_records(model: safe_pickle.Inert, arch: str, path: str, kpt_shape: tuple[int, int] | None = None) -> None:
    """Refuse, in one line naming the layer, a checkpoint whose modules
    compute something else than hpcyolo's `arch` with the same tensors
    (a keypoint model's: at the checkpoint's `kpt_shape`)."""
    task = registry.ULTRALYTICS_MODELS[model.kind]
    head = HEADS[task]
    layers = head.layers(arch[:-1])
    with torch.device("meta"):  # the structure only: no memory, no initialisation cost
        ours = task_model(task, arch, 1, kpt_shape)
    for name, module in _modules(model.state.get("_modules", {}).get("model"), "model"):
        for what, theirs, mine in _options(module, name, ours, layers, head):
            if theirs != mine:
                raise HpcyoloError(f"{path}: layer {name.split('.')[1]} ({module.kind} at {name}) has {what} "
                                   f"{shown(theirs)} where hpcyolo's {arch} has {shown(mine)}: a variant hpcyolo "
                                   "does not build, refused rather than loaded to compute something else")


def _modules(module, name: str):
    """(ultralytics name, module record) for every module below `module`."""
    if not isinstance(module, safe_pickle.Inert) or not isinstance(module.state, dict):
        return
    for child_name, child in (module.state.get("_modules") or {}).items():
        if isinstance(child, safe_pickle.Inert) and isinstance(child.state, dict):
            yield f"{name}.{child_name}", child
            yield from _modules(child, f"{name}.{child_name}")


def _options(module: safe_pickle.Inert, name: str, ours: DetectionModel, layers: tuple, head: HeadMap):
    """(what, the record's value, ours) for each option of `module` that hpcyolo builds one way."""
    state, children = module.state, module.state.get("_modules") or {}

    def mine(suffix: str = ""):
        target = _our_name(name + suffix, layers, head)
        try:
            return ours.get_submodule(target) if target else None
        except AttributeError:
            return None

    if "act" in children:  # Conv, DWConv: conv, bn, act
        act = mine(".act")
        yield "activation", children["act"].kind, type(act).__name__ if act is not None else "none"
    kind = module.kind
    if kind == "SPPF":
        pool, ref = children.get("m"), mine()
        yield "pooling repeats (n)", state.get("n", 3), ref.n
        yield "a residual add (shortcut)", bool(state.get("add", False)), ref.add
        yield "a pooling kernel", pool.state.get("kernel_size") if pool else None, ref.pool.kernel_size
    elif kind == "Bottleneck":
        yield "a residual add (shortcut)", bool(state.get("add")), mine().add
    elif kind == "PSABlock":
        yield "a residual add (shortcut)", bool(state.get("add", True)), True
    elif kind == "Attention":
        ref = mine()
        yield "attention heads", state.get("num_heads"), ref.heads
        yield "a key width", state.get("key_dim"), ref.key_dim
    elif kind in head.kinds:
        if head.kind_of is not None:
            yield "a head class", kind, head.kind_of(ours)
        yield from head.records(state, ours)
    elif kind == "Upsample":
        yield "upsampling", (float(state.get("scale_factor") or 0), state.get("mode")), (2.0, "nearest")
    elif kind == "Concat":
        yield "a concatenation dimension", state.get("d"), 1


# ---------------------------------------------------------------- onto a model

def task_model(task: str, arch: str, nc: int, kpt_shape: tuple[int, int] | None = None):
    """A fresh model of `task` (registry.ULTRALYTICS_MODELS' tasks hpcyolo builds): the detector, or its
    segmenter, classifier, oriented-box detector or keypoint model (at `kpt_shape`, ultralytics' [17, 3] if None)."""
    if task == "pose":
        from .pose import KPT_SHAPE, PoseModel

        return PoseModel(nc, arch, kpt_shape or KPT_SHAPE)
    if task == "segment":
        from .segment import SegmentationModel

        return SegmentationModel(nc, arch)
    if task == "classify":
        from .classify import ClassificationModel

        return ClassificationModel(nc, arch)
    if task == "obb":
        from .obb import OBBModel

        return OBBModel(nc, arch)
    return build_model(arch, nc)


def build_from(weights: Weights) -> DetectionModel:
    """A model of the weights' architecture and class count, with the weights loaded."""
    model = task_model(weights.task, weights.arch, weights.nc, weights.kpt_shape)
    load_into(model, weights)
    return model


def class_convs(model: DetectionModel) -> list[str]:
    """The tensors whose shape follows the class count: the last conv (weight
    and bias) of each level's class branch; a classifier's linear layer."""
    if getattr(model, "task", None) == "classify":
        return ["head.linear.weight", "head.linear.bias"]
    heads = ("cls", "one2one_cls") if model.end2end else ("cls",)
    return [f"head.{head}.{i}.{len(b) - 1}.{p}" for head in heads for i, b in enumerate(getattr(model.head, head))
            for p in ("weight", "bias")]


def load_into(model: DetectionModel, weights: Weights) -> str:
    """Copy the weights into `model` (same architecture); the one-line report.

    Weights of other classes than the model's (fine-tuning to another
    dataset) give everything but the class convs, which keep the model's own
    fresh initialisation (seed the RNG before building the model for the
    same initialisation on every rank). Where the class count also sets the
    class branches' width (more than 64 classes at n: COCO's 80 onto a
    dataset of 3), the whole class branches start fresh, as in ultralytics.
    A keypoint model's weights of another kpt_shape (COCO's [17, 3] onto a
    dataset's [4, 3]) give everything but the keypoint branches (whose
    widths follow K x D), which start fresh: ultralytics transfers the
    tensors whose shapes match."""
    path = weights.path
    if model.arch != weights.arch:
        raise HpcyoloError(f"{path}: holds {weights.arch}, not {model.arch}")
    target = model.state_dict()
    fresh = class_convs(model) if model.nc != weights.nc else []
    branches = [k for k in target if k.startswith("head.cls.")]
    if fresh and any(k in weights.state and weights.state[k].shape != target[k].shape
                     for k in branches if k not in fresh):
        fresh = branches
    other_points = weights.kpt_shape is not None and getattr(model, "kpt_shape", None) is not None and \
        tuple(weights.kpt_shape) != tuple(model.kpt_shape)
    points = [k for k in target if k.startswith(KEYPOINT_BRANCHES)] if other_points else []
    wanted = [k for k in target if k not in fresh and k not in points]
    missing = [k for k in wanted if k not in weights.state]
    extra = [k for k in weights.state if k not in target and not (other_points and k.startswith(KEYPOINT_BRANCHES))]
    wrong = [k for k in wanted if k in weights.state and weights.state[k].shape != target[k].shape]
    if missing or extra or wrong:
        first = (f"{wrong[0]} has shape {tuple(weights.state[wrong[0]].shape)}, not {tuple(target[wrong[0]].shape)}"
                 if wrong else f"{missing[0]} is missing" if missing else f"{extra[0]} has no place")
        other = f" with {model.nc} classes instead of {weights.nc}" if fresh else ""
        raise HpcyoloError(f"{path}: does not fit {model.arch}{other} ({len(missing)} missing, {len(extra)} extra, "
                           f"{len(wrong)} of another shape; {first})")
    with torch.no_grad():
        for k in wanted:
            target[k].copy_(weights.state[k].to(target[k].dtype))
    line = (f"weights: {len(wanted)}/{len(target)} tensors from {Path(path).name} ({weights.origin}, "
            f"{weights.nc} classes)")
    what = "class branches" if len(fresh) > len(class_convs(model)) else "class convs"
    line += f"; {what} new for {model.nc} classes" if fresh else ""
    return line + (f"; keypoint branches new for kpt_shape {list(model.kpt_shape)} (the weights': "
                   f"{list(weights.kpt_shape)})" if points else "")
