"""The `hpcyolo` command group: error handling at the edge (one line, an
exit code), the version, and what several commands share (the SITE and JOB
arguments, loading a plan, the --imgsz check). The commands live in login.py
(the job on the cluster), task.py (inside the job) and weights.py (trained
weights); each imports what it needs inside its own body."""

from __future__ import annotations

import io
import sys

import click
from click.exceptions import NoArgsIsHelpError
from hpcyolo_trainer.common.errors import HpcyoloError, printable

from hpcyolo import __version__
from hpcyolo.login.edge import hint_swapped as _hint_swapped  # noqa: F401  (for the commands' modules)
from hpcyolo.login.edge import load_plan as _load_plan  # noqa: F401


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except HpcyoloError as e:
            click.echo(f"hpcyolo: error: {printable(str(e))}", err=True)
            ctx.exit(e.exit_code)
        except click.UsageError as e:
            if isinstance(e, NoArgsIsHelpError):  # `hpcyolo render` alone: its help, as click shows it
                raise
            # A usage mistake is one line too, like every other error.
            where = e.ctx.command_path if e.ctx else "hpcyolo"
            click.echo(f"hpcyolo: error: {printable(e.format_message())} (see: {where} --help)", err=True)
            ctx.exit(e.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcyolo")
def main() -> None:
    """Train YOLO-family object detectors on Slurm clusters.

    A site config (facts about one cluster, see site_configs/example.yaml, or
    example_cpu.yaml for a cluster without GPUs) and a job spec (one training
    run, see examples/shapes.yaml) become an sbatch script. From a checkout
    of hpcyolo, with a small generated dataset:

    \b
        hpcyolo make-dataset shapes data/shapes
        hpcyolo validate site_configs/testbed.yaml examples/shapes.yaml
        hpcyolo render site_configs/testbed.yaml examples/shapes.yaml | sbatch

    Inside the job, the script calls `hpcyolo stage` (once per node) and
    `hpcyolo train` (once per GPU).
    """
    # Paths are printed as the bytes they are, also where they are not UTF-8
    # (a file named b'\xff.yaml'), instead of failing on a strict stdout.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="surrogateescape")


def _check_imgsz(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """--imgsz through the one check the job spec uses too (hpcyolo_trainer.common.registry),
    as one line: a bad size would otherwise surface as a RuntimeError deep
    in the model, after torch and the data have loaded."""
    from hpcyolo_trainer.common.registry import check_imgsz
    from hpcyolo_trainer.common.settings import OptionError

    if value is not None:
        try:
            check_imgsz(value)
        except ValueError as e:
            raise OptionError(f"--imgsz: {e}") from None
    return value


# No click.Path checks: the loader says what is wrong with the file (a
# folder, unreadable, not YAML) in one line naming it, as for any bad file.
_site_arg = click.argument("site")


_job_arg = click.argument("job")


def this_process_vars(env: dict[str, str]) -> dict[str, str]:
    """The standard variables of this process. A host process of a launcher
    that starts one per host (SageMaker, a Kubernetes pod) on a host that
    needs several starts one per GPU instead, each running this same command
    line (they find their ranks set), and exits with their status."""
    from hpcyolo.node.distenv import NodeLayout, from_environ

    found = from_environ(env)
    if isinstance(found, NodeLayout):
        from hpcyolo.node.local import launch_layout

        sys.exit(launch_layout([sys.executable, "-m", "hpcyolo.cli", *sys.argv[1:]], found, env=env))
    return found.standard_vars()
