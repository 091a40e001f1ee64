"""The `hpcyolo` command line.

Every command imports what it needs inside its own body: `hpcyolo render`
and `hpcyolo validate` must run on a login node in a blink, without torch.
User mistakes (HpcyoloError) become one line on stderr and an exit code here,
and only here.
"""

from __future__ import annotations

import os
import shlex
import sys

import click

from . import __version__
from .errors import HpcyoloError


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except HpcyoloError as e:
            click.echo(f"hpcyolo: error: {e}", err=True)
            ctx.exit(e.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcyolo")
def main() -> None:
    """Train YOLO-family object detectors on Slurm clusters.

    A site config (facts about one cluster, see site_configs/example.yaml) and
    a job spec (one training run, see examples/coco8.yaml) become an sbatch
    script:

        hpcyolo validate site_configs/testbed.yaml examples/coco8.yaml

        hpcyolo render site_configs/testbed.yaml examples/coco8.yaml | sbatch

    Inside the job, the script calls `hpcyolo stage` (once per node) and
    `hpcyolo train` (once per GPU).
    """


_site_arg = click.argument("site", type=click.Path(dir_okay=False))
_job_arg = click.argument("job", type=click.Path(dir_okay=False))


def _load_plan(site_path: str, job_path: str):
    from .config import load_job, load_site
    from .plan import make_plan

    site, job = load_site(site_path), load_job(job_path)
    command = shlex.join(["hpcyolo", *sys.argv[1:]])
    return make_plan(site, job, site_file=site_path, job_file=job_path, command=command)


@main.command()
@_site_arg
@_job_arg
def validate(site: str, job: str) -> None:
    """Check SITE and JOB, alone and together, and print what the job asks for.

    Exits 2 with one line naming the file and key of the first problem.
    """
    plan = _load_plan(site, job)
    click.echo(f"ok: {plan.nodes} node(s) x {plan.procs_per_node} process(es) = world size {plan.world_size}, "
               f"{plan.batch_per_rank} images per rank, launcher {plan.launcher}, time {plan.time}, "
               f"run {plan.run_dir}")


@main.command()
@_site_arg
@_job_arg
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the script to this file (atomically) "
              "instead of stdout.")
def render(site: str, job: str, output: str | None) -> None:
    """Print the sbatch script for JOB on SITE.

    The script is complete and readable: pipe it to sbatch, or save it with -o
    and read it first. Messages go to stderr, the script alone to stdout.

        hpcyolo render site_configs/testbed.yaml examples/coco8.yaml | sbatch
    """
    from .render import render_sbatch

    script = render_sbatch(_load_plan(site, job))
    if output is None:
        sys.stdout.write(script)
        return
    from .fsutil import write_atomic

    write_atomic(output, script.encode(), mode=0o755)
    click.echo(f"wrote {output}", err=True)


@main.command()
@click.option("--data", type=click.Path(dir_okay=False), help="The data YAML of the dataset to copy.")
@click.option("--dest", type=click.Path(file_okay=False), help="Node-local directory to copy it into.")
@click.option("--remove", "remove", type=click.Path(file_okay=False), help="Remove a staged copy instead.")
def stage(data: str | None, dest: str | None, remove: str | None) -> None:
    """Copy a dataset into node-local scratch, once per node.

    Run as one task per node (the sbatch script does this). Writes DEST/data.yaml
    pointing at the copy, and a completion marker so that a requeued job on the
    same node skips the copy.
    """
    from . import stage as staging

    if remove:
        staging.remove(remove)
        return
    if not (data and dest):
        raise click.UsageError("give --data and --dest (or --remove DIR)")
    staging.stage(data, dest)


_run_options = [
    click.option("--run-dir", required=True, type=click.Path(file_okay=False), help="Run directory (shared)."),
    click.option("--data", required=True, type=click.Path(dir_okay=False), help="Data YAML."),
    click.option("--signal", "signal_name", default="USR2", show_default=True,
                 help="Signal that asks for a checkpoint and a requeue."),
    click.option("--dist-timeout", default=600, show_default=True, help="Seconds a collective may wait."),
]


def _with_run_options(fn):
    for option in reversed(_run_options):
        fn = option(fn)
    return fn


@main.command()
@_with_run_options
@click.option("--model", type=click.Choice(["n", "s", "m"]), default="n", show_default=True)
@click.option("--epochs", default=100, show_default=True)
@click.option("--batch", default=64, show_default=True, help="Global batch size.")
@click.option("--imgsz", default=640, show_default=True)
@click.option("--workers", default=4, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--optimizer", type=click.Choice(["sgd", "adamw"]), default="sgd", show_default=True)
@click.option("--lr0", type=float, default=None)
@click.option("--cache", type=click.Choice(["none", "ram", "disk"]), default="none", show_default=True)
@click.option("--save-every", default=0, show_default=True, help="Checkpoint every N steps (0: each epoch).")
@click.option("--keep", default=3, show_default=True, help="Checkpoints to keep.")
def train(**options) -> None:
    """Train the built-in detector: run once per GPU (the sbatch script does this).

    Reads the rank layout from Slurm or torchrun, resumes from the newest valid
    checkpoint in --run-dir, and on --signal checkpoints and exits 75 so the
    batch script requeues the job.
    """
    from .distenv import from_environ

    from_environ(os.environ)
    raise HpcyoloError("the built-in trainer is not in this version yet; give the job spec an entrypoint")


@main.command(name="exec", context_settings={"ignore_unknown_options": True})
@_with_run_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(run_dir: str, data: str, signal_name: str, dist_timeout: int, command: tuple[str, ...]) -> None:
    """Run COMMAND (any torch.distributed script) with the standard variables.

    Sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT from the launcher's environment, plus HPCYOLO_RUN_DIR and
    HPCYOLO_DATA, then replaces itself with COMMAND:

        hpcyolo exec --run-dir RUN --data DATA -- python train.py --epochs 3
    """
    from .distenv import from_environ

    env = dict(os.environ)
    env.update(from_environ(env).standard_vars())
    env.update(HPCYOLO_RUN_DIR=run_dir, HPCYOLO_DATA=data, HPCYOLO_SIGNAL=signal_name,
               HPCYOLO_DIST_TIMEOUT=str(dist_timeout))
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError:
        raise HpcyoloError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise HpcyoloError(f"not executable: {command[0]}") from None


if __name__ == "__main__":
    main()
