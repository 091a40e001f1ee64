"""Frozen, keyword-only records: what `@dataclass(frozen=True, kw_only=True)`
makes, for the classes that every `hpcyolo render` defines as it starts (the
site config's and job spec's sections, the plan, TrainConfig).

Python 3.11's dataclass decorator writes six methods of each class as source
text and compiles them one by one (exec, about 0.1 ms each): for the two dozen
classes of `hpcyolo render`, 20 ms of its 110. A record is a dataclass
whose methods are not generated: `fields`, `asdict` and `replace` work on it
as on any dataclass, and one shared implementation of each method behaves as
the generated one does: a keyword-only __init__ that takes each field's
default or default factory, __repr__, __eq__ and __hash__ over the fields in
their order, FrozenInstanceError on assignment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, FrozenInstanceError
from typing import Any

_PLAIN = {"kw_only": True, "init": False, "repr": False, "eq": False}  # dataclass's part: the fields only


def record(cls: type) -> type:
    """The decorator: `@record` for `@dataclass(frozen=True, kw_only=True)`."""
    return _with_methods(dataclasses.dataclass(cls, **_PLAIN))


def make_record(name: str, fields: list, namespace: dict) -> type:
    """`make_dataclass(name, fields, namespace=namespace, frozen=True, kw_only=True)` as a record."""
    return _with_methods(dataclasses.make_dataclass(name, fields, namespace=namespace, **_PLAIN))


def _with_methods(cls: type) -> type:
    if any(not (f.repr and f.compare and f.hash is None and f.init) for f in dataclasses.fields(cls)):
        raise TypeError(f"{cls.__qualname__}: a record's fields are all in __init__, __repr__, __eq__ and __hash__")
    cls.__record_fields__ = tuple((f.name, f.default, f.default_factory) for f in dataclasses.fields(cls))
    methods = {"__init__": _init, "__repr__": _repr, "__eq__": _eq, "__hash__": _hash, "__setattr__": _setattr,
               "__delattr__": _delattr}
    for name, method in methods.items():
        if name not in cls.__dict__:
            setattr(cls, name, method)
    return cls


def _init(self, /, **values: Any) -> None:
    for name, default, factory in type(self).__record_fields__:
        if name in values:
            value = values.pop(name)
        elif default is not MISSING:
            value = default
        elif factory is not MISSING:
            value = factory()
        else:
            raise TypeError(f"{type(self).__qualname__}.__init__() missing 1 required keyword-only argument: "
                            f"{name!r}")
        object.__setattr__(self, name, value)
    if values:
        raise TypeError(f"{type(self).__qualname__}.__init__() got an unexpected keyword argument "
                        f"{next(iter(values))!r}")


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
