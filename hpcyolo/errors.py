"""The few errors hpcyolo raises on purpose.

They are converted once, at the CLI edge, into one line on stderr and an exit
code; everything else is a bug and keeps its traceback.
"""


class HpcyoloError(Exception):
    """A failure the user can act on; `exit_code` is what the CLI returns."""

    exit_code = 1


class ConfigError(HpcyoloError):
    """A bad site config or job spec: names the file and the dotted key."""

    exit_code = 2

    def __init__(self, file: str, key: str, message: str):
        self.file, self.key, self.message = file, key, message
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {message}")


class SlurmError(HpcyoloError):
    """A Slurm command failed or is missing."""


def printable(text: str) -> str:
    """`text` with the bytes of a path that is not UTF-8 shown as \\xff, not
    as Python's surrogate escapes (\\udcff)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
