"""The few errors hpcyolo raises on purpose.

They are converted once, at the CLI edge, into one line on stderr and an exit
code; everything else is a bug and keeps its traceback.
"""

import reprlib

SHOWN = 80  # most characters of a user's value a message echoes

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = _repr.maxlong = SHOWN
_repr.maxlevel, _repr.maxlist, _repr.maxtuple, _repr.maxdict, _repr.maxset = 2, 4, 4, 4, 4


def shown(value: object) -> str:
    """repr(value) in at most SHOWN characters, at bounded cost: a value from a
    user's file can be megabytes long, or a list that aliases make huge."""
    text = _repr.repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN - 3]}..."


class HpcyoloError(Exception):
    """A failure the user can act on; `exit_code` is what the CLI returns."""

    exit_code = 1


class ConfigError(HpcyoloError):
    """A bad site config or job spec: names the file and the dotted key."""

    exit_code = 2

    def __init__(self, file: str, key: str, message: str):
        if len(key) > SHOWN:  # a dotted key holds a file's keys: any length
            key = f"{key[:SHOWN - 3]}..."
        self.file, self.key, self.message = file, key, message
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {message}")


class SlurmError(HpcyoloError):
    """A Slurm command failed or is missing."""


def printable(text: str) -> str:
    """`text` with the bytes of a path that is not UTF-8 shown as \\xff, not
    as Python's surrogate escapes (\\udcff)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
