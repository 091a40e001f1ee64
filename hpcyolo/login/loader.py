"""Reading YAML into frozen dataclasses, with errors that name file and key.

The schema is the dataclasses themselves (hpcyolo.login.config): each field's type
says what YAML value it takes, `spec(doc=..., check=...)` documents it and adds
a value check. This module walks a mapping that hpcyolo_trainer.common.yamlfile parsed
against them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import shlex
import types
import typing
from typing import Any, Callable, Literal, Union, get_args, get_origin

from hpcyolo_trainer.common.errors import ConfigError, shown
from hpcyolo_trainer.common.yamlfile import Float, as_written


def spec(default: Any = dataclasses.MISSING, *, doc: str, check: Callable[[Any], None] | None = None,
         split: bool = False) -> Any:
    """A schema field: `doc` is its one-line documentation, `check` raises
    ValueError(message) for a bad value, `split` lets a string stand for a
    list (shell words, as shlex.split reads them)."""
    meta = {"doc": doc, "check": check, "split": split}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _typename(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", Float: "a number", type(None): "empty"}.get(type(value), type(value).__name__)


def _got(value: Any) -> str:
    """What a wrong value is, for a message: a string is shown (bounded), with
    a hint where it looks like a number YAML 1.1 would have read."""
    if isinstance(value, Float):
        return f"the number {shown(value)}"
    if not isinstance(value, str):
        return _typename(value)
    hint = " (numbers are plain decimal: 16, 0.01, 1e-3)" if value[:1] in "+-.0123456789" and value else ""
    return f"the string {shown(value)}{hint}"


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _suggest(cls: type, key: Any) -> list[str]:
    """The keys the user probably meant by unknown `key` in section `cls`
    (one, or two look-alikes as close as each other: `lr` for `lr0` or
    `lrf`), as dotted keys relative to it. A key at the wrong level is the usual
    mistake (`partition:` at the top for `slurm.partition`): an exact name
    in a section below wins over a look-alike at this level (`preemption`),
    then a look-alike here, then one below (`gpus` for
    `resources.gpus_per_node`)."""
    import difflib  # only on this error path: it is slow to import

    key = str(key)
    below = [k for k in field_docs(cls) if "." in k]
    exact = [k for k in below if k.rsplit(".", 1)[1] == key]
    if exact:
        return exact[:1]
    names = [f.name for f in dataclasses.fields(cls)]
    here = difflib.get_close_matches(key, names, n=2, cutoff=0.6)
    if here:
        score = [difflib.SequenceMatcher(None, key, h).ratio() for h in here]
        return sorted(here[:2] if len(here) > 1 and score[0] == score[1] else here[:1], key=names.index)
    leaves = {k.rsplit(".", 1)[1]: k for k in reversed(below)}
    close = difflib.get_close_matches(key, list(leaves), n=1, cutoff=0.75)
    if close:
        return [leaves[close[0]]]
    started = [k for leaf, k in leaves.items() if leaf.startswith(f"{key}_")]
    return started if len(started) == 1 else []


def build(cls: type, raw: Any, file: str, prefix: str = "") -> Any:
    """Build dataclass `cls` from parsed YAML `raw`, checking every key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(file, prefix or "(top level)", f"must be a mapping, got {_typename(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            close = _suggest(cls, key)
            # A long section (train has ultralytics' settings) is listed where it is documented, not in the line.
            listed = f"; known keys: {', '.join(fields)}" if len(fields) <= 20 else \
                f"; {len(fields)} keys here, listed in docs/configuration.md's key tables" + \
                (" and, as options, by hpcyolo train --help" if prefix == "train" else "")
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else listed
            raise ConfigError(file, _join(prefix, key), f"unknown key{hint}")
    hints = _hints(cls)
    values = {}
    for name, f in fields.items():
        key = _join(prefix, name)
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(file, key, "required key is missing")
            continue
        value = raw[name]
        if f.metadata.get("split") and isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as e:
                raise ConfigError(file, key, f"cannot split into words: {e}") from None
        value = _convert(hints[name], value, file, key)
        check = f.metadata.get("check")
        if check is not None and value is not None:
            try:
                check(value)
            except ValueError as e:
                raise ConfigError(file, key, str(e)) from None
        values[name] = value
    return cls(**values)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """The schema's field types, resolved once per class (a sweep builds
    a job spec per element: get_type_hints was most of its time)."""
    return typing.get_type_hints(cls)


def _convert(tp: Any, value: Any, file: str, key: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, file, key)
    if value is None:
        raise ConfigError(file, key, "must not be empty")
    if dataclasses.is_dataclass(tp):
        return build(tp, value, file, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(file, key, f"must be one of {', '.join(map(str, args))} (got {shown(value)})")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(file, key, f"must be a list, got {_typename(value)}")
        return tuple(_convert(args[0], v, file, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(file, key, f"must be a mapping, got {_typename(value)}")
        return {_convert(args[0], k, file, key): _convert(args[1], v, file, _join(key, k)) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(file, key, f"must be true or false, got {_got(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(file, key, f"must be an integer, got {_got(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(file, key, f"must be a number, got {_got(value)}")
        if not math.isfinite(value):  # 1e999
            raise ConfigError(file, key, f"must be a finite number, got {shown(value)}")
        return float(value)
    if tp is str:
        # Numbers are fine where a string is expected (`memory: 512`), as
        # written (`3.10`, not 3.1); containers and booleans are not.
        value = as_written(value)
        if not isinstance(value, str):
            raise ConfigError(file, key, f"must be a string, got {_typename(value)}")
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(file, key, "must not contain control characters such as a newline")
        return value
    raise AssertionError(f"unsupported schema type {tp!r} at {key}")


def field_docs(cls: type, prefix: str = "") -> dict[str, str]:
    """Every dotted key of a schema with its doc line (for docs and tests)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        out[key] = f.metadata.get("doc", "")
        inner = hints[f.name]
        if dataclasses.is_dataclass(inner):
            out.update(field_docs(inner, key))
    return out
