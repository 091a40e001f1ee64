"""MLflow and Weights & Biases, offline first, written by rank 0.

Compute nodes have no internet. MLflow logs to a store in the run directory
(`local`) or to a tracking URI the user gives; W&B runs in offline mode into
the run directory, and the run's end prints the `wandb sync` command for a
login node. Both are optional extras (`pip install 'hpcyolo[mlflow]'`,
`'hpcyolo[wandb]'`), imported only when switched on.

A requeued job continues the same tracking run: its id is kept in the run
directory (tracking.json). Parameters are logged once, when the tracking run
is made: the resolved config, the world size, Slurm's cluster name; the
Slurm job ids of every start are a tag (MLflow) or a config entry (W&B).

Every call runs on one daemon thread fed by a queue: a training step never
waits for a tracking store.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import time
from pathlib import Path

from ..common.errors import HpcyoloError
from ..common.fsutil import write_atomic
from .background import Background

STATE = "tracking.json"  # in the run directory
LOCAL = "local"  # train.mlflow's value for the store in the run directory
EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}  # the setting's name: the module it needs


def check_installed(config: dict) -> None:
    """A one-line error, before anything runs, where a tracker is asked for
    and its package is not installed."""
    for setting, module in EXTRAS.items():
        if config.get(setting) and importlib.util.find_spec(module) is None:
            raise HpcyoloError(f"train.{setting} ({config[setting]}): the {module} package is not installed; "
                               f"pip install 'hpcyolo[{module}]'")


def job_ids() -> str:
    """This start's Slurm job (array job_task where it is one), or 'local'."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return job or "local"


class Tracking:
    """Rank 0's trackers for the run in `run`: MLflow where `mlflow` is set
    (LOCAL or a URI), W&B where `wandb` (a project name) is."""

    def __init__(self, run: Path, mlflow: str | None, wandb: str | None, params: dict):
        self.run = Path(run)
        self._sinks: list = []
        state = self._state()
        params = {**params, "slurm_cluster": os.environ.get("SLURM_CLUSTER_NAME", "none")}
        for setting, value, sink in (("mlflow", mlflow, _MLflow), ("wandb", wandb, _Wandb)):
            if value:
                try:
                    self._sinks.append(sink(self.run, value, state, params))
                except Exception as e:  # a tracker asked for and not working: said at the start, in one line
                    raise HpcyoloError(f"train.{setting} ({value}): {type(e).__name__}: "
                                       f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}") from None
        write_atomic(self.run / STATE, json.dumps(state, indent=1).encode())
        self._thread = Background("tracking")

    def _state(self) -> dict:
        try:
            return json.loads((self.run / STATE).read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._thread.submit(self._log, "scalars", step, values)

    def image(self, step: int, tag: str, path: Path) -> None:
        self._thread.submit(self._log, "image", step, (tag, Path(path)))

    def close(self, finished: bool) -> list[str]:
        """Write what is queued and end this job's part of the tracking runs
        (finished: the run is done); returns lines to print (wandb sync)."""
        self._thread.wait()
        lines = []
        for sink in self._sinks:
            try:
                lines += sink.close(finished)
            except Exception as e:  # noqa: BLE001 - a tracker must never fail the run
                lines.append(f"hpcyolo: warning: {type(sink).__name__.strip('_')} not closed ({type(e).__name__}: {e})")
        return lines

    def _log(self, kind: str, step: int, payload) -> None:
        for sink in self._sinks:  # each tracker apart: one that fails does not keep the others from logging
            try:
                getattr(sink, kind)(step, payload)
            except Exception as e:  # noqa: BLE001 - a tracker must never stop training
                print(f"hpcyolo: warning: {type(sink).__name__.strip('_')}: {kind} at step {step} not logged "
                      f"({type(e).__name__}: {e})", flush=True)


def _flat(params: dict) -> dict[str, str]:
    return {k: json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v) for k, v in params.items()}


class _MLflow:
    def __init__(self, run: Path, target: str, state: dict, params: dict):
        # MLflow 3 keeps its file store, the one that needs nothing but a folder, behind this switch.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.uri = (run / "mlruns").resolve().as_uri() if target == LOCAL else target
        self.client = MlflowClient(tracking_uri=self.uri)
        mine = state.get("mlflow", {})
        if mine.get("uri") == self.uri and mine.get("run_id"):
            self.run_id = mine["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            jobs = self.client.get_run(self.run_id).data.tags.get("slurm_jobs", "")
        else:
            experiment = self.client.get_experiment_by_name("hpcyolo")
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("hpcyolo")
            self.run_id = self.client.create_run(experiment_id, run_name=run.name).info.run_id
            from mlflow.entities import Param

            flat = _flat(params)
            keys = sorted(flat)
            for k in range(0, len(keys), 100):  # log_batch takes at most 100 params at once
                self.client.log_batch(self.run_id, params=[Param(key, flat[key][:6000]) for key in keys[k:k + 100]])
            jobs = ""
        self.client.set_tag(self.run_id, "slurm_jobs", ",".join(filter(None, [jobs, job_ids()])))
        state["mlflow"] = {"uri": self.uri, "run_id": self.run_id}

    def scalars(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # MLflow's names take no brackets: dropped, as ultralytics' MLflow callback drops them (mAP50-95(B) -> mAP50-95B)
        metrics = [Metric(key.replace("(", "").replace(")", ""), float(v), now, step) for key, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def image(self, step: int, payload) -> None:
        _, path = payload
        self.client.log_artifact(self.run_id, str(path), artifact_path="plots")

    def close(self, finished: bool) -> list[str]:
        self.client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")
        return [f"mlflow: run {self.run_id} in {self.uri}"]


class _Wandb:
    def __init__(self, run: Path, project: str, state: dict, params: dict):
        import wandb

        mine = state.get("wandb", {})
        run_id = mine.get("id") or secrets.token_hex(4)
        jobs = [*mine.get("jobs", []), job_ids()]
        self.mode = os.environ.get("WANDB_MODE", "offline")  # offline unless the user asks for online
        self.wb = wandb.init(project=project, name=run.name, id=run_id, resume="allow", dir=str(run),
                             mode=self.mode, config={**params, "slurm_jobs": jobs},
                             settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        self.wb.config.update({"slurm_jobs": jobs}, allow_val_change=True)
        self.run = run
        state["wandb"] = {"id": run_id, "project": project, "jobs": jobs}

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.wb.log(values, step=step)

    def image(self, step: int, payload) -> None:
        import wandb

        tag, path = payload
        self.wb.log({tag: wandb.Image(str(path))}, step=step)

    def close(self, finished: bool) -> list[str]:
        import wandb

        self.wb.finish(exit_code=0 if finished else 1)
        # finish() returns while wandb-core, a process of its own, may still be
        # writing the run's file; a rank ends with os._exit (no W&B exit hook)
        # and a Slurm step's end kills what is left: its last records were lost.
        # teardown() waits for wandb-core to write everything and exit.
        wandb.teardown()
        if self.mode != "offline":
            return []
        return [f"wandb: offline run {self.wb.id}; from a login node: wandb sync "
                f"{self.run.resolve() / 'wandb'}/offline-run-*-{self.wb.id}"]
