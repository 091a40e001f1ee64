"""A user's ultralytics recipe: an `args.yaml` (every ultralytics run writes
one) or a hand-written hyperparameter YAML, read as it is (`train.cfg`,
`hpcyolo train --cfg`).

Every key is one of four kinds, and a run never silently differs from the
recipe:
- a setting hpcyolo has under the same name (the settings' table) or with a
  known translation (model, optimizer, cache, nms): taken, unless the job
  spec or the command line gives it, which wins;
- a key with no meaning for training on a cluster (where to save, devices,
  validation, prediction and export settings, other tasks' gains):
  listed in one info line;
- a training setting hpcyolo does not implement yet: taken only at
  ultralytics' default (where it changes nothing), else refused in one line;
- anything else: refused, since what it does is unknown.
No torch here: the CLI reads a recipe before it imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError
from .registry import MODELS
from .settings import BY_NAME, REQUIRED
from .yamlfile import read_yaml

# Keys with no meaning for training on a cluster: where and how ultralytics
# saves and shows, the device, validation/prediction/export settings, and the
# other tasks' (OBB, depth) settings.
NOT_FOR_TRAINING = frozenset("""
mode data device project name exist_ok save save_dir verbose deterministic profile compile
resume split save_json conf iou max_det half dnn agnostic_nms source vid_stride stream_buffer visualize augment
retina_masks embed show save_frames save_txt save_conf save_crop show_labels show_conf show_boxes line_width format
optimize dynamic simplify opset workspace quantize int8 tracker cfg angle dis
dlog dgrad dlam cls_remap pretrained
""".split())
# Training settings hpcyolo does not implement yet, at ultralytics 8.4.190's default.
NOT_YET = {"cls_pw": 0.0, "distill_model": None}
# Settings of the table that a recipe does not set: the run's own place and the cluster's.
NOT_FROM_A_RECIPE = frozenset({"run_dir", "data", "weights", "cfg", "cache_dir", "signal", "dist_timeout"})
OPTIMIZERS = {"sgd": "sgd", "adamw": "adamw", "musgd": "musgd", "auto": "auto"}  # ultralytics' names, lower-cased
CACHES = {False: "none", True: "ram", "ram": "ram", "disk": "disk"}


def read_recipe(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """(settings by name, the keys with no meaning here) of the recipe in
    `path`; ConfigError (one line naming the file and key) for a key that
    would change training and that hpcyolo does not implement."""
    file = str(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(file, "", "must be a mapping of ultralytics settings (an args.yaml)")
    taken, ignored = {}, []
    for key, value in raw.items():
        key = str(key)
        if key == "pretrained" and isinstance(value, str):
            raise ConfigError(file, key, f"{value}: weights to start from; give them as train.weights (--weights)")
        if key in NOT_FOR_TRAINING:
            ignored.append(key)
            continue
        if key in NOT_YET:
            if value != NOT_YET[key]:
                raise ConfigError(file, key, f"{value!r} changes training, and hpcyolo does not implement {key} "
                                             f"yet; remove it (ultralytics' default: {NOT_YET[key]!r}) to train "
                                             "without it")
            continue
        if key == "auto_augment":  # ultralytics' null or empty: none (its default is randaugment)
            if value not in (None, "", False, "randaugment"):
                raise ConfigError(file, key, f"{value!r}: hpcyolo has randaugment and none (null), not this policy "
                                             "yet")
            taken[key] = value or "none"
            continue
        if value is None and key in BY_NAME and key not in NOT_FROM_A_RECIPE:
            continue  # unset: the default, as in ultralytics (time, freeze, ...)
        name, value = _translated(file, key, value)
        if name is None:
            ignored.append(key)
            continue
        taken[name] = value
    return taken, ignored


def _translated(file: str, key: str, value: Any) -> tuple[str | None, Any]:
    """(our setting's name, its value) for an ultralytics key, checked as
    the job spec checks it; (None, None) for a key that sets nothing here."""
    if key == "model":
        return _model(file, value)
    if key == "optimizer":
        lowered = str(value).lower()
        if lowered not in OPTIMIZERS:
            raise ConfigError(file, key, f"{value!r}: hpcyolo has {', '.join(OPTIMIZERS)} (ultralytics' SGD, AdamW, "
                                         "MuSGD, auto), not this optimizer yet")
        return "optimizer", OPTIMIZERS[lowered]
    if key == "cache":
        if not isinstance(value, (bool, str)) or value not in CACHES:
            raise ConfigError(file, key, f"{value!r}: must be false, true (ram), ram or disk")
        return "cache", CACHES[value]
    if key == "classes" and value is not None:  # ultralytics takes one id or a list of them
        ids = tuple(value) if isinstance(value, list) else (value,)
        try:
            BY_NAME["classes"].check(ids)
        except ValueError as e:
            raise ConfigError(file, key, str(e)) from None
        return "classes", ids
    if key == "nms":  # ultralytics' nms=False is the NMS-free one-to-one head
        return ("end2end", True) if value is False else (None, None)
    setting = BY_NAME.get(key)
    if setting is None or key in NOT_FROM_A_RECIPE or setting.default is REQUIRED:
        raise ConfigError(file, key, "is not an ultralytics training setting that hpcyolo knows; remove it (a run "
                                     "never differs silently from its recipe)")
    if value is None:
        return None, None  # unset: the default
    want = setting.value_type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        kind = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}[want]
        raise ConfigError(file, key, f"{value!r} is not {kind}")
    if setting.choices and value not in setting.choices:
        raise ConfigError(file, key, f"{value!r}: choose one of {', '.join(map(str, setting.choices))}")
    if setting.check is not None:
        try:
            setting.check(value)
        except ValueError as e:
            raise ConfigError(file, key, str(e)) from None
    return key, float(value) if want is float else value


def _model(file: str, value: Any) -> tuple[str | None, Any]:
    """`yolo26n.yaml` (an architecture) is the model; a weights file must come as train.weights."""
    name = str(value or "")
    stem = Path(name).name
    if stem.endswith((".yaml", ".yml")) and stem.rsplit(".", 1)[0] in MODELS:
        return "model", stem.rsplit(".", 1)[0]
    if not name:
        return None, None
    if stem.endswith(".pt"):
        raise ConfigError(file, "model", f"{name}: a weights file; give it as train.weights (--weights), from where "
                                         "it is on this cluster")
    raise ConfigError(file, "model", f"{name}: not an architecture hpcyolo builds ({', '.join(MODELS)})")


def merge(path: str | Path, given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the recipe's settings that `given` (the job spec's or the command
    line's own) does not set, the lines that say what happened)."""
    taken, ignored = read_recipe(path)
    kept = {name: value for name, value in taken.items() if name in given and given[name] != value}
    used = {name: value for name, value in taken.items() if name not in given}
    lines = [f"recipe {path}: took {', '.join(f'{k}={v}' for k, v in used.items()) or 'nothing'}"]
    if kept:
        lines.append("recipe: the job's own value wins for " + ", ".join(
            f"{k} ({given[k]}; the recipe says {v})" for k, v in kept.items()))
    if ignored:
        lines.append(f"recipe: ignored, no meaning for training on a cluster: {', '.join(ignored)}")
    return used, lines
