"""The one table from hpcyolo's generic resource names to Slurm options.

The plan speaks of `nodes`, `time`, `gpus_per_node`; only this table knows how
sbatch spells them (compare submitit's `_equivalence_dict`). The submitit path
maps the same generic names to its `slurm_*` parameters.
"""

from __future__ import annotations

SBATCH_FLAGS: dict[str, str] = {
    "job_name": "--job-name",
    "nodes": "--nodes",
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
    # Without "B:" Slurm signals every job step and not the batch shell, which
    # is what reaches the training processes (man sbatch, --signal).
    "signal": "--signal",
    "output": "--output",
}


def sbatch_option(name: str, value: object) -> str:
    """`--flag=value`, or the bare `--flag` for a switch that is on."""
    flag = SBATCH_FLAGS[name]
    return flag if value is True else f"{flag}={value}"
