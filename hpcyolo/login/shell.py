"""Quoting for everything the sbatch template interpolates.

Every value that reaches the script passes one of these filters. `Var` and
`Raw` mark the only text that is not quoted: references to shell variables the
script itself sets, and fragments written by hpcyolo (never user input).
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable

from hpcyolo.login.config import PATH_VAR


class Var(str):
    """A shell variable the script sets, plus an optional literal suffix:
    Var("SCRATCH_DIR", "/data") renders as "$SCRATCH_DIR/data"."""

    def __new__(cls, name: str, suffix: str = ""):
        self = super().__new__(cls, f"${name}{suffix}")
        self.name, self.suffix = name, suffix
        return self

    def resolve(self, values: dict[str, str]) -> str:
        """The value outside a shell (hpcyolo run), from `values`."""
        return values[self.name] + self.suffix


class Raw(str):
    """A fragment written by hpcyolo itself, rendered as is."""


class Expand(str):
    """A site value whose $NAME/${NAME} references expand at run time."""


def quote(value: object) -> str:
    """One shell word that stands for exactly `value`."""
    if isinstance(value, Var):
        if re.fullmatch(r"[/.,:=@%+-][A-Za-z0-9_./,:=@%+-]*|", value.suffix):  # nothing to escape
            return f'"${value.name}{value.suffix}"'
        return f'"${value.name}"' + shlex.quote(value.suffix)
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Expand):
        return quote_path(value)
    return shlex.quote(str(value))


def quote_path(value: str) -> str:
    """Quote a path or value, keeping `$NAME`/`${NAME}` as expansions and every other
    character literal: `$SCRATCH/runs` -> "${SCRATCH}/runs"."""
    pieces = PATH_VAR.split(value)
    # re.split with two groups yields: literal, braced-name, bare-name, literal, ...
    literals, names = pieces[0::3], [a or b for a, b in zip(pieces[1::3], pieces[2::3])]
    if not names:
        return shlex.quote(value)
    if not any(re.search(r'["$`\\!]', lit) for lit in literals):
        body = literals[0] + "".join(f"${{{n}}}{lit}" for n, lit in zip(names, literals[1:]))
        return f'"{body}"'
    words = [shlex.quote(literals[0]) if literals[0] else ""]
    for name, lit in zip(names, literals[1:]):
        words.append(f'"${{{name}}}"' + (shlex.quote(lit) if lit else ""))
    return "".join(words)


def join(args: Iterable[object]) -> str:
    return " ".join(quote(a) for a in args)


def wrap(args: Iterable[object], indent: int = 4, width: int = 100) -> str:
    """Quoted words across continuation lines, breaking only before an
    option (`--x`), so `--epochs 3` stays on one line."""
    lines, line = [], ""
    for word in map(quote, args):
        if line and word.startswith("-") and len(line) + 1 + len(word) > width - indent:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return (" \\\n" + " " * indent).join(lines)


def comment(value: object) -> str:
    """Text safe on a `#` comment line: control characters shown escaped, so
    a newline cannot end the comment and start a command."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
