"""The `Task` record every task fills in, and `load` by name."""


from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ..common.registry import TASKS


@dataclass(frozen=True)
class Task:
    """One task's parts, each a function the run calls (the detect task's
    are in tasks/detect/__init__.py, with their arguments)."""

    name: str  # ultralytics' word, as train.task and --task take it
    # data/: the training set (label files read, augmented with their labels) and the validation batches
    train_set: Callable[..., Any]
    val_batches: Callable[..., Any]
    # model/: the architecture `arch` with this task's head for `nc` classes, and the classes a
    # checkpoint's state dict holds (a resumed run's must equal the data's)
    build_model: Callable[[str, int], Any]
    saved_classes: Callable[[dict], int | None]
    # optim/: the loss of a model's head for cfg's gains, scaled for the world size
    loss: Callable[..., Any]
    # eval/: one validation (every rank; the metrics dict on rank 0), the figures results.csv
    # records of it ((metrics key, column) pairs), the fitness best.pt and patience follow,
    # the epoch line's figures, the per-class table a run ends with
    validate: Callable[..., dict | None]
    metrics: tuple[tuple[str, str], ...]
    fitness: Callable[[dict], float]
    describe: Callable[[dict], str]
    per_class: Callable[[dict, list, list[str]], str]
    # report/: a training batch as loaded (train_batchN.jpg), a validation batch's predictions
    # (val_pred_N.jpg), the plots of the last validation, the drawer of val_batchN_*.jpg
    draw_train_batch: Callable[..., None]
    draw_predictions: Callable[..., int]
    val_plots: Callable[..., Any]
    batch_drawer: Callable[..., Any]
    # a trained model's commands: `hpcyolo val` (metrics of weights on a split), `hpcyolo predict`
    # (the task's outputs per image), `hpcyolo export` (the task's ONNX output layout); each takes
    # the weights as read (model/weights.py maps an ultralytics checkpoint by its records)
    evaluate: Callable[..., dict | None]
    predict: Callable[..., list]
    export: Callable[..., dict]
    # why the task cannot train the architecture `arch` (yolov8n ...), or None: asked before a file is written
    untrainable: Callable[[str], str | None] = lambda arch: None
    # why the run's checkpoint `state` cannot go on with this data beyond its classes (pose: another
    # kpt_shape), or None: one line, never load_state_dict's list of the tensors that do not fit
    unresumable: Callable[[dict], str | None] = lambda state: None
    # whether its validation can take an end2end head's detections without NMS (train.end2end, YOLO26's)
    nms_free: bool = True
    # its datasets: True, a folder of class folders (classify: train/CLASS/*.jpg, val/CLASS/*.jpg, the
    # class an image's folder); False, a data YAML with a label file per image
    folders: bool = False
    # report/: a new run's training labels as ultralytics' labels.jpg draws them (labels, names, path), or None
    draw_labels: Callable[..., None] | None = None
    # the task as a data YAML's own keys shape it (pose: kpt_shape, flip_idx, kpt_oks_sigmas): (task, the
    # DataSpec) -> the task whose parts take them; raises where the data cannot be this task's; None: as it is
    for_data: Callable[[Task, Any], Task] | None = None

    def with_data(self, spec) -> Task:
        """This task for the data YAML `spec` (common/datayaml.py DataSpec): see `for_data`."""
        return self if self.for_data is None else self.for_data(self, spec)

    @property
    def not_validated(self) -> dict:
        """The figures of an epoch with no validation (val off, or no
        validation images), as ultralytics writes them: zeros."""
        return {key: 0.0 for key, _ in self.metrics}


def for_weights(path: str):
    """(the task of the weights in `path`, the weights as read): what a file
    of ours or ultralytics' says it was trained for."""
    from ..model.weights import read_weights

    weights = read_weights(path)
    return load(weights.task), weights


def load(name: str) -> Task:
    """The task named `name` (one of common/registry.py's TASKS)."""
    if name not in TASKS:
        raise ValueError(f"no task {name!r}; hpcyolo trains {', '.join(TASKS)}")
    return importlib.import_module(f"{__package__}.{name}.task").TASK
