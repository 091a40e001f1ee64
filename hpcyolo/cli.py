"""The `hpcyolo` command line.

Every command imports what it needs inside its own body: `hpcyolo render`
and `hpcyolo validate` must run on a login node in a blink, without torch.
User mistakes (HpcyoloError) become one line on stderr and an exit code at
the edge only: here, and alike in hpcyolo.entry (the console script), which
runs a plain `hpcyolo stage` without loading click.
"""

from __future__ import annotations

import functools
import io
import os
import shlex
import sys

import click
from click.exceptions import NoArgsIsHelpError

from hpcyolo_trainer.errors import ConfigError, HpcyoloError, printable

from . import __version__


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
    """--imgsz through the one check the job spec uses too (hpcyolo_trainer.registry),
    as one line: a bad size would otherwise surface as a RuntimeError deep
    in the model, after torch and the data have loaded."""
    from hpcyolo_trainer.registry import check_imgsz
    from hpcyolo_trainer.settings import OptionError

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


def _hint_swapped(command):
    """SITE and JOB given the wrong way round fail on the first unknown key;
    say what happened instead (hpcyolo render job.yaml site.yaml)."""
    @functools.wraps(command)
    def wrapper(site: str | None, job: str | None, **options):
        try:
            return command(site, job, **options)
        except ConfigError as e:
            from .config import wrong_order

            instead = wrong_order(site, job) if site and e.file in (site, job) else None
            if instead is None:
                raise
            raise instead from None

    return wrapper


def _load_plan(site_path: str, job_path: str, *, for_sbatch: bool = False):
    """The plan of SITE and JOB; `for_sbatch`: also check what the rendered
    script needs on this machine before it is submitted (storage.logs)."""
    from .config import load_job, load_site
    from .plan import check_logs_folder, make_plan

    site, job = load_site(site_path), load_job(job_path)
    command = shlex.join(["hpcyolo", *sys.argv[1:]])
    plan = make_plan(site, job, site_file=site_path, job_file=job_path, command=command)
    if for_sbatch:
        check_logs_folder(plan)
    return plan


@main.command(short_help="Check SITE and JOB; print what they ask for.")
@_site_arg
@_job_arg
@_hint_swapped
def validate(site: str, job: str) -> None:
    """Check SITE and JOB, alone and together, and print what the job asks for.

    Also checks, on this machine, what the rendered script needs before it
    is submitted: the storage.logs folder, and the dataset as the trainer
    will (the data YAML, its splits, that the images have label files).
    Exits 2 with one line naming the file and key of the first problem.

    \b
    Example:
        hpcyolo validate site_configs/testbed.yaml examples/shapes.yaml
    """
    from hpcyolo_trainer.dataset import check_data

    from .runcheck import warn_job

    plan = _load_plan(site, job, for_sbatch=True)
    for warning in check_data(plan.data):
        click.echo(f"warning: {warning}", err=True)
    warn_job(plan, plan.run_dir)
    click.echo(f"ok: {plan.layout} = world size {plan.world_size}, "
               f"{plan.batch_per_rank} images per rank, launcher {plan.launcher}, time {plan.time}, "
               f"run {plan.run_dir}")


@main.command(short_help="Print the sbatch script for JOB on SITE.")
@_site_arg
@_job_arg
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the script to this file (atomically) "
              "instead of stdout.")
@_hint_swapped
def render(site: str, job: str, output: str | None) -> None:
    """Print the sbatch script for JOB on SITE.

    The script is complete and readable: pipe it to sbatch, or save it with -o
    and read it first. Messages go to stderr, the script alone to stdout.

    \b
    Example:
        hpcyolo render site_configs/testbed.yaml examples/shapes.yaml | sbatch
    """
    from .render import render_sbatch
    from .runcheck import warn_job

    plan = _load_plan(site, job, for_sbatch=True)
    script = render_sbatch(plan)
    warn_job(plan, plan.run_dir)
    if output is None:
        sys.stdout.write(script)
        return
    from hpcyolo_trainer.fsutil import write_atomic

    try:
        write_atomic(output, script.encode("utf-8", "surrogateescape"), mode=0o777)
    except OSError as e:
        raise HpcyoloError(f"cannot write {output}: {e.strerror}") from None
    click.echo(printable(f"wrote {output}"), err=True)


@main.command(name="run", short_help="Run JOB on this machine, without Slurm.")
@_site_arg
@_job_arg
@click.option("--resume", is_flag=True, help="Continue the run of this name (after a stop or a crash).")
@_hint_swapped
def run_(site: str, job: str, resume: bool) -> None:
    """Run JOB on this machine, without Slurm: one process per rank.

    The same steps as the sbatch script: the run directory (never clobbered),
    staging into scratch, the ranks with the standard variables, and a
    checkpoint then exit 75 on Ctrl-C/SIGTERM/the site's signal.

    \b
    Example:
        hpcyolo run site_configs/local.yaml examples/shapes.yaml
    """
    from .run import run_local

    sys.exit(run_local(_load_plan(site, job), resume=resume))


@main.command(short_help="Copy a dataset into node-local scratch.")
@click.option("--data", type=click.Path(dir_okay=False), help="The dataset: its data YAML (the dataset root, "
              "`path:`, is copied), or a tar archive (.tar, .tar.gz/.tgz, .tar.zst, .tar.xz, .tar.bz2) holding it "
              "with exactly one data YAML at its top level.")
@click.option("--dest", type=click.Path(file_okay=False), help="Node-local folder to copy it into (created; its "
              "parent holds the lock file).")
@click.option("--remove", "remove", type=click.Path(file_okay=False), help="Remove this folder (a staged copy or "
              "the whole scratch folder) and its lock file instead; a missing one is fine.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes that stat and copy the "
              "files in parallel; from Lustre or NFS, where each file waits on the servers, more than the CPUs "
              "pay off.  [default: one per CPU, 2 to 16; one below 1024 files]")
def stage(data: str | None, dest: str | None, remove: str | None, workers: int | None) -> None:
    """Copy a dataset into node-local scratch, once per node.

    Run as one task per node (the sbatch script does this); other tasks on
    the node that stage the same DEST wait for it. Checks the free space
    first, copies, verifies the copy (the same paths, file sizes and symlinks
    as the source), then writes DEST/data.yaml (the source's YAML with `path:`
    set to the copy) and a completion marker: a later stage of an unchanged
    source on this node (a requeued job) returns at once, a changed one
    (the data YAML, the root or a split folder modified) copies again.

    \b
    Example:
        hpcyolo stage --data /lustre/coco/coco.yaml --dest /dev/shm/$USER/coco

    Train with DEST/data.yaml. One line on stderr when the copy starts and
    one when it ends (files, bytes, seconds, MB/s, node).
    """
    from . import stage as staging

    if remove:
        staging.remove(remove)
        return
    if not (data and dest):
        raise click.UsageError("give --data and --dest (or --remove DIR)")
    staging.stage(data, dest, workers=workers)


@main.command(name="make-dataset", short_help="Write a small synthetic detection dataset.")
@click.argument("kind", type=click.Choice(["shapes"]))
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--train", "n_train", default=800, show_default=True, type=click.IntRange(min=1),
              help="Training images.")
@click.option("--val", "n_val", default=200, show_default=True, type=click.IntRange(min=1), help="Validation images.")
@click.option("--imgsz", default=160, show_default=True, type=click.IntRange(32, 4096), help="Image side in pixels.")
@click.option("--classes", default=4, show_default=True, type=click.IntRange(1, 6),
              help="Shape classes: circle, square, triangle, cross, star, ring (the first N).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Random seed: the same seed writes the same files.")
@click.option("--max-objects", default=4, show_default=True, type=click.IntRange(1, 50), help="Objects per image, "
              "at most (5% of images have none).")
def make_dataset(kind: str, directory: str, n_train: int, n_val: int, imgsz: int, classes: int, seed: int,
                 max_objects: int) -> None:
    """Write a synthetic detection dataset into DIR, in ultralytics layout.

    KIND `shapes`: coloured shapes on noisy backgrounds, the class given by the
    silhouette alone. Small and learnable: a YOLO n trained from scratch on a
    CPU for a few minutes gets a meaningful mAP, which makes it an end-to-end
    test of a training setup. The same seed writes the same files.

    \b
    Example:
        hpcyolo make-dataset shapes /scratch/$USER/shapes

    DIR must not exist or be empty; it appears complete or not at all.
    Prints the path of its data.yaml on stdout.
    """
    import time
    from pathlib import Path

    from .shapes import make_shapes

    start = time.monotonic()
    data_yaml = make_shapes(Path(directory), n_train=n_train, n_val=n_val, imgsz=imgsz, classes=classes, seed=seed,
                            max_objects=max_objects)
    click.echo(f"wrote {n_train} train + {n_val} val images ({imgsz} px, {classes} classes) "
               f"in {time.monotonic() - start:.1f} s", err=True)
    click.echo(str(data_yaml))


def _setting_option(name: str):
    """The option of `hpcyolo train` for the trainer's setting `name`: its
    name, default, help and check all from the settings' table
    (hpcyolo_trainer.settings)."""
    from hpcyolo_trainer.settings import BY_NAME, REQUIRED

    s = BY_NAME[name]
    kind = {"file": click.Path(exists=True, dir_okay=False), "file-name": click.Path(dir_okay=False),
            "folder": click.Path(file_okay=False)}.get(s.path)
    if kind is None and s.choices:
        kind = click.Choice(s.choices)
    elif kind is None and s.value_type is not bool:
        kind = s.value_type

    def check(ctx: click.Context, param: click.Parameter, value):
        s.validate(value)
        return value

    if s.default is REQUIRED:
        return click.option(s.flag, s.name, type=kind, required=True, help=s.option_help, callback=check)
    return click.option(s.flag, s.name, type=kind, default=s.default, show_default=s.default is not None,
                        help=s.option_help, callback=check)


def _with_run_options(fn):
    """The run-level options, which `hpcyolo exec` shares: --run-dir, --data, --signal, --dist-timeout."""
    from hpcyolo_trainer.settings import RUN_LEVEL

    for name in reversed(RUN_LEVEL):
        fn = _setting_option(name)(fn)
    return fn


def _with_setting_options(fn):
    """Every other setting of the trainer that has an option, in the table's order."""
    from hpcyolo_trainer.settings import RUN_LEVEL, SETTINGS

    for s in reversed(SETTINGS):
        if s.flag and s.name not in RUN_LEVEL:
            fn = _setting_option(s.name)(fn)
    return fn


@main.command(short_help="Train the detector (one process per GPU).")
@_with_run_options
@_with_setting_options
@click.option("--check-run", is_flag=True, help="Only check that --run-dir may take this run (it holds none, or "
              "one with the same settings), writing nothing: the batch script of a job with run.resume: true asks "
              "before it records a start.")
def train(run_dir: str, data: str, signal: str, check_run: bool, **options) -> None:
    """Train the built-in detector: run once per GPU (the sbatch script does this).

    Reads the rank layout from Slurm or torchrun, resumes from the newest valid
    checkpoint in --run-dir, and on --signal checkpoints and exits 75 so the
    batch script requeues the job. Without a launcher it trains in one process.

    \b
    Example:
        hpcyolo train --run-dir runs/demo --data shapes/data.yaml --imgsz 160 --epochs 30
    """
    if check_run:
        import pathlib

        from hpcyolo_trainer import rundir

        config = train_config(run_dir, data, signal, **options).to_dict()
        rundir.check_continues(pathlib.Path(run_dir), rundir.settings(config), for_job=True)
        return
    from hpcyolo_trainer.preemption import PEER_LOST_EXIT_CODE, StopFlag

    from .slurm_stop import sigterm_decision

    # Catch the warning signal from the first moment: importing torch takes
    # seconds, and the signal's default action would kill the process.
    stop = StopFlag(signal, on_sigterm=sigterm_decision)
    os.environ.update(_this_process_vars(os.environ))
    # What the job spec checks, with its words, before torch loads.
    from hpcyolo_trainer.settings import check_train

    check_train({"signal": signal, **options}, int(os.environ.get("WORLD_SIZE", "1")))
    from hpcyolo_trainer.dist import lost_peer_line
    from hpcyolo_trainer.train import main as train_main

    try:
        code = train_main(train_config(run_dir, data, signal, **options), stop)
    except RuntimeError as e:  # a collective whose peer died: one line, not a traceback per rank
        line = lost_peer_line(e)
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        code = PEER_LOST_EXIT_CODE
    sys.exit(code)


def _this_process_vars(env: dict[str, str]) -> dict[str, str]:
    """The standard variables of this process. A host process of a launcher
    that starts one per host (SageMaker, a Kubernetes pod) on a host that
    needs several starts one per GPU instead, each running this same command
    line (they find their ranks set), and exits with their status."""
    from .distenv import NodeLayout, from_environ

    found = from_environ(env)
    if isinstance(found, NodeLayout):
        from .local import launch_layout

        sys.exit(launch_layout([sys.executable, "-m", "hpcyolo.cli", *sys.argv[1:]], found, env=env))
    return found.standard_vars()


def train_config(run_dir: str, data: str, signal: str, check_run: bool = False, **options):
    """The trainer's config of a `hpcyolo train` command line (no torch)."""
    from hpcyolo_trainer.settings import TrainConfig

    return TrainConfig(run_dir=run_dir, data=data, signal=signal, **options)


@main.command(short_help="Detect objects in images with trained weights.")
@click.argument("weights", type=click.Path(exists=True, dir_okay=False))
@click.argument("images", nargs=-1, required=True)
@click.option("--out", default="predictions", show_default=True, type=click.Path(file_okay=False),
              help="Folder for drawn images and labels/ (or predictions.json).")
@click.option("--format", "fmt", type=click.Choice(["txt", "json"]), default="txt", show_default=True,
              help="txt: labels/NAME.txt, 'class cx cy w h conf' normalised; json: one predictions.json.")
@click.option("--conf", default=0.25, show_default=True, help="Confidence threshold.")
@click.option("--iou", default=0.7, show_default=True, help="IoU threshold of the NMS.")
@click.option("--imgsz", type=int, default=None, callback=_check_imgsz, help="Inference size, a multiple of 32 "
              "(default: the training size).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
def predict(weights: str, images: tuple[str, ...], out: str, fmt: str, conf: float, iou: float, imgsz: int | None,
            device: str) -> None:
    """Detect objects in IMAGES (files or folders) with trained WEIGHTS.

    An image that cannot be read is skipped with one warning line, as in
    training; the others are predicted.

    \b
    Example:
        hpcyolo predict RUN/weights/best.pt photos/ --out predictions --format json
    """
    from hpcyolo_trainer.predict import predict as run_predict

    results = run_predict(weights, list(images), out, imgsz=imgsz, conf=conf, iou=iou, fmt=fmt, device=device,
                          warn=lambda m: click.echo(m, err=True))
    total = sum(len(r["detections"]) for r in results)
    click.echo(f"{total} detections in {len(results)} images; written to {out}", err=True)


@main.command(name="val", short_help="Measure weights on a dataset split (mAP).")
@click.argument("weights", type=click.Path(exists=True, dir_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False), help="Data YAML.")
@click.option("--imgsz", type=int, default=None, callback=_check_imgsz, help="Image size, a multiple of 32 "
              "(default: the training size, or 640).")
@click.option("--batch", default=16, show_default=True, type=click.IntRange(min=1), help="Images per batch.")
@click.option("--split", type=click.Choice(["val", "train"]), default="val", show_default=True,
              help="The split of the data YAML to measure.")
@click.option("--conf", default=0.001, show_default=True, help="Confidence threshold.")
@click.option("--iou", default=0.7, show_default=True, help="IoU threshold of the NMS.")
@click.option("--rect/--no-rect", default=True, show_default=True,
              help="Rectangular batches (images sorted by aspect ratio); off: every image on an imgsz square.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def val(weights: str, data: str, imgsz: int | None, batch: int, split: str, conf: float, iou: float,
        rect: bool, as_json: bool) -> None:
    """Measure WEIGHTS (hpcyolo's or an ultralytics checkpoint) on a dataset split.

    mAP50, mAP50-95, precision and recall, overall and per class, computed as
    ultralytics' `model.val()` does (rectangular batches, conf 0.001, IoU 0.7).
    Under a launcher (srun, torchrun, `hpcyolo run`) every rank validates its
    share of the batches and rank 0 prints.

    \b
    Examples:
        hpcyolo val RUN/weights/best.pt --data shapes/data.yaml
        hpcyolo val yolov8n.pt --data coco.yaml --imgsz 640 --json
    """

    os.environ.update(_this_process_vars(os.environ))
    import json
    import math

    from hpcyolo_trainer.dist import cleanup, setup
    from hpcyolo_trainer.evaluate import evaluate, table

    d = setup()
    try:
        result = evaluate(d, weights, data, imgsz=imgsz, batch=batch, split=split, conf=conf, iou=iou,
                          rect=rect, warn=lambda m: click.echo(m, err=True))
    finally:
        cleanup()
    if result is None:  # not rank 0
        return
    if as_json:
        def clean(v):
            if isinstance(v, float):
                return None if math.isnan(v) else round(v, 6)
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v

        click.echo(json.dumps(clean(result)))
        return
    click.echo(f"{weights} on {data} ({split}, {result['imgsz']} px):")
    click.echo(table(result))


@main.command(name="export", short_help="Write trained weights as an ONNX model.")
@click.argument("weights", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["onnx"]), default="onnx", show_default=True,
              help="Model format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="The file to write (atomically).  [default: WEIGHTS with the suffix .onnx]")
@click.option("--imgsz", type=int, default=None, callback=_check_imgsz, help="Input size, a multiple of 32 "
              "(default: the training size, or 640).")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Batch size of the fixed "
              "input shape.")
@click.option("--dynamic", is_flag=True, help="Batch size, height and width free at run time.")
@click.option("--opset", default=17, show_default=True, type=click.IntRange(min=11), help="ONNX opset version.")
def export(weights: str, fmt: str, output: str | None, imgsz: int | None, batch: int, dynamic: bool,
           opset: int) -> None:
    """Write WEIGHTS (hpcyolo's or an ultralytics checkpoint) as an ONNX model.

    Input `images` [B, 3, H, W] float in [0, 1]; output `output0` [B, 4 + nc,
    anchors]: boxes (cx, cy, w, h) in input pixels and class scores, before
    NMS. Checked with onnxruntime against torch before it is written. Needs
    the extra `pip install 'hpcyolo[export]'`.

    \b
    Example:
        hpcyolo export RUN/weights/best.pt --imgsz 640 --dynamic -o best.onnx
    """
    from hpcyolo_trainer.export import export_onnx

    r = export_onnx(weights, output, imgsz=imgsz, batch=batch, dynamic=dynamic, opset=opset)
    shape = "dynamic batch and size" if dynamic else f"input {r['batch']}x3x{r['imgsz']}x{r['imgsz']}"
    click.echo(f"wrote {r['path']} ({r['arch']}, {r['nc']} classes, {shape}, opset {opset}, "
               f"{r['bytes'] / 1e6:.1f} MB); onnxruntime matches torch within {r['parity']:.1e} (relative)", err=True)


@main.command(short_help="Submit JOB on SITE (submitit or sbatch).")
@_site_arg
@_job_arg
@click.option("--via", type=click.Choice(["submitit", "sbatch", "local"]), default=None,
              help="How to submit: submitit (default on Slurm sites), sbatch (the rendered script), or local "
                   "(the local site's default: `hpcyolo run` in the background).")
@click.option("--dry-run", is_flag=True, help="Print the batch script that would be submitted; submit nothing.")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2",
              help="Sweep a job key over values (repeatable; the runs are every combination), as one job array.")
@click.option("--parallel", type=click.IntRange(min=1), default=None,
              help="Most sweep elements running at once (--array=0-N%K).  [default: slurm.array_parallelism, "
                   "or all]")
@_hint_swapped
def submit(site: str, job: str, via: str | None, dry_run: bool, sweeps: tuple[str, ...], parallel: int | None) -> None:
    """Submit JOB on SITE through submitit (or sbatch), with the same resources as `render`.

    Every task stages the data, maps the Slurm variables and runs the same
    `hpcyolo train` as the sbatch script; on the site's signal it
    checkpoints, submitit requeues the job and it resumes in the same run
    directory. Prints the job id(s) on stdout (`id=$(hpcyolo submit ...)`) and
    each job's run directory on stderr; follow with `hpcyolo status RUN`.

    \b
    Examples:
        hpcyolo submit site_configs/testbed.yaml examples/shapes.yaml
        hpcyolo submit SITE JOB --sweep train.lr0=0.01,0.02 --sweep train.model=n,s

    A sweep element's run is named after its values (NAME-lr0_0.01-model_n).
    """
    from .submit import submit as do_submit

    command = shlex.join(["hpcyolo", *sys.argv[1:]])
    jobs = do_submit(site, job, via=via, dry_run=dry_run, sweeps=sweeps, parallel=parallel, command=command)
    for job_id, run_dir in jobs:
        click.echo(f"hpcyolo submit: job {job_id}, run directory {run_dir}", err=True)
        click.echo(job_id)


_run_dir_arg = click.argument("run", metavar="RUN", type=click.Path(file_okay=False))


@main.command(short_help="Where a run stands: job, state, checkpoints.")
@_run_dir_arg
def status(run: str) -> None:
    """Where the run in directory RUN stands: its job, Slurm's state, epochs and checkpoints.

    \b
    Example:
        hpcyolo status /shared/runs/shapes
    """
    from pathlib import Path

    from .lifecycle import status as run_status

    click.echo(run_status(Path(run)))


@main.command(short_help="Print the log of the run's newest job.")
@_run_dir_arg
@click.option("--rank", type=click.IntRange(min=0), default=None, help="One rank's log (runs submitted through "
              "submitit keep one per rank).  [default: rank 0, or the job's one log]")
@click.option("--follow", "-f", is_flag=True, help="Keep printing what is written until the job ends.")
def logs(run: str, rank: int | None, follow: bool) -> None:
    """Print the log of the newest job of the run in directory RUN.

    \b
    Example:
        hpcyolo logs /shared/runs/shapes --follow
    """
    from pathlib import Path

    from .lifecycle import logs as run_logs

    run_logs(Path(run), rank, follow)


@main.command(short_help="Cancel the run's newest job (scancel).")
@_run_dir_arg
def cancel(run: str) -> None:
    """Cancel the newest job of the run in directory RUN (scancel).

    A job that has already ended is said to have, with its final state.

    \b
    Example:
        hpcyolo cancel /shared/runs/shapes
    """
    from pathlib import Path

    from .lifecycle import cancel as run_cancel

    click.echo(run_cancel(Path(run)), err=True)


@main.command(short_help="Compare SITE (and JOB) with the live cluster.")
@click.argument("site", required=False)
@click.argument("job", required=False)
@click.option("--in-job", is_flag=True, help="The preflight, on every task of a running job (the batch script "
              "runs it when the job spec says preflight: true): interface, master host and port, scratch room, "
              "then the all-reduce bus bandwidth.")
@click.option("--interface", default=None, help="--in-job: the site's network interface.")
@click.option("--scratch", default=None, help="--in-job: the node-local folder the data is staged into.")
@click.option("--data", default=None, help="--in-job: the data YAML to be staged (for the room check).")
@click.option("--signal-test", is_flag=True, help="Submit a tiny job that checks that the site's preemption signal "
              "reaches the task through srun (and the container), and that `scontrol requeue` works for you.")
@click.option("--signal-wait", nargs=2, hidden=True, metavar="SIG FILE", help="(the signal test's task)")
@_hint_swapped
def doctor(site: str | None, job: str | None, in_job: bool, interface: str | None, scratch: str | None,
           data: str | None, signal_test: bool, signal_wait: tuple[str, str] | None) -> None:
    """Compare SITE (and JOB) with the live cluster, from a login node.

    Checks the Slurm version against the site's GPU request style; the
    partition, its time limit, node count, CPUs and GPUs (GRES); account and
    QOS where sacctmgr answers; that storage.runs is writable and
    storage.logs exists and is writable; the network interface on a compute
    node (a one-task srun; on this node when none can run, saying so); the
    scratch room on this node; that environment.venv holds hpcyolo, the
    container image exists and `module` works where the site uses them.
    Each failure names the check and the fix; exits 1 if any check fails.

    \b
    Examples:
        hpcyolo doctor site_configs/testbed.yaml examples/shapes.yaml
        hpcyolo doctor --signal-test site_configs/testbed.yaml
    """
    if in_job:
        from .preflight import preflight

        sys.exit(preflight(interface, scratch, data))
    if signal_wait:
        from .doctor import signal_wait as wait_for_signal

        sys.exit(wait_for_signal(*signal_wait))
    if not site:
        raise click.UsageError("give SITE (and optionally JOB), or --in-job inside a job")
    from .config import load_site
    from .doctor import doctor as run_doctor
    from .doctor import report

    site_config = load_site(site)
    if signal_test:
        from .doctor import signal_test as run_signal_test

        click.echo("submitting a 1-node test job; it takes a minute or so", err=True)
        checks = run_signal_test(site_config, site)
        click.echo(report(checks))
        sys.exit(1 if any(c.status == "FAIL" for c in checks) else 0)
    plan = _load_plan(site, job) if job else None  # the job must validate against the site first
    checks = run_doctor(site_config, plan.job if plan else None, plan.data if plan else None, plan=plan)
    click.echo(report(checks))
    if any(c.status == "FAIL" for c in checks):
        sys.exit(1)


@main.command(name="exec", context_settings={"ignore_unknown_options": True},
              short_help="Run a torch.distributed script with ranks set.")
@_with_run_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(run_dir: str, data: str, signal: str, dist_timeout: int, command: tuple[str, ...]) -> None:
    """Run COMMAND (any torch.distributed script) with the standard variables.

    Sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT from the launcher's environment, plus HPCYOLO_RUN_DIR and
    HPCYOLO_DATA, then replaces itself with COMMAND.

    \b
    Example:
        hpcyolo exec --run-dir RUN --data DATA -- python train.py --epochs 3
    """
    env = dict(os.environ)
    env.update(_this_process_vars(env))
    env.update(HPCYOLO_RUN_DIR=run_dir, HPCYOLO_DATA=data, HPCYOLO_SIGNAL=signal,
               HPCYOLO_DIST_TIMEOUT=str(dist_timeout))
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError:
        raise HpcyoloError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise HpcyoloError(f"not executable: {command[0]}") from None


if __name__ == "__main__":
    main()
