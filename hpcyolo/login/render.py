"""Render a plan into an sbatch script: a pure function of the plan.

One Jinja environment, strict about undefined names, with the shell-quoting
filters of hpcyolo.login.shell for every interpolated value. The templates read the
plan (and hpcyolo's version) only: what the script does is what the plan says.
"""

from __future__ import annotations

import functools
from pathlib import Path

from hpcyolo import __version__
from hpcyolo.login.plan import JobPlan
from hpcyolo.login.shell import comment, join, quote, quote_path, wrap
from hpcyolo.login.slurm_flags import sbatch_option


def templates_dir() -> Path:
    """The templates: hpcyolo/templates/ in an installed wheel (pyproject maps
    templates/ there), else templates/ beside the package in a source checkout
    or an editable install."""
    package = Path(__file__).resolve().parents[1]  # hpcyolo/, this module being hpcyolo/login/render.py
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
    # `name | sbatch(value)`: a generic resource as its sbatch option (hpcyolo.login.slurm_flags).
    env.filters.update(q=quote, qpath=quote_path, args=join, wrap=wrap, comment=comment, sbatch=sbatch_option)
    return env


def render_sbatch(plan: JobPlan) -> str:
    return _environment().get_template("sbatch.sh.j2").render(plan=plan, version=__version__)


def render_setup(plan: JobPlan) -> str:
    """The script's software-environment section alone (for submitit's setup)."""
    return _environment().get_template("env.sh.j2").render(plan=plan)


def render_signal_test(plan: JobPlan, result: Path, output: str) -> str:
    """`hpcyolo doctor --signal-test`'s job: one task of `plan`'s shape
    waits for the site's signal, records it in `result`, and the job
    requeues itself once; its log goes to `output`."""
    # The step's words as plain strings: a site's $VAR in them stays literal
    # (quoted whole), as the test job has always run them.
    return _environment().get_template("signal-test.sh.j2").render(
        plan=plan, result=str(result), output=output,
        srun=[str(o) for o in plan.train_srun], prefix=[str(w) for w in plan.step_prefix])
