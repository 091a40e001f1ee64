"""The `hpcyolo` command line (click): the group and its shared pieces in
group.py, the commands by where they run (login.py, task.py, weights.py).

Every command imports what it needs inside its own body: `hpcyolo render`
and `hpcyolo validate` must run on a login node in a blink, without torch.
User mistakes (HpcyoloError) become one line on stderr and an exit code at
the edge only: here, and alike in hpcyolo.entry (the console script), which
runs a plain `hpcyolo stage` without loading click.
"""

from __future__ import annotations

from hpcyolo.cli import login, task, weights  # noqa: F401  (each registers its commands on main)
from hpcyolo.cli.group import main
from hpcyolo.cli.task import exec_, train, train_config

__all__ = ["exec_", "main", "train", "train_config"]
