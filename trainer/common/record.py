"""Frozen records: what `@dataclass(frozen=True, kw_only=True)` (or without
kw_only) makes, for the classes that every `hpcyolo render` defines as it
starts (the site config's and job spec's sections, the plan, the settings'
rows, TrainConfig).

Python 3.11's dataclass decorator writes six methods of each class as source
text and compiles them one by one (exec, about 0.1 ms each): for the two dozen
classes of `hpcyolo render`, 20 ms of its 110. A record is a dataclass
whose methods are not generated: `fields`, `asdict` and `replace` work on it
as on any dataclass, and one shared implementation of each method behaves as
the generated one does: an __init__ (keyword-only unless asked) that takes
each field's default or default factory, __repr__, __eq__ and __hash__ over
the fields in their order, FrozenInstanceError on assignment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, FrozenInstanceError
from typing import Any

_PLAIN = {"init": False, "repr": False, "eq": False}  # dataclass's part: the fields only


def record(cls: type | None = None, /, *, kw_only: bool = True):
    """The decorator: `@record` for `@dataclass(frozen=True, kw_only=True)`,
    `@record(kw_only=False)` for `@dataclass(frozen=True)`."""
    def make(cls: type) -> type:
        # A docstring where the class has none: dataclass would make one from the signature (inspect, 2 ms).
        cls.__doc__ = cls.__doc__ or f"{cls.__name__}({', '.join(cls.__dict__.get('__annotations__', {}))})"
        return _with_methods(dataclasses.dataclass(cls, kw_only=kw_only, **_PLAIN), kw_only)

    return make if cls is None else make(cls)


def make_record(name: str, fields: list, namespace: dict) -> type:
    """`make_dataclass(name, fields, namespace=namespace, frozen=True, kw_only=True)` as a record."""
    return _with_methods(dataclasses.make_dataclass(name, fields, namespace=namespace, kw_only=True, **_PLAIN), True)


def _with_methods(cls: type, kw_only: bool) -> type:
    if any(not (f.repr and f.compare and f.hash is None and f.init) for f in dataclasses.fields(cls)):
        raise TypeError(f"{cls.__qualname__}: a record's fields are all in __init__, __repr__, __eq__ and __hash__")
    cls.__record_fields__ = tuple((f.name, f.default, f.default_factory) for f in dataclasses.fields(cls))
    cls.__record_positional__ = 0 if kw_only else len(cls.__record_fields__)  # how many may be given by position
    methods = {"__init__": _init, "__repr__": _repr, "__eq__": _eq, "__hash__": _hash, "__setattr__": _setattr,
               "__delattr__": _delattr}
    for name, method in methods.items():
        if name not in cls.__dict__:
            setattr(cls, name, method)
    return cls


def _init(self, /, *args: Any, **values: Any) -> None:
    cls = type(self)
    if len(args) > cls.__record_positional__:
        most = cls.__record_positional__ + 1
        raise TypeError(f"{cls.__qualname__}.__init__() takes {most} positional argument{'s' * (most > 1)} but "
                        f"{len(args) + 1} were given")
    for (name, _, _), value in zip(cls.__record_fields__, args):
        if name in values:
            raise TypeError(f"{cls.__qualname__}.__init__() got multiple values for argument {name!r}")
        values[name] = value
    for name, default, factory in cls.__record_fields__:
        if name not in values:
            if default is not MISSING:
                values[name] = default
            elif factory is not MISSING:
                values[name] = factory()
            else:
                kind = "positional" if cls.__record_positional__ else "keyword-only"
                raise TypeError(f"{cls.__qualname__}.__init__() missing 1 required {kind} argument: {name!r}")
    if len(values) > len(cls.__record_fields__):
        unexpected = next(name for name in values if name not in cls.__dataclass_fields__)
        raise TypeError(f"{cls.__qualname__}.__init__() got an unexpected keyword argument {unexpected!r}")
    # The instance's attributes in one go (past the frozen __setattr__), in the fields' order as the
    # generated __init__ sets them: vars(), pickle and copy see the same dict.
    self.__dict__.update({name: values[name] for name, _, _ in cls.__record_fields__})


def _values(self) -> tuple:
    return tuple(getattr(self, name) for name, _, _ in type(self).__record_fields__)


def _repr(self) -> str:
    values = ", ".join(f"{name}={getattr(self, name)!r}" for name, _, _ in type(self).__record_fields__)
    return f"{type(self).__qualname__}({values})"


def _eq(self, other: object) -> bool:
    if other.__class__ is self.__class__:
        return _values(self) == _values(other)
    return NotImplemented


def _hash(self) -> int:
    return hash(_values(self))


def _setattr(self, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")
