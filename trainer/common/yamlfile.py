"""Reading a YAML file the user gives (site config, job spec, data YAML).

One hardened reader for all of them, so that no YAML can crash, hang or eat
the machine, and no value changes on its way in:

- the file: a regular file of at most MAX_BYTES, opened without blocking (a
  FIFO or /dev/zero is refused, not read forever);
- the structure: composed here, in Python, from the parser's events (libyaml's
  parser keeps an explicit stack, but its composer recurses in C and
  overflows the stack on 50,000 nested `[`), refusing nesting deeper than
  MAX_DEPTH, an alias inside its own node, and documents that alias
  expansion makes larger than MAX_NODES ("billion laughs");
- keys: a key is its text (`on:`, `null:` and `3.10:` stay strings) or a plain
  decimal integer (data YAML `names: {0: person}`); a list or mapping as a key,
  or the same key twice, is an error naming the dotted key;
- scalars: no YAML 1.1 surprises. Integers are plain decimal only (`012345`,
  `0x10`, `1_000` and `1:30` stay strings, as written), floats are decimal
  only (`.inf` and `.nan` stay strings) and keep their text (`3.10` is a Float
  whose `.text` is "3.10"), dates stay strings. Booleans are YAML 1.1's
  (`yes`/`no`/`on`/`off` too), as they always were here.
- merge keys (`<<: *defaults`) work as in PyYAML: they are the usual way to
  share a block within one file, and the node limit bounds what they copy.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent, MappingEndEvent, SequenceEndEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from .errors import ConfigError

MAX_BYTES = 2 << 20  # our YAML files are a few KB; a data YAML with 1,000 class names is ~20 KB
MAX_DEPTH = 100  # levels of nesting; also keeps the Python composer far from the recursion limit
MAX_NODES = 100_000  # nodes after alias expansion: ~100x the largest real data YAML

INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# At most 18 digits: a longer number (an id, say) reads as a Float, its text kept.
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


class Float(float):
    """A float read from YAML that remembers how it was written, so that a
    string field given `3.10` gets "3.10", not "3.1"."""

    text: str

    def __new__(cls, text: str) -> Float:
        value = super().__new__(cls, text)
        value.text = text
        return value

    def __repr__(self) -> str:
        return self.text


class _Refused(yaml.YAMLError):
    """A document this reader does not take: `key` is the dotted key where."""

    def __init__(self, key: str, message: str, mark: Any = None):
        super().__init__(message)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        self.key, self.message = key, f"{message}{where}"


# -- composing: events to nodes, with limits and dotted keys ------------------

class _Composer(Composer):
    """PyYAML's composer (recursive in Python, bounded by MAX_DEPTH) that also
    tracks the depth, the expanded size and the dotted key of the node."""

    def __init__(self) -> None:
        super().__init__()
        self._path: list[str] = []  # segments of the dotted key: ".name" or "[index]"
        self._depth = 0
        self._nodes = 0  # nodes so far, an alias counting as all of its target's
        self._weights: dict[str, int] = {}  # anchor -> nodes of its expansion
        self._open: set[str] = set()  # anchors of the nodes being composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        is_alias = isinstance(event, AliasEvent)
        if is_alias and event.anchor in self._open:  # a list or mapping holding itself
            raise _Refused(self._key(), f"alias *{event.anchor[:40]} refers to a node that contains it",
                           event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise _Refused(self._key(), f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        start = self._nodes
        self._nodes += self._weights.get(event.anchor, 0) if is_alias else 1
        if self._nodes > MAX_NODES:
            raise _Refused(self._key(), f"more than {MAX_NODES} values once aliases are expanded", event.start_mark)
        anchor = None if is_alias else event.anchor
        self._depth += 1
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if anchor is not None:
            self._open.discard(anchor)
            self._weights[anchor] = self._nodes - start
        return node

    def compose_sequence_node(self, anchor: Any) -> SequenceNode:
        node = self._start(SequenceNode, anchor)
        while not self.check_event(SequenceEndEvent):
            self._path.append(f"[{len(node.value)}]")
            node.value.append(self.compose_node(node, len(node.value)))
            self._path.pop()
        node.end_mark = self.get_event().end_mark
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = self._start(MappingNode, anchor)
        lines: dict[Any, int] = {}
        while not self.check_event(MappingEndEvent):
            key_node = self.compose_node(node, None)
            key = _mapping_key(key_node, self._key())
            if key in lines:
                raise _Refused(self._key(key), f"duplicate key (on line {lines[key]} and again on line "
                                               f"{key_node.start_mark.line + 1})")
            lines[key] = key_node.start_mark.line + 1
            self._path.append(f".{key}")
            node.value.append((key_node, self.compose_node(node, key_node)))
            self._path.pop()
        node.end_mark = self.get_event().end_mark
        return node

    def _start(self, kind: type, anchor: Any) -> Any:
        """The collection node for the start event (as PyYAML's composer does)."""
        event = self.get_event()
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(kind, None, event.implicit)
        node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        return node

    def _key(self, last: Any = None) -> str:
        """The dotted key of the current node (with key `last` appended)."""
        text = "".join(self._path) + ("" if last is None else f".{last}")
        return text[1:] if text.startswith(".") else text


def _mapping_key(node: Any, where: str) -> str | int:
    """A key is its text, or a plain decimal integer; never a list or mapping."""
    if not isinstance(node, ScalarNode):
        kind = "list" if isinstance(node, SequenceNode) else "mapping"
        raise _Refused(where or "(top level)", f"a key must be a name, not a {kind}", node.start_mark)
    return int(node.value) if node.tag == INT_TAG and _INT.fullmatch(node.value) else node.value


# -- constructing: nodes to values --------------------------------------------

try:  # libyaml's parser is 20x faster; it keeps its own stack, no recursion
    from yaml.cyaml import CParser

    _PARSER: tuple[type, ...] = (CParser,)
except ImportError:  # a PyYAML built without libyaml
    _PARSER = (yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser)


class _Loader(_Composer, *_PARSER, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    def __init__(self, stream: str) -> None:
        _PARSER[0].__init__(self, stream)
        for cls in (*_PARSER[1:], _Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
            cls.__init__(self)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        self.flatten_mapping(node)  # merge keys; explicit keys come last and win
        return {_mapping_key(k, ""): self.construct_object(v, deep=deep) for k, v in node.value}


def _construct_int(loader: _Loader, node: ScalarNode) -> int:
    if not _INT.fullmatch(node.value):  # only an explicit !!int gets here with another form
        raise _Refused("", f"!!int {node.value[:40]!r} is not a plain decimal integer", node.start_mark)
    return int(node.value)


def _construct_float(loader: _Loader, node: ScalarNode) -> Float:
    if not _FLOAT.fullmatch(node.value):
        raise _Refused("", f"!!float {node.value[:40]!r} is not a plain decimal number", node.start_mark)
    return Float(node.value)


_Loader.add_constructor(INT_TAG, _construct_int)
_Loader.add_constructor(FLOAT_TAG, _construct_float)
# Implicit types: YAML 1.1's null, booleans and merge key; our integers and
# floats; no timestamps (`2024-01-01` stays a string) and no `=` (value).
_Loader.yaml_implicit_resolvers = {}
for _tag, _rx, _first in (
    ("tag:yaml.org,2002:bool", r"yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF",
     "yYnNtTfFoO"),
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:merge", r"<<", "<"),
    (INT_TAG, _INT.pattern, "-0123456789"),
    (FLOAT_TAG, _FLOAT.pattern, "-.0123456789"),
):
    _Loader.add_implicit_resolver(_tag, re.compile(f"^(?:{_rx})$"), list(_first))


# -- the entry points ---------------------------------------------------------

def as_written(value: Any) -> Any:
    """A number as the user wrote it (`3.10`, not 3.1), for where a string is
    expected; anything else unchanged."""
    if isinstance(value, Float):
        return value.text
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def read_yaml(path: str | Path) -> Any:
    """Parse one YAML file; any problem becomes a ConfigError naming it."""
    return loads(read_text(path), str(path))


def loads(text: str, name: str) -> Any:
    """Parse YAML text (from `name`, for messages) with this module's rules."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except _Refused as e:
        raise ConfigError(name, e.key, e.message) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if "maximum nesting depth" in problem:
            # libyaml >= 0.2.6 (PyYAML 6.0.4's) refuses 1,000 open flow levels
            # while its scanner looks ahead, before our composer sees depth
            # MAX_DEPTH: the same refusal, in the same words.
            message = f"nested more than {MAX_DEPTH} levels deep" + (f" ({where})" if where else "")
        else:
            message = f"not valid YAML: {where + ': ' if where else ''}{problem[:200]}"
        raise ConfigError(name, "", message) from None
    finally:
        loader.dispose()


def read_text(path: str | Path, limit: int = MAX_BYTES) -> str:
    """The text of a regular file of at most `limit` bytes. Never blocks (a
    FIFO is refused, not waited on) and never reads more than limit + 1 bytes
    (/dev/zero, or a file growing meanwhile)."""
    name = str(path)
    try:
        _check_kind(name, os.stat(path), limit)  # before opening: opening a device may do something
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(name, "", "file not found") from None
    except OSError as e:
        raise ConfigError(name, "", f"cannot read: {e.strerror}") from None
    try:
        _check_kind(name, os.fstat(fd), limit)  # the file that was opened (it may have been replaced)
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(name, "", f"cannot read: {e.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise ConfigError(name, "", f"larger than {limit >> 20} MiB: not a YAML file hpcyolo reads")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(name, "", f"cannot read: not UTF-8 text (byte {e.start})") from None


def _check_kind(name: str, st: os.stat_result, limit: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(name, "", "is a directory, not a YAML file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(name, "", "is not a regular file (a FIFO, device or socket): give a YAML file")
    if st.st_size > limit:
        raise ConfigError(name, "", f"larger than {limit >> 20} MiB: not a YAML file hpcyolo reads")


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes a Float as it was read."""


_Dumper.add_representer(Float, lambda dumper, value: dumper.represent_scalar(FLOAT_TAG, value.text))


def dump_yaml(data: Any) -> str:
    """YAML text for values this module read (a Float keeps its text)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
