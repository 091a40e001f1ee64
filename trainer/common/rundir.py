"""The run directory: the names of its files, and whether a request may
continue the run it holds.

A run directory is never silently rewritten. A request on a directory that
holds a run (`hpcyolo train`, `hpcyolo run`, `hpcyolo submit`, the batch
script's training step) continues it only when it asks for the same run:
when it agrees with the run's config.yaml on every setting the settings'
table marks `same_run` (settings.py, each with the reason). Anything else
stops before a file is written, in one line naming the keys that differ. The
others may change from one start to the next: a requeued job may land on
other hardware, and raising `epochs` is the way to train a run further.

The trainer checks (hpcyolo_trainer.run.train), and so do the commands that start
a job before they submit or launch it; validate, render and submit --dry-run
say beforehand what the job will do.

This module is the one place that names the run directory's files and writes
and reads its records: the start record (RECORD), the job journal (JOBS),
results.csv, the preemption marker, and the refusal of a second run. The
batch script keeps its shell form of the rule, with its text and file names
from here (through the plan). No torch here.
"""

from __future__ import annotations

import csv
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import HpcyoloError
from .preemption import EXIT_CODE
from .settings import BY_NAME, SAME_RUN
from .stagedcopy import dataset_of

RECORD = "hpcyolo-run"  # a line per start of a job on the run (the batch script, submit, `hpcyolo run`)
JOBS = "hpcyolo-jobs"  # what `hpcyolo submit` submitted for the run (JSON lines)
CONFIG = "config.yaml"  # the trainer's settings, written by rank 0 once the request is accepted
CHECKPOINTS = "checkpoints"  # the trainer's checkpoints (hpcyolo_trainer.run.checkpoint names the files)
WEIGHTS = "weights"  # last.pt and best.pt: the EMA model, for inference
RESULTS = "results.csv"  # a row per finished epoch (RESULTS_COLUMNS)
RESULTS_PLOT = "results.png"  # drawn from results.csv at the end of the run
PREEMPTED = ".preempted-"  # + JOB-RESTART: the trainer checkpointed for a requeue (preempt_marker)
# Timing, not results: seconds in the training loop; images/s per rank, the
# share of the loop spent waiting for the loader (the largest of the ranks') and
# peak GPU memory allocated ("n/a" on CPU) of the epoch's training loop, in this
# process (a resumed epoch: since the resume). They differ between runs that are
# otherwise bit-identical; comparisons of runs leave them out.
TIMING_COLUMNS = ("time", "speed/images_per_s", "speed/data_wait", "speed/gpu_mem_GiB")
# The boxes' figures, as ultralytics names them for every task with boxes ((M): a segmentation's masks').
MAP50, MAP50_95 = "metrics/mAP50(B)", "metrics/mAP50-95(B)"
PRECISION, RECALL = "metrics/precision(B)", "metrics/recall(B)"
MASK_MAP50, MASK_MAP50_95 = "metrics/mAP50(M)", "metrics/mAP50-95(M)"  # a segmentation's masks'
POSE_MAP50, POSE_MAP50_95 = "metrics/mAP50(P)", "metrics/mAP50-95(P)"  # a keypoint model's keypoints'
# A classifier's, as ultralytics names them.
TOP1, TOP5 = "metrics/accuracy_top1", "metrics/accuracy_top5"
LR_GROUPS = 3  # the optimizer's parameter groups, as ultralytics': biases, decayed weights, other weights
# results.csv's columns of runs written before they took ultralytics' names: read as those (`lr` was pg0's).
RENAMED = {"metrics/mAP50": MAP50, "metrics/mAP50-95": MAP50_95, "metrics/precision": PRECISION,
           "metrics/recall": RECALL, "lr": "lr/pg0"}

RESULTS_COLUMNS = ("epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss", PRECISION, RECALL, MAP50,
                   MAP50_95, "val/box_loss", "val/cls_loss", "val/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2",
                   *TIMING_COLUMNS[1:])
# The plots a run directory ends with (ultralytics' names, and val_pred_N.jpg), as glob patterns.
PLOT_FILES = (RESULTS_PLOT, "labels.jpg", "train_batch*.jpg", "val_batch*.jpg", "confusion_matrix*.png",
              "Box*_curve.png", "Mask*_curve.png", "val_pred_*.jpg")


def fitness(map50: float, map50_95: float) -> float:
    """Ultralytics' measure of an epoch, by which best.pt and patience go: in
    8.4, mAP50-95 alone (its weights [0, 0, 0, 1] over P, R, mAP50, mAP50-95;
    0.1 mAP50 + 0.9 mAP50-95 before). map50 is taken for the callers' sake."""
    return map50_95


def classify_fitness(top1: float, top5: float) -> float:
    """Ultralytics' measure of a classifier's epoch: the mean of top-1 and top-5."""
    return (top1 + top5) / 2


def results_columns(losses: tuple[str, ...], metrics: tuple[str, ...] = RESULTS_COLUMNS[5:9],
                    groups: int = LR_GROUPS) -> tuple[str, ...]:
    """results.csv's header, as ultralytics 8.4 orders it, for a loss with
    these items (train/ and val/ each), a task with these metric columns and
    an optimizer of `groups` parameter groups (lr/pgN): RESULTS_COLUMNS for
    detection; YOLO26's third loss is l1_loss, as ultralytics names it.
    `time` second, as ultralytics'; hpcyolo's speed columns last."""
    return ("epoch", "time", *(f"train/{name}" for name in losses), *metrics, *(f"val/{name}" for name in losses),
            *(f"lr/pg{k}" for k in range(groups)), *TIMING_COLUMNS[1:])


JOB_NEW_RUN = "run.name, or another job name"  # how a job spec names another run directory
RESUME_HOW = "set run.resume: true"  # how a job spec asks to continue its run


def settings(config: dict) -> dict:
    """What config.yaml (and each checkpoint) records: the trainer's config,
    and the dataset its data YAML stands for."""
    return {**config, "dataset": dataset_of(config["data"])}


def holds_run(run_dir: Path) -> bool:
    """Whether a run was started in `run_dir` (or submitted for it)."""
    return any((run_dir / name).exists() for name in (RECORD, JOBS, CONFIG))


def started_before(run_dir: Path, job: str, restart: str) -> bool:
    """Whether a run was started in `run_dir` before this start of `job`:
    its settings written, or a start recorded by another job or start (a
    task of this start may find its own rank 0's line already there)."""
    if (run_dir / CONFIG).exists():
        return True
    record = run_dir / RECORD
    lines = record.read_text(errors="replace").splitlines() if record.exists() else []
    own = start_line(job, restart, "")
    return any(line.strip() and not line.startswith(own) for line in lines)


def read_settings(run_dir: Path) -> dict | None:
    """The run's config.yaml, None when there is none."""
    import yaml

    path = run_dir / CONFIG
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise HpcyoloError(f"{path}: cannot read the run's settings ({type(e).__name__}); use a new run "
                           "directory to start a new run") from None
    if not isinstance(saved, dict) or "data" not in saved:
        raise HpcyoloError(f"{path}: not the settings of an hpcyolo run; use a new run directory to start a new run")
    return saved


def differences(saved: dict, request: dict, job_keys: bool = False) -> list[str]:
    """`key (old -> new)` for each setting of SAME_RUN the two differ in."""
    found = []
    for s in SAME_RUN:  # the settings' table, in its order
        old, new = s.of(saved), s.of(request)
        if old != new:
            found.append(f"{s.key if job_keys and s.key else s.name} ({_show(old)} -> {_show(new)})")
    return found


def describe(saved: dict) -> str:
    """`yolov8n on /data/coco.yaml`: the run a config.yaml describes."""
    model = BY_NAME["model"].of(saved) or f"the weights {saved.get('weights')}"
    return f"{model} on {BY_NAME['data'].of(saved)}"


def _show(value: object) -> str:
    return "none" if value is None else str(value)


def refusal(run_dir: Path, saved: dict, request: dict, new_run: str, job_keys: bool = False) -> str | None:
    """Why `request` may not continue the run `saved` describes (one line), or
    None when it is the same run. `new_run` says how to name another
    directory (--run-dir, run.name)."""
    found = differences(saved, request, job_keys)
    if not found:
        return None
    return (f"{run_dir} holds a run of {describe(saved)}; this request differs in "
            f"{', '.join(found)}: use a new run directory ({new_run}) to start a new run")


def check_continues(run_dir: Path, request: dict, saved: dict | None = None, for_job: bool = False) -> None:
    """The trainer's rule: refuse, before anything is written, a request that
    would continue the run in `run_dir` (its config.yaml, or `saved`: a
    checkpoint's settings) with other settings. `for_job`: said to the
    author of a job spec, in its keys."""
    saved = read_settings(run_dir) if saved is None else saved
    new_run = JOB_NEW_RUN if for_job else "--run-dir"
    why = refusal(run_dir, saved, request, new_run, job_keys=for_job) if saved is not None else None
    if why:
        raise HpcyoloError(why)


def job_verdict(run_dir: Path, holds: bool, request: dict | None, resume: bool,
                resume_how: str = RESUME_HOW) -> tuple[bool, str] | None:
    """What a job would do with the run in `run_dir`: None when there is
    none; else (whether it goes ahead, one line saying what and why). A job
    continues a run only when it asks to (`resume`) and only the same run
    (`request`: the settings its training command would record; None for a
    custom entrypoint, whose run directory is its own). `holds`: whether
    there is a run, asked before a job is submitted (holds_run) and again at
    its start (started_before)."""
    if not holds:
        return None
    try:
        saved = read_settings(run_dir) if request is not None else None
    except HpcyoloError as e:  # an unreadable config.yaml: refused, and said so beforehand
        return False, str(e)
    why = refusal(run_dir, saved, request, JOB_NEW_RUN, job_keys=True) if saved is not None else None
    if why:
        return False, why
    if not resume:
        return False, already_holds(run_dir, resume_how)
    return True, f"{run_dir} holds a run{' of ' + describe(saved) if saved else ''}: the job continues it"


def already_holds(run_dir: Path | str, resume_how: str = RESUME_HOW) -> str:
    """The never-overwrite rule's refusal of a request that does not ask to
    continue the run (the batch script says it too, with "$RUN_DIR")."""
    return f"{run_dir} already holds a run; {resume_how} to continue it, or choose another run.name"


# == the start record: a line per start of a job on the run ==================

_LOG, _VIA = " log ", " via "
# `job ID restart N on HOST[ log PATH]` from the batch script (the path is
# the rest of the line and may hold spaces; older scripts wrote no log),
# `job ID restart N on HOST via submitit` from a submitit task.
_START = re.compile(r"job (\S+) restart (\S+) on (\S*)(.*)")


@dataclass
class Start:
    """One line of RUN/hpcyolo-run: a start of a job (its first, or a requeue)."""

    job: str
    restart: str
    host: str
    log: str | None  # the job's output file, as the batch script saw it


def start_line(job: str, restart: str, host: str, via: str = "", log: str | None = None) -> str:
    """The record of a job's start (a batch script's with its log's path)."""
    return f"job {job} restart {restart} on {host}" + (f"{_VIA}{via}" if via else "") + (f"{_LOG}{log}" if log else "")


def local_start_line(host: str, pid: int | None = None) -> str:
    """The record of `hpcyolo run`'s start: no job, no requeue; its process."""
    return f"local run on {host}" + (f" pid {pid}" if pid else "")


_LOCAL_START = re.compile(r"local run on (\S*)(?: pid (\d+))?")


def local_starts(run: Path) -> list[tuple[str, str | None]]:
    """(host, pid or None) of each `hpcyolo run` start recorded, oldest first."""
    record = run / RECORD
    lines = record.read_text(errors="replace").splitlines() if record.exists() else []
    return [(m[1], m[2]) for m in map(_LOCAL_START.fullmatch, lines) if m]


def record_start(run_dir: Path, line: str) -> None:
    """Append one start (start_line, local_start_line) to the run's record."""
    with open(run_dir / RECORD, "a") as f:
        f.write(f"{line}\n")


def starts(run: Path) -> list[Start]:
    """The starts of jobs recorded in RUN/hpcyolo-run, oldest first."""
    record = run / RECORD
    out = []
    for line in (record.read_text(errors="replace").splitlines() if record.exists() else []):
        m = _START.fullmatch(line)
        if m:
            rest = m[4]
            out.append(Start(m[1], m[2], m[3], rest[len(_LOG):] if rest.startswith(_LOG) else None))
    return out


def start_count(run: Path) -> int:
    """Every start recorded, `hpcyolo run`'s too."""
    return (run / RECORD).read_text().count("\n") if (run / RECORD).exists() else 0


# == the job journal: what `hpcyolo submit` submitted for the run ============

def record_job(run_dir: Path, entry: dict) -> None:
    """One JSON line in RUN/hpcyolo-jobs: what was submitted, how, where its logs go."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / JOBS, "a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **entry}) + "\n")


def submitted(run: Path) -> list[dict]:
    """The journal's entries, oldest first (a line that is not JSON is skipped)."""
    path = run / JOBS
    entries = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


# == results.csv =============================================================

def read_results(run: Path) -> list[dict[str, str]]:
    """results.csv's rows, oldest epoch first; none without the file (a
    custom entrypoint writes what it writes). A run's from before its
    columns took ultralytics' names reads as one written since (RENAMED)."""
    path = run / RESULTS
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{RENAMED.get(k, k): v for k, v in row.items()} for row in csv.DictReader(f)]


def write_result(run: Path, values: tuple, columns: tuple[str, ...] = RESULTS_COLUMNS) -> None:
    """Add an epoch's row (the values of `columns`, epoch first, counted
    from 1) to results.csv, atomically: a resumed epoch replaces its old row."""
    import io

    from .fsutil import write_atomic

    row = dict(zip(columns, values, strict=True))
    rows = [r for r in read_results(run) if int(r["epoch"]) < int(row["epoch"])]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows([*rows, row])
    write_atomic(run / RESULTS, text.getvalue().encode())


def scores(row: dict[str, str]) -> str:
    """`mAP50 0.123, mAP50-95 0.045`: an epoch's row in words (a classifier's: `top1 0.812, top5 0.990`)."""
    if TOP1 in row:
        return f"top1 {float(row[TOP1]):.3f}, top5 {float(row[TOP5]):.3f}"
    also = f", mask mAP50-95 {float(row[MASK_MAP50_95]):.3f}" if MASK_MAP50_95 in row else \
        f", pose mAP50-95 {float(row[POSE_MAP50_95]):.3f}" if POSE_MAP50_95 in row else ""
    return f"mAP50 {float(row[MAP50]):.3f}, mAP50-95 {float(row[MAP50_95]):.3f}{also}"


# == the preemption marker, and what a job's end means =======================

def preempt_marker(run_dir: Path | str, job: str, restart: str) -> str:
    """The file the trainer leaves once its checkpoint is written, before it
    exits EXIT_CODE (hpcyolo_trainer.common.preemption.MARKER_ENV names it to the trainer)."""
    return f"{run_dir}/{PREEMPTED}{job}-{restart}"


def preempt_markers(run: Path) -> list[Path]:
    """Every marker in the run directory (a finished run removes them)."""
    return sorted(run.glob(f"{PREEMPTED}*"))


def checkpointed(code: int, marker: str | None = None) -> bool:
    """Whether a training step that ended with `code` stopped after a
    checkpoint to be continued (requeue the job, or resume the run), rather
    than ending in a way to pass on. The marker counts too: with srun
    --kill-on-bad-exit, the first rank to exit EXIT_CODE gets the others
    killed, and srun may then report their signal instead. Asked by the
    job's last step (hpcyolo.node.job.end), on every path of a job."""
    return code == EXIT_CODE or (marker is not None and os.path.exists(marker))


# == the job's health: hangs, slow ranks, failures ===========================

HANGS = "hangs"  # + /JOB-RESTART/: each rank's stacks (rank-R.txt), its collectives (rank-R.flight.json) and the verdict (blame.json) of a hang
STRAGGLERS = "stragglers.csv"  # a row per slow rank named (hpcyolo_trainer.run.stragglers)
FAILURES = "failures.csv"  # a row per job start that failed on a rank or node (hpcyolo.node.job.end)
STRAGGLER_COLUMNS = ("time", "job", "step", "rank", "host", "ms", "median_ms", "on")
FAILURE_COLUMNS = ("time", "job", "restart", "nodes", "ranks", "reason", "retried", "lost_steps")


INDEX = "index"  # + /SPLIT.npz: the dataset's index (dataindex.py), which every start of the run reads
LEDGER = "ledger"  # JOB-RESTART.times (the batch script's stamps) and .json (the trainer's): ledger.py


def ledger_file(run_dir: Path | str, job: str, restart: str, suffix: str) -> Path:
    return Path(run_dir) / LEDGER / f"{job}-{restart}{suffix}"


def index_file(run_dir: Path | str, split: str) -> Path:
    return Path(run_dir) / INDEX / f"{split}.npz"


def hang_folder(run_dir: Path | str, job: str, restart: str) -> Path:
    return Path(run_dir) / HANGS / f"{job}-{restart}"


def append_row(path: Path, columns: tuple[str, ...], row: dict) -> None:
    """One CSV row (the header first in a new file), appended whole."""
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    if not path.exists():
        writer.writeheader()
    writer.writerow({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **row})
    with open(path, "a") as f:
        f.write(out.getvalue())


def read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []
