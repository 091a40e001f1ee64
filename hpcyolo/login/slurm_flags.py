"""The one table from hpcyolo's generic resource names to Slurm options.

The plan speaks of `nodes`, `time`, `gpus_per_node`; only this table knows how
sbatch spells them (compare submitit's `_equivalence_dict`). The submitit path
maps the same generic names to its `slurm_*` parameters.
"""

from __future__ import annotations

import re

SBATCH_FLAGS: dict[str, str] = {
    "job_name": "--job-name",
    "nodes": "--nodes",
    "ntasks": "--ntasks",
    "ntasks_per_node": "--ntasks-per-node",
    "cpus_per_task": "--cpus-per-task",
    "gres": "--gres",
    "gpus_per_node": "--gpus-per-node",
    "gpus_per_task": "--gpus-per-task",
    "mem": "--mem",
    "time": "--time",
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "constraint": "--constraint",
    "reservation": "--reservation",
    # Requeue-friendly defaults: the job may be requeued, and its output file
    # keeps every run (man sbatch: --open-mode=append).
    "requeue": "--requeue",
    "open_mode": "--open-mode",
    # A failed node does not end the allocation (man sbatch, --no-kill): the
    # batch script restarts the training without it.
    "no_kill": "--no-kill",
    # Without "B:" Slurm signals every job step and not the batch shell, which
    # is what reaches the training processes (man sbatch, --signal).
    "signal": "--signal",
    "output": "--output",
}


def sbatch_option(name: str, value: object) -> str:
    """`--flag=value`, or the bare `--flag` for a switch that is on."""
    flag = SBATCH_FLAGS[name]
    return flag if value is True else f"{flag}={directive_word(str(value))}"


def directive_word(value: str) -> str:
    """`value` as sbatch reads it whole on an `#SBATCH` line. sbatch splits
    those lines itself (src/sbatch/opt.c, _get_argument): whitespace ends a
    word, an unquoted `#` starts a comment (`--output=/tmp/lo#gs` would be
    read as `/tmp/lo`), and inside "..." or '...' both are kept, a backslash
    escaping the next character. Plain values stay as they are."""
    if not re.search(r"[\s#'\"\\]", value):
        return value
    return '"' + re.sub(r'(["\\])', r"\\\1", value) + '"'

