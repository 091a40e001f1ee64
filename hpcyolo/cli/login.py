"""Commands for the job on the cluster, from a login node: validate, render,
submit, run (the job on this machine), status, compare, logs, cancel,
doctor, make-dataset, site init."""

from __future__ import annotations

import shlex
import sys

import click
from hpcyolo_trainer.common.errors import printable

from hpcyolo.cli.group import _hint_swapped, _job_arg, _load_plan, _site_arg, main


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
    from hpcyolo_trainer.common.datayaml import check_data

    from hpcyolo.login.runcheck import warn_job

    plan = _load_plan(site, job, for_sbatch=True)
    for warning in check_data(plan.data, plan.task):
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
def render(site: str, job: str, output: str | None) -> None:
    """Print the sbatch script for JOB on SITE.

    The script is complete and readable: pipe it to sbatch, or save it with -o
    and read it first. Messages go to stderr, the script alone to stdout.

    \b
    Example:
        hpcyolo render site_configs/testbed.yaml examples/shapes.yaml | sbatch
    """
    from hpcyolo.login.edge import render as render_job

    said = render_job(site, job, output=output)
    if said is not None:
        click.echo(printable(said), err=True)


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
    from hpcyolo.login.run import run_local

    sys.exit(run_local(_load_plan(site, job), resume=resume))


@main.command(name="make-dataset", short_help="Write a small synthetic dataset (detect, segment or classify).")
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
# login/shapes.py's TASKS (not imported here: it loads numpy and Pillow)
@click.option("--task", default="detect", show_default=True,
              type=click.Choice(["detect", "segment", "classify", "obb", "pose"]),
              help="The labels, as ultralytics reads them for the task: boxes; polygons (the shapes' silhouettes); "
                   "6-10 shapes of one class per image in DIR/{train,val}/CLASS/ folders; the four corners of "
                   "each shape's tight rotated rectangle; or boxes with 4 keypoints, the outline's leftmost, topmost, "
                   "rightmost and bottommost points (kpt_shape [4, 3]).")
def make_dataset(kind: str, directory: str, n_train: int, n_val: int, imgsz: int, classes: int, seed: int,
                 max_objects: int, task: str) -> None:
    """Write a synthetic dataset into DIR, in ultralytics layout, for
    detection (boxes), segmentation (polygons), classification (class
    folders), oriented boxes (four corners) or keypoints (pose).

    KIND `shapes`: coloured shapes on noisy backgrounds, the class given by the
    silhouette alone. Small and learnable: a YOLO n trained from scratch on a
    CPU for a few minutes gets a meaningful mAP, which makes it an end-to-end
    test of a training setup. The same seed writes the same files.

    \b
    Example:
        hpcyolo make-dataset shapes /scratch/$USER/shapes
        hpcyolo make-dataset shapes --task segment /scratch/$USER/shapes-seg
        hpcyolo make-dataset shapes --task obb /scratch/$USER/shapes-obb
        hpcyolo make-dataset shapes --task pose /scratch/$USER/shapes-pose

    DIR must not exist or be empty; it appears complete or not at all.
    Prints the path of its data.yaml on stdout (for classify: DIR, the
    dataset as ultralytics takes it).
    """
    import time
    from pathlib import Path

    from hpcyolo.login.shapes import make_shapes

    start = time.monotonic()
    data_yaml = make_shapes(Path(directory), n_train=n_train, n_val=n_val, imgsz=imgsz, classes=classes, seed=seed,
                            max_objects=max_objects, task=task)
    click.echo(f"wrote {n_train} train + {n_val} val images ({imgsz} px, {classes} classes) "
               f"in {time.monotonic() - start:.1f} s", err=True)
    click.echo(str(data_yaml))


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

    The submitit job runs the script `render` prints: the same staging,
    training step, failure retries, restart in place and ledger; on the
    site's signal the training checkpoints, the script requeues the job and
    it resumes in the same run directory. Prints the job id(s) on stdout (`id=$(hpcyolo submit ...)`) and
    each job's run directory on stderr; follow with `hpcyolo status RUN`.

    \b
    Examples:
        hpcyolo submit site_configs/testbed.yaml examples/shapes.yaml
        hpcyolo submit SITE JOB --sweep train.lr0=0.01,0.02 --sweep train.model=n,s

    A sweep element's run is named after its values (NAME-lr0_0.01-model_n).
    """
    from hpcyolo.login.submit import submit as do_submit

    command = shlex.join(["hpcyolo", *sys.argv[1:]])
    jobs = do_submit(site, job, via=via, dry_run=dry_run, sweeps=sweeps, parallel=parallel, command=command)
    for job_id, run_dir in jobs:
        click.echo(f"hpcyolo submit: job {job_id}, run directory {run_dir}", err=True)
        click.echo(job_id)


_run_dir_arg = click.argument("run", metavar="RUN", type=click.Path(file_okay=False))


@main.command(short_help="Where a run stands: job, state, checkpoints.")
@_run_dir_arg
@click.option("--json", "as_json", is_flag=True, help="Print the ledger (seconds per part, goodput), the failures "
              "and the slow ranks as JSON.")
def status(run: str, as_json: bool) -> None:
    """Where the run in directory RUN stands: its job, Slurm's state, epochs and checkpoints.

    Then the failures retried, the slow ranks named, and where the hours of
    all its jobs went (queued, staging, preflight, rendezvous, training,
    validation, checkpoint stalls, work lost to restarts, idle before a
    requeue), with the goodput: the share of the allocated time that
    advanced training.

    \b
    Example:
        hpcyolo status /shared/runs/shapes
        hpcyolo status --json /shared/runs/shapes
    """
    from pathlib import Path

    if as_json:
        import json

        from hpcyolo.login.lifecycle import ledger_json

        click.echo(json.dumps(ledger_json(Path(run))))
        return
    from hpcyolo.login.lifecycle import status as run_status

    click.echo(run_status(Path(run)))


@main.command(short_help="Runs side by side: curves and a ranking.")
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="compare.png", show_default=True,
              help="The PNG to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON instead of a table.")
def compare(runs: tuple[str, ...], output: str, as_json: bool) -> None:
    """Compare RUNS: run directories, or folders of them (a sweep's runs).

    Writes one PNG with every run's mAP50-95, mAP50 and training-loss curves
    against epoch, and prints the runs ranked by their best fitness
    (mAP50-95, ultralytics 8.4's measure) with the settings of their
    config.yaml that differ between them. Segmentation runs show the masks'
    mAP50 and mAP50-95 too, ranked by the boxes' mAP50-95 plus the masks'
    (ultralytics' fitness there); classifiers' runs show top1 and top5
    instead, ranked by their mean (ultralytics' fitness there).

    \b
    Examples:
        hpcyolo compare ~/hpcyolo-runs/shapes-lr0_0.01 ~/hpcyolo-runs/shapes-lr0_0.02
        hpcyolo compare ~/hpcyolo-runs -o sweep.png
    """
    import json
    from pathlib import Path

    from hpcyolo.login.compare import find_runs, plot, ranking, text_table

    found = find_runs([Path(r) for r in runs])
    rows = ranking(found)
    plot(found, Path(output))
    click.echo(json.dumps(rows) if as_json else text_table(rows))
    click.echo(f"{len(found)} run(s); curves in {output}", err=True)


@main.command(short_help="Print the log of the run's newest job.")
@_run_dir_arg
@click.option("--rank", type=click.IntRange(min=0), default=None, help="One rank's log, where the job kept one per "
              "rank (submitit jobs of an older hpcyolo; a job now writes one log).  [default: the job's log]")
@click.option("--follow", "-f", is_flag=True, help="Keep printing what is written until the job ends.")
def logs(run: str, rank: int | None, follow: bool) -> None:
    """Print the log of the newest job of the run in directory RUN.

    \b
    Example:
        hpcyolo logs /shared/runs/shapes --follow
    """
    from pathlib import Path

    from hpcyolo.login.lifecycle import logs as run_logs

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

    from hpcyolo.login.lifecycle import cancel as run_cancel

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
        from hpcyolo.node.preflight import preflight

        sys.exit(preflight(interface, scratch, data))
    if signal_wait:
        from hpcyolo.login.doctor import signal_wait as wait_for_signal

        sys.exit(wait_for_signal(*signal_wait))
    if not site:
        raise click.UsageError("give SITE (and optionally JOB), or --in-job inside a job")
    from hpcyolo.login.config import load_site
    from hpcyolo.login.doctor import doctor as run_doctor
    from hpcyolo.login.doctor import report

    site_config = load_site(site)
    if signal_test:
        from hpcyolo.login.doctor import signal_test as run_signal_test

        click.echo("submitting a 1-node test job; it takes a minute or so", err=True)
        checks = run_signal_test(site_config, site)
        click.echo(report(checks))
        sys.exit(1 if any(c.status == "FAIL" for c in checks) else 0)
    plan = _load_plan(site, job) if job else None  # the job must validate against the site first
    checks = run_doctor(site_config, plan.job if plan else None, plan.data if plan else None, plan=plan)
    click.echo(report(checks))
    if any(c.status == "FAIL" for c in checks):
        sys.exit(1)


@main.group(short_help="Write a site config from what the cluster says.")
def site() -> None:
    """Site configs: `hpcyolo site init` writes one for this cluster, from a
    login node.

    \b
    Example:
        hpcyolo site init --partition gpu -o site_configs/mycluster.yaml
    """


@site.command(name="init", short_help="Write a site config from what the cluster says.")
@click.option("--partition", "-p", default=None, help="The partition the jobs run in (default: the cluster's "
              "default partition).")
@click.option("--account", "-A", default=None, help="The account jobs are charged to (default: yours, where "
              "sacctmgr names one; a choice where it names several).")
@click.option("--constraint", "-C", default=None, help="Node features that pick the nodes (--constraint), where "
              "the site selects GPU nodes by feature.")
@click.option("--no-probe", is_flag=True, help="Ask Slurm on this login node only; run no step on a compute node "
              "(the interface, GPUs' model, scratch and storage candidates stay unchecked).")
@click.option("--node-types", type=click.Choice(["common", "each"]), default="common", show_default=True,
              help="A partition with several node types: the layout every node has (common), or one site config "
                   "per type (each: FILE-type1.yaml, ...).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the site config to this file (atomically) instead of stdout.")
@click.option("--force", is_flag=True, help="Replace -o's file where it exists.")
def site_init(partition: str | None, account: str | None, constraint: str | None, no_probe: bool, node_types: str,
              output: str | None, force: bool) -> None:
    """Write a site config for this cluster from what Slurm and one compute
    node say, each value with the place it came from (`# from: scontrol show
    partition gpu`).

    Run on a login node. It asks `scontrol` (version, config, the partition
    and its nodes) and `sacctmgr`, then runs one short step on a node of the
    partition that looks at its CPUs, GPUs, memory, network interfaces (and
    the one that routes to the other nodes), /dev/shm and local disks,
    shared mounts, modules and container tools (templates/node-probe.sh).
    What it cannot decide (where runs go; one of several accounts) is
    written as a CHOOSE value with the candidates it found: `hpcyolo
    validate` refuses the file until you choose.

    \b
    Examples:
        hpcyolo site init --partition gpu -o site_configs/mycluster.yaml
        hpcyolo site init --no-probe            # the login node's answers only
        hpcyolo validate site_configs/mycluster.yaml examples/shapes.yaml
    """
    from hpcyolo.login import siteinit

    command = "hpcyolo site init " + shlex.join(sys.argv[3:]) if len(sys.argv) > 3 else "hpcyolo site init"
    click.echo("asking Slurm" + ("" if no_probe else ", then probing a compute node (a one-task step: up to "
                                 f"{2 * siteinit.PROBE_SECONDS} s where the partition is busy)"), err=True)
    facts = siteinit.gather(partition, account, constraint, probe=not no_probe)
    several = siteinit.describe_types(facts, partition, constraint)
    if several:
        click.echo(f"hpcyolo: {several}; writing " + ("one site config per type" if node_types == "each" else
                                                      "the layout common to all (--node-types each: one per type)"),
                   err=True)
    if no_probe:
        click.echo("hpcyolo: --no-probe: unchecked, as the file says: the network interface and InfiniBand, the "
                   "GPUs' model, node-local scratch and its room, the run storage's candidates, modules and container "
                   "tools (hpcyolo doctor checks them once the file is filled in)", err=True)
    warnings: list[str] = []
    texts = siteinit.configs(facts, partition=partition, account=account, constraint=constraint,
                             per_type=node_types == "each", command=command.strip(), warn=warnings)
    for line in dict.fromkeys(warnings):
        click.echo(f"hpcyolo: warning: {line}", err=True)
    if output is None:
        click.echo("\n".join(text for _, text in texts), nl=False)
        return
    for path in siteinit.write_files(texts, output, force):
        click.echo(f"wrote {path}; choose its CHOOSE values, then: hpcyolo validate {path} JOB", err=True)
