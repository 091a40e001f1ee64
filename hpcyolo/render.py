"""Render a plan into an sbatch script: a pure function of the plan.

One Jinja environment, strict about undefined names, with the shell-quoting
filters of hpcyolo.shell for every interpolated value.
"""

from __future__ import annotations

import functools
from pathlib import Path

from . import __version__
from .plan import JobPlan
from .rundir import RECORD
from .shell import Var, comment, join, quote, quote_path, wrap
from .slurm_flags import sbatch_option


def templates_dir() -> Path:
    """The templates: hpcyolo/templates/ in an installed wheel (pyproject maps
    templates/ there), else templates/ beside the package in a source checkout
    or an editable install."""
    package = Path(__file__).resolve().parent
    installed = package / "templates"
    return installed if (installed / "sbatch.sh.j2").is_file() else package.parent / "templates"


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2  # imported here: `hpcyolo --help` should not pay for it

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        # Compiling the template costs more than rendering it; the cache
        # (a per-user folder under the temp dir, keyed by the template's
        # checksum) keeps `hpcyolo render` quick on a login node.
        bytecode_cache=jinja2.FileSystemBytecodeCache(),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(q=quote, qpath=quote_path, args=join, wrap=wrap, comment=comment)
    return env


def render_sbatch(plan: JobPlan) -> str:
    template = _environment().get_template("sbatch.sh.j2")
    return template.render(
        plan=plan,
        site=plan.site,
        job=plan.job,
        version=__version__,
        record=Var("RUN_DIR", f"/{RECORD}"),  # the run's journal (hpcyolo.rundir)
        sbatch_lines=[sbatch_option(name, value) for name, value in plan.sbatch] + list(plan.site.slurm.extra_sbatch),
    )


def render_setup(plan: JobPlan) -> str:
    """The script's software-environment section alone (for submitit's setup)."""
    return _environment().get_template("env.sh.j2").render(plan=plan, site=plan.site)
