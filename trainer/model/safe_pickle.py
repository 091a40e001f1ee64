"""Read a torch zip checkpoint that pickles whole objects, without running it.

An ultralytics checkpoint (`yolov8n.pt`, a trainer's `best.pt`) pickles a
`DetectionModel` object graph: `torch.load(weights_only=False)` would import
ultralytics and let the pickle call anything it names (os.system, eval, ...).
torch's `weights_only=True` refuses these files outright, as their globals are
not tensors. This unpickler reads them the way torch's weights-only loader
reads tensors (torch/_weights_only_unpickler.py, torch/serialization.py
`_load`): `find_class` returns only the tensor-rebuilding functions and plain
containers; every class from ultralytics or torch.nn becomes an inert stand-in
(`Inert`) that records the state the pickle gives it and can never be called;
any other global ends the load before anything runs. Storages come from the
zip's `<prefix>/data/<key>` records through `persistent_load`.
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import pickle
import re
import sys
import zipfile
from pathlib import Path

import torch

from ..common.errors import HpcyoloError


class _Refused(Exception):
    """Raised inside the unpickler; becomes RefusedPickle with the file name."""


# Callables the pickle may REDUCE: they build tensors, parameters and plain
# containers from plain values, as in torch's weights-only allowlist.
def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    # As torch's weights-only loader: a hook would be code attached to the tensor.
    if backward_hooks or not isinstance(storage, torch.storage.TypedStorage):
        raise _Refused("torch._utils._rebuild_tensor_v2 with hooks or without a storage")
    return torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, {}, metadata)


def _rebuild_parameter(data, requires_grad, backward_hooks):
    if backward_hooks or not isinstance(data, torch.Tensor):
        raise _Refused("torch._utils._rebuild_parameter with hooks or without a tensor")
    return torch.nn.Parameter(data, requires_grad)


_REBUILD = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("torch", "Size"): torch.Size,
}
# Modules whose classes become inert stand-ins: the model's own classes,
# torch's layers, and the torchvision transforms an ultralytics classifier
# records as its `transforms` (Compose, Resize, CenterCrop, ToTensor,
# Normalize). Their code never runs here; only their recorded state is read.
_INERT_PREFIXES = ("ultralytics.", "torch.nn.modules.", "torchvision.transforms.transforms")


def _enum_value(value):
    """An enum member a pickle rebuilds as Enum(value) (torchvision's
    InterpolationMode('bilinear')), read as its plain value: a str or int, nothing callable."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise _Refused("an enum rebuilt from something other than a str or int")
    return value


_ENUMS = {("torchvision.transforms.functional", "InterpolationMode")}
# torch's legacy storage classes, by the name a pickle gives them.
_STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "HalfStorage": torch.float16, "BFloat16Storage": torch.bfloat16,
    "DoubleStorage": torch.float64, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
    "UntypedStorage": torch.uint8,
}
_KEY = re.compile(r"\w{1,64}")


class RefusedPickle(HpcyoloError):
    """The file's pickle names something this loader will not run."""


class _NoCall(type):
    """Metaclass of the stand-ins: a pickle's REDUCE (or INST/OBJ) that calls one
    is refused; NEWOBJ (cls.__new__) and BUILD, which only create and fill an
    empty object, are how a pickled module arrives and stay allowed."""

    def __call__(cls, *args, **kwargs):
        raise _Refused(f"{cls.__module__}.{cls.__qualname__}")


class Inert(metaclass=_NoCall):
    """A stand-in for a pickled object of a class not loaded here: its state, as given."""

    def __setstate__(self, state) -> None:
        object.__setattr__(self, "_state", state)

    @property
    def state(self):
        return self.__dict__.get("_state")

    @property
    def kind(self) -> str:
        return type(self).__qualname__


_standins: dict[tuple[str, str], type] = {}


def _standin(module: str, name: str) -> type:
    """One stand-in class per pickled (module, name), so that `kind` reads as the class."""
    key = (module, name)
    if key not in _standins:
        cls = _NoCall(name, (Inert,), {"__module__": module, "__qualname__": name})
        _standins[key] = cls
    return _standins[key]


class _StorageType:
    """What a pickled `torch.FloatStorage` (etc.) global stands for: a dtype."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, records: "_Records"):
        super().__init__(io.BytesIO(data))
        self.records = records
        self.storages: dict[str, torch.storage.TypedStorage] = {}

    def find_class(self, module: str, name: str):
        # Protocol-2 pickles name Python 2 modules (__builtin__, commands for
        # subprocess, ...): read them as pickle itself does, so that the
        # checks and messages below see the Python 3 names.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in _REBUILD:
            return _REBUILD[(module, name)]
        if module == "torch":
            dtype = getattr(torch, name, None) if not name.startswith("_") else None
            if isinstance(dtype, torch.dtype):
                return dtype
            if name in _STORAGE_DTYPES:
                return _StorageType(_STORAGE_DTYPES[name])
        if module.startswith(_INERT_PREFIXES) and name.isidentifier():
            return _standin(module, name)
        if (module, name) in _ENUMS:
            return _enum_value
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid):
        # ('storage', storage type, key, location, numel): torch.save's record
        # of one storage, whose bytes are the zip's data/<key>.
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise _Refused(f"persistent id {str(pid)[:60]}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not _KEY.fullmatch(key) \
                or not isinstance(numel, int) or numel < 0:
            raise _Refused(f"persistent id {str(pid)[:60]}")
        if key not in self.storages:
            nbytes = numel * torch._utils._element_size(storage_type.dtype)
            raw = self.records.read(f"data/{key}")
            if len(raw) < nbytes:
                raise ValueError(f"record data/{key} holds {len(raw)} bytes, not {nbytes}")
            buffer = torch.frombuffer(bytearray(raw[:nbytes]), dtype=torch.uint8) if nbytes else \
                torch.empty(0, dtype=torch.uint8)
            untyped = buffer.untyped_storage()
            if sys.byteorder != self.records.byteorder and storage_type.dtype.itemsize > 1:
                untyped.byteswap(storage_type.dtype)
            self.storages[key] = torch.storage.TypedStorage(wrap_storage=untyped, dtype=storage_type.dtype,
                                                            _internal=True)
        return self.storages[key]


class _Records:
    """The records of a torch zip file, under its one top-level folder."""

    def __init__(self, zf: zipfile.ZipFile):
        pkls = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise ValueError("not a torch zip file (no single <name>/data.pkl)")
        self.zf, self.prefix = zf, pkls[0][: -len("data.pkl")]
        order = self.read("byteorder", missing=b"little").decode()
        self.byteorder = order if order in ("little", "big") else "little"

    def read(self, name: str, missing: bytes | None = None) -> bytes:
        try:
            return self.zf.read(self.prefix + name)
        except KeyError:
            if missing is not None:
                return missing
            raise ValueError(f"record {name} missing") from None


def load(path: str | Path):
    """The object a torch zip file pickles, every foreign class as an `Inert`
    stand-in. Raises RefusedPickle naming the file and the global it refused;
    ValueError and the like for a file that is not a torch zip."""
    with zipfile.ZipFile(path) as zf:
        records = _Records(zf)
        unpickler = _Unpickler(records.read("data.pkl"), records)
        try:
            return unpickler.load()
        except _Refused as e:
            raise RefusedPickle(f"{path}: refused to load: its pickle calls {e}, which a checkpoint has no "
                                "business running") from None
