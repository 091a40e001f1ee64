"""hpcyolo_trainer.common.record: a record behaves as the frozen, keyword-only
dataclass it stands for (the same class written with @dataclass is the
reference)."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from hpcyolo_trainer.common.record import make_record, record


def _fields(cls):
    cls.__annotations__ = {"name": "str", "size": "int", "tags": "dict[str, str]", "note": "str | None"}
    cls.size = 1
    cls.tags = dataclasses.field(default_factory=dict, metadata={"doc": "tags"})
    cls.note = None
    return cls


@record
@_fields
class Rec:
    """A record."""


@dataclasses.dataclass(frozen=True, kw_only=True)
@_fields
class Ref:
    """The same, as a dataclass."""


Made = make_record("Made", [("name", str), ("size", int, dataclasses.field(default=1))],
                   namespace={"__module__": __name__, "twice": lambda self: 2 * self.size})


def test_a_record_is_a_dataclass_with_the_same_fields():
    assert dataclasses.is_dataclass(Rec)
    assert [(f.name, f.default, f.metadata) for f in dataclasses.fields(Rec)] == \
        [(f.name, f.default, f.metadata) for f in dataclasses.fields(Ref)]
    assert dataclasses.fields(Rec)[2].metadata["doc"] == "tags"


@pytest.mark.parametrize("kwargs", [{"name": "a"}, {"name": "b", "size": 3, "tags": {"x": "y"}, "note": "n"}])
def test_it_behaves_as_the_dataclass(kwargs):
    rec, ref = Rec(**kwargs), Ref(**kwargs)
    assert repr(rec) == repr(ref).replace("Ref(", "Rec(")
    assert dataclasses.asdict(rec) == dataclasses.asdict(ref)
    assert list(vars(rec).items()) == list(vars(ref).items())  # the same attributes, in the same order
    assert rec == Rec(**kwargs) and rec != Rec(**{**kwargs, "size": 7}) and rec != ref
    assert (rec == object()) is False
    assert dataclasses.replace(rec, size=9) == Rec(**{**kwargs, "size": 9})
    assert copy.deepcopy(rec) == rec and pickle.loads(pickle.dumps(rec)) == rec


def test_hash_as_the_dataclass():
    assert hash(Rec(name="a", tags=None)) == hash(Ref(name="a", tags=None))
    assert {Rec(name="a", tags=None), Rec(name="a", tags=None)} == {Rec(name="a", tags=None)}
    with pytest.raises(TypeError, match="unhashable type: 'dict'"):
        hash(Rec(name="a"))  # as the dataclass: a dict field


def test_frozen():
    rec = Rec(name="a")
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'size'"):
        rec.size = 2
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'name'"):
        del rec.name
    assert rec.size == 1


def test_defaults_and_factories():
    one, two = Rec(name="a"), Rec(name="b")
    assert one.tags == {} and one.tags is not two.tags and one.note is None


@pytest.mark.parametrize("call, message", [
    (lambda cls: cls(), "__init__() missing 1 required keyword-only argument: 'name'"),
    (lambda cls: cls(name="a", colour="red"), "__init__() got an unexpected keyword argument 'colour'"),
    (lambda cls: cls("a"), "takes 1 positional argument but 2 were given"),
])
def test_wrong_arguments_are_the_same_type_errors(call, message):
    for cls in (Rec, Ref):
        with pytest.raises(TypeError) as e:
            call(cls)
        assert message in str(e.value), (cls, str(e.value))


def test_make_record_keeps_the_namespace():
    made = Made(name="m")
    assert made.twice() == 2 and repr(made) == "Made(name='m', size=1)" and made.__module__ == __name__
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.size = 3


def test_a_field_left_out_of_a_method_is_refused():
    class Partial:
        __annotations__ = {"secret": "str"}
        secret = dataclasses.field(default="", repr=False)

    with pytest.raises(TypeError, match="a record's fields are all in"):
        record(Partial)


@record(kw_only=False)
@_fields
class Pos:
    """A record that takes its fields by position too."""


@dataclasses.dataclass(frozen=True)
@_fields
class PosRef:
    """The same, as a dataclass."""


@pytest.mark.parametrize("args, kwargs", [(("a",), {}), (("a", 2), {"note": "n"}), (("a", 2, {"k": "v"}, "n"), {})])
def test_a_positional_record_as_the_dataclass(args, kwargs):
    rec, ref = Pos(*args, **kwargs), PosRef(*args, **kwargs)
    assert repr(rec) == repr(ref).replace("PosRef(", "Pos(")
    assert rec == Pos(**dict(zip(("name", "size", "tags", "note"), args)), **kwargs)


@pytest.mark.parametrize("call, message", [
    (lambda cls: cls(), "__init__() missing 1 required positional argument: 'name'"),
    (lambda cls: cls("a", name="b"), "__init__() got multiple values for argument 'name'"),
    (lambda cls: cls("a", 1, {}, None, 5), "but 6 were given"),
])
def test_a_positional_record_refuses_as_the_dataclass(call, message):
    for cls in (Pos, PosRef):
        with pytest.raises(TypeError) as e:
            call(cls)
        assert message in str(e.value), (cls, str(e.value))
