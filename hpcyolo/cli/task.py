"""Commands a job's tasks run: stage (once per node), train (once per GPU;
its options come from the settings' table), exec (a custom entrypoint)."""

from __future__ import annotations

import os
import sys
import traceback

import click
from hpcyolo_trainer.common.errors import HpcyoloError, printable
from hpcyolo_trainer.common.settings import SIGNALS

from hpcyolo.cli.group import main, this_process_vars


@main.command(short_help="Copy a dataset into node-local scratch.")
@click.option("--data", type=click.Path(), help="The dataset: its data YAML (the dataset root, "
              "`path:`, is copied), a classification dataset's folder (train/CLASS, val/CLASS), or a tar archive "
              "(.tar, .tar.gz/.tgz, .tar.zst, .tar.xz, .tar.bz2) holding it "
              "with exactly one data YAML at its top level.")
@click.option("--dest", type=click.Path(file_okay=False), help="Node-local folder to copy it into (created; its "
              "parent holds the lock file).")
@click.option("--remove", "remove", type=click.Path(file_okay=False), help="Remove this folder (a staged copy or "
              "the whole scratch folder) and its lock file instead; a missing one is fine.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes that stat and copy the "
              "files in parallel; from Lustre or NFS, where each file waits on the servers, more than the CPUs "
              "pay off.  [default: one per CPU, 2 to 16; one below 1024 files]")
@click.option("--signal", type=click.Choice(SIGNALS), default=None,
              help="The site's preemption signal: it stops the stage for a requeue (exit 75, the preemption "
              "marker written), as SIGTERM does when Slurm is preempting, requeueing or timing out the job.")
def stage(data: str | None, dest: str | None, remove: str | None, workers: int | None, signal: str | None) -> None:
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
    one when it ends (files, bytes, seconds, MB/s, node). Stopped for a
    preemption or requeue, it removes the partial copy and exits 75; a
    cancel (SIGTERM) removes it and exits 143.
    """
    from hpcyolo.node import stage as staging

    if remove:
        staging.remove(remove)
        return
    if not (data and dest):
        raise click.UsageError("give --data and --dest (or --remove DIR)")
    staging.stage(data, dest, workers=workers, signal=signal)


def _setting_option(name: str):
    """The option of `hpcyolo train` for the trainer's setting `name`: its
    name, default, help and check all from the settings' table
    (hpcyolo_trainer.common.settings)."""
    from hpcyolo_trainer.common.settings import BY_NAME, REQUIRED

    s = BY_NAME[name]
    kind = {"file": click.Path(exists=True, dir_okay=False), "file-name": click.Path(),
            "folder": click.Path(file_okay=False)}.get(s.path)
    if kind is None and s.choices:
        kind = click.Choice(s.choices)
    elif kind is None and s.parse:
        kind = str
    elif kind is None and s.value_type is not bool:
        kind = s.value_type

    def check(ctx: click.Context, param: click.Parameter, value):
        if s.parse and isinstance(value, str):
            from hpcyolo_trainer.common.settings import OptionError

            try:
                value = s.parse(value)
            except ValueError as e:
                raise OptionError(f"{s.option}: {e}") from None
        s.validate(value)
        return value

    names = (s.flag, *([s.alias] if s.alias else []), s.name)
    if s.default is REQUIRED:
        return click.option(*names, type=kind, required=True, help=s.option_help, callback=check)
    return click.option(*names, type=kind, default=s.default, show_default=s.default is not None,
                        help=s.option_help, callback=check, metavar="LIST" if s.parse else None)


def _with_run_options(fn):
    """The run-level options, which `hpcyolo exec` shares: --run-dir, --data, --signal, --dist-timeout."""
    from hpcyolo_trainer.common.settings import RUN_LEVEL

    for name in reversed(RUN_LEVEL):
        fn = _setting_option(name)(fn)
    return fn


def _with_setting_options(fn):
    """Every other setting of the trainer that has an option, in the table's order."""
    from hpcyolo_trainer.common.settings import RUN_LEVEL, SETTINGS

    for s in reversed(SETTINGS):
        if s.flag and s.name not in RUN_LEVEL:
            fn = _setting_option(s.name)(fn)
    return fn


@main.command(short_help="Train the detector (one process per GPU).")
@_with_run_options
@_with_setting_options
def train(run_dir: str, data: str, signal: str, **options) -> None:
    """Train the built-in detector: run once per GPU (the sbatch script does this).

    Reads the rank layout from Slurm or torchrun, resumes from the newest valid
    checkpoint in --run-dir, and on --signal checkpoints and exits 75 so the
    batch script requeues the job. Without a launcher it trains in one process.

    \b
    Example:
        hpcyolo train --run-dir runs/demo --data shapes/data.yaml --imgsz 160 --epochs 30
    """
    from hpcyolo_trainer.common.preemption import DEVICE_FAULT_EXIT_CODE, PEER_LOST_EXIT_CODE, StopFlag

    from hpcyolo.node.slurm_stop import sigterm_decision

    # Catch the warning signal from the first moment: importing torch takes
    # seconds, and the signal's default action would kill the process.
    stop = StopFlag(signal, on_sigterm=sigterm_decision)
    os.environ.update(this_process_vars(os.environ))
    if options.get("cfg"):
        options.update(_recipe(options))
    # What the job spec checks, with its words, before torch loads.
    from hpcyolo_trainer.common.settings import check_train

    check_train({"signal": signal, **options}, int(os.environ.get("WORLD_SIZE", "1")))
    from hpcyolo_trainer.common.devices import idle_threads_sleep
    from hpcyolo_trainer.common.rendezvous import listen_early

    prescan = None
    if os.environ.get("RANK", "0") == "0":  # rank 0 lists and stats the dataset while torch loads
        from hpcyolo_trainer.data.filescan import Prescan

        prescan = Prescan(data, options.get("fraction", 1.0))
    listen_early(os.environ)  # rank 0: the other ranks' connects queue while it imports torch

    idle_threads_sleep(os.environ)  # before torch loads libgomp
    if options.get("workers") != 0:  # a run with loader workers (the default: 8)
        from hpcyolo_trainer.parallel.workers import start as start_workers_server

        start_workers_server()  # it imports torch for the loader workers while this process does (parallel/workers.py)
    # Torch's and the trainer's imports without the garbage collector, then frozen (hpcyolo_trainer.common.heap).
    from hpcyolo_trainer.common.heap import long_lived

    with long_lived():
        from hpcyolo_trainer.parallel.dist import device_fault_line, lost_peer_line
        from hpcyolo_trainer.run.train import main as train_main

    try:
        code = train_main(train_config(run_dir, data, signal, **options), stop, prescan)
    except HpcyoloError as e:  # said as the group says it (hpcyolo.cli.group), then _end_rank
        print(f"hpcyolo: error: {printable(str(e))}", file=sys.stderr, flush=True)
        code = e.exit_code
    except RuntimeError as e:  # this rank's device failed, or a collective's peer died: one line
        line, code = device_fault_line(e), DEVICE_FAULT_EXIT_CODE
        if line is None:
            line, code = lost_peer_line(e), PEER_LOST_EXIT_CODE
        if line is None:
            traceback.print_exc()
            code = 1
        else:
            print(line, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - its traceback, then ended by _end_rank like every other ending
        traceback.print_exc()
        code = 1
    _end_rank(code)


def _end_rank(code: int):  # NoReturn
    """End a training process with `code`. Where it had a process group
    (still up: an error ended training; or left, kept from destruction, at
    a normal ending: hpcyolo_trainer.parallel.dist.leave), without the interpreter's
    teardown: gloo's work threads release their last collective's tensors
    under the GIL, and one that tries while the interpreter finalizes ends
    the process in std::terminate (SIGABRT, exit 134), which srun and the
    job's end read as a crash, retried, instead of this code. Everything of
    the run's was written and closed by then, but for a checkpoint written in
    the background when an error ended the training: waited for."""
    sys.stdout.flush()
    sys.stderr.flush()
    import torch.distributed
    from hpcyolo_trainer.parallel.dist import has_left
    from hpcyolo_trainer.run.checkpoint import finish_writes

    if torch.distributed.is_available() and (torch.distributed.is_initialized() or has_left()):
        finish_writes()
        os._exit(code)
    sys.exit(code)


def _recipe(options: dict) -> dict:
    """The settings of --cfg's recipe that the command line does not give
    itself; rank 0 says what it took, kept and ignored."""
    from hpcyolo_trainer.common.recipe import merge

    ctx = click.get_current_context()
    given = {name: value for name, value in options.items()
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    taken, lines = merge(options["cfg"], given)
    if os.environ.get("RANK", "0") == "0":
        for line in lines:
            click.echo(line)
    return taken


def train_config(run_dir: str, data: str, signal: str, **options):
    """The trainer's config of a `hpcyolo train` command line (no torch)."""
    from hpcyolo_trainer.common.settings import TrainConfig

    return TrainConfig(run_dir=run_dir, data=data, signal=signal, **options)


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
    env.update(this_process_vars(env))
    env.update(HPCYOLO_RUN_DIR=run_dir, HPCYOLO_DATA=data, HPCYOLO_SIGNAL=signal,
               HPCYOLO_DIST_TIMEOUT=str(dist_timeout))
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError:
        raise HpcyoloError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise HpcyoloError(f"not executable: {command[0]}") from None


# == around the training command: the job's first and last steps ==============

@main.group(short_help="A job's first and last step (the batch script runs them).")
def job() -> None:
    """A job's first and last step around its training command, as the
    sbatch script runs them in its batch shell (a submitit task and
    `hpcyolo run` take the same steps in Python: hpcyolo.node.job).

    \b
    Examples:
        hpcyolo job begin --run-dir "$RUN_DIR" --log "$LOG_FILE"
        hpcyolo job end --status "$status" --marker "$HPCYOLO_PREEMPT_MARKER" --max-requeues 3
    """


@job.command(name="begin", context_settings={"ignore_unknown_options": True})
@click.option("--run-dir", required=True, type=click.Path(file_okay=False), help="The run directory.")
@click.option("--via", type=click.Choice(["sbatch", "submitit", "local"]), default="sbatch", show_default=True,
              help="What started the job (recorded with the start).")
@click.option("--resume", is_flag=True, help="The job asks to continue the run in --run-dir (run.resume: true).")
@click.option("--log", default=None, help="The job's output file, recorded for `hpcyolo logs`.")
@click.option("--began", default=None, help="When the batch script began (epoch seconds): the "
              "start's first stamp in the run's ledger (`hpcyolo status`).")
@click.argument("train_options", nargs=-1, type=click.UNPROCESSED)
def job_begin(run_dir: str, via: str, resume: bool, log: str | None, began: str | None,
              train_options: tuple[str, ...]) -> None:
    """Refuse a run directory this job may not use; else record the start.

    At the job's first start (SLURM_RESTART_COUNT 0), a run directory that
    holds a run started before is refused, exit 2 and nothing written,
    unless --resume asks to continue it and TRAIN_OPTIONS (the job's `hpcyolo
    train` options, after --) make the same run. A requeue continues its own
    run. Then --run-dir is made and the start recorded in it.

    \b
    Example:
        hpcyolo job begin --run-dir "$RUN_DIR" --resume -- --run-dir "$RUN_DIR" --data "$DATA" --epochs 30
    """
    from pathlib import Path

    from hpcyolo.node.job import begin

    request = None
    if train_options:
        from hpcyolo_trainer.common import rundir

        params = train.make_context("hpcyolo train", list(train_options)).params
        request = rundir.settings(train_config(**params).to_dict())
    stamp = None
    try:
        stamp = float((began or "").replace(",", "."))  # bash's EPOCHREALTIME has the locale's decimal mark
    except ValueError:
        pass
    begin(Path(run_dir), via=via, resume=resume, request=request, log=log or None, began=stamp)


@job.command(name="end")
@click.option("--status", type=int, required=True, help="The training step's exit code.")
@click.option("--marker", default=None, help="The preemption marker the trainer leaves after its checkpoint.")
@click.option("--max-requeues", type=click.IntRange(min=0), default=0, show_default=True,
              help="Requeues after a checkpoint before the job stops asking.")
@click.option("--srun-errors", type=click.Path(dir_okay=False), default=None,
              help="srun's stderr of the training step: names the task that failed first.")
@click.option("--torchrun", is_flag=True, help="srun's tasks are torchruns (one per node), not ranks.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="The run directory: the hang watchdog's verdict, the failures so far, the ledger.")
@click.option("--max-failures", type=click.IntRange(min=0), default=0, show_default=True,
              help="Retries after a rank or node failed (the site's preemption.max_failures).")
@click.option("--in-place", "layout", nargs=3, type=click.IntRange(min=1), default=None,
              metavar="NODES TASKS_PER_NODE BATCH",
              help="The training step's layout and global batch: a failed node may then be left out inside "
                   "this allocation (prints `restart EXCLUDED NODES TASKS`) instead of requeueing the job.")
def job_end(status: int, marker: str | None, max_requeues: int, srun_errors: str | None, torchrun: bool,
            run_dir: str | None, max_failures: int, layout: tuple[int, int, int] | None) -> None:
    """Say what the training step's exit means; print `requeue` or the job's exit code.

    A checkpoint (exit 75, or the marker) with requeues left prints
    `requeue`: the script then requeues the job and keeps the node-local
    scratch for it. A rank or node that failed (killed by a signal, a node
    failure, a hang the watchdog blames on some ranks) with retries left
    (--max-failures) is recorded in RUN/failures.csv; where the allocation
    can train without the failed nodes (--in-place: nodes to spare, or the
    global batch split over the ranks left) `restart EXCLUDED NODES TASKS` is
    printed and the script starts the training step again at once;
    otherwise the job is requeued here, the failed nodes added to its
    excluded nodes (Slurm takes them only from a pending job), and
    `requeued` printed.
    Anything else prints the code the job ends with, after one line on
    stderr saying why (the rank that failed first, where srun's errors name it).
    """
    import os

    from hpcyolo_trainer.common.preemption import EXCLUDED_ENV, start_name

    from hpcyolo.node.job import (
        end,
        failed_first,
        failures_retried,
        in_place,
        job_id,
        node_failure,
        record_failure,
        requeue_without,
        restarts,
    )

    errors = ""
    if srun_errors:
        try:
            with open(srun_errors, errors="replace") as f:
                errors = f.read()
        except OSError:
            pass
    failure, before = None, 0
    if run_dir and os.environ.get("SLURM_JOB_ID") and status not in (0, 75):
        from pathlib import Path

        from hpcyolo_trainer.common import rundir
        from hpcyolo_trainer.run.watchdog import HANG_EXIT_CODE, read_blame

        slurm_job, restart = os.environ["SLURM_JOB_ID"], start_name(str(restarts(os.environ)), os.environ)
        blame = read_blame(rundir.hang_folder(run_dir, slurm_job, restart))
        if blame is not None and f"Exited with exit code {HANG_EXIT_CODE}" in errors:
            # The watchdog ended the step: its code, whatever srun's (a stopped rank it then killed gives 137).
            status = HANG_EXIT_CODE
        failure = node_failure(status, errors, blame)
        before = failures_retried(Path(run_dir), slurm_job)
        if failure is not None and before < max_failures and layout is not None:
            from hpcyolo import slurm

            excluded = [n for n in os.environ.get(EXCLUDED_ENV, "").split(",") if n]
            placed = in_place(failure, slurm.hostnames(os.environ["SLURM_JOB_NODELIST"]), excluded, *layout)
            if placed is not None:
                leave_out, nodes = placed
                record_failure(Path(run_dir), slurm_job, restart, failure, retried=True)
                print(f"hpcyolo: {failure.reason}; starting the training again in this allocation without "
                      f"{', '.join(failure.nodes)}, on {nodes} node(s) ({nodes * layout[1]} ranks, global batch "
                      f"{layout[2]}), from its newest checkpoint (failure {before + 1} of "
                      f"preemption.max_failures {max_failures})", file=sys.stderr, flush=True)
                print(f"restart {','.join(leave_out)} {nodes} {nodes * layout[1]}")
                return
    ending = end(status, marker, job=job_id(os.environ), restart=restarts(os.environ), max_requeues=max_requeues,
                 failed_first=failed_first(errors, torchrun), failure=failure, failures_before=before,
                 max_failures=max_failures)
    if failure is not None:
        record_failure(Path(run_dir), slurm_job, restart, failure, retried=ending.requeue)
    if ending.message:
        print(f"hpcyolo: {ending.message}", file=sys.stderr, flush=True)
    if ending.exclude:
        requeue_without(slurm_job, ending.exclude)
        print("requeued")
        return
    print("requeue" if ending.requeue else ending.code)
