"""The trainer's settings, each stated once: its default, its doc and its check.

A setting that a job spec or site config has (train.epochs, checkpoint.keep,
preemption.signal, ...) takes all three from that schema field
(hpcyolo.config); the others are stated here. From this one table come:

- the trainer's config (hpcyolo_trainer.config.TrainConfig): its defaults
  and docs;
- the options of `hpcyolo train` (hpcyolo.cli): names, defaults, help
  texts and value checks;
- check_train: what `hpcyolo train` used directly checks across settings,
  with the job spec's words (the global batch over the world size).

tests/test_knobs.py ties the three together. No torch and no click here:
`hpcyolo --help` reads this table.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Callable

from .config import Checkpoint, Data, PreemptionSite, Run, Train, check_non_negative, check_positive
from .errors import HpcyoloError


class OptionError(HpcyoloError):
    """A bad value of a command-line option: one line naming the option, exit 2
    as for a bad key in a job spec."""

    exit_code = 2


@dataclass(frozen=True)
class Knob:
    name: str  # TrainConfig's field, and the key in the run's config.yaml
    flag: str | None  # the option of `hpcyolo train` ("--cosine/--linear" for a switch); None: no option
    source: tuple[type, str] | None = None  # the schema field that states default, doc and check
    default: Any = None  # the rest: where there is no schema field
    type: Any = None
    doc: str = ""
    check: Callable[[Any], None] | None = None
    help: str | None = None  # the option's help, where the doc speaks of the job spec's keys
    path: str | None = None  # "file": the option names an existing file; "folder": a folder

    def _field(self) -> dataclasses.Field:
        cls, name = self.source
        return {f.name: f for f in dataclasses.fields(cls)}[name]

    @property
    def value_default(self) -> Any:
        return self._field().default if self.source else self.default

    @property
    def value_type(self) -> Any:
        """The Python type of a value, without None and Literal: int, str, ..."""
        tp = typing.get_type_hints(self.source[0])[self.source[1]] if self.source else self.type
        return plain_type(tp)

    @property
    def choices(self) -> tuple | None:
        """The values a Literal field allows, else None."""
        if not self.source:
            return None
        tp = typing.get_type_hints(self.source[0])[self.source[1]]
        args = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
        return typing.get_args(args[0]) if typing.get_origin(args[0]) is typing.Literal else None

    @property
    def value_doc(self) -> str:
        return self._field().metadata["doc"] if self.source else self.doc

    @property
    def value_check(self) -> Callable[[Any], None] | None:
        return self._field().metadata.get("check") if self.source else self.check

    @property
    def option_help(self) -> str:
        return self.help or self.value_doc

    @property
    def option(self) -> str | None:
        """The option's name as it appears in an error: --cosine for --cosine/--linear."""
        return self.flag.split("/")[0] if self.flag else None

    def field(self) -> Any:
        """TrainConfig's dataclass field for this setting: its default, and its doc as metadata."""
        return dataclasses.field(default=self.value_default, metadata={"doc": self.value_doc})

    def validate(self, value: Any) -> None:
        """Raise OptionError, naming the option, when `value` fails the check."""
        check = self.value_check
        if check is None or value is None:
            return
        try:
            check(value)
        except ValueError as e:
            raise OptionError(f"{self.option or self.name}: {e}") from None


def _is_union(tp: Any) -> bool:
    import types

    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def plain_type(tp: Any) -> Any:
    """int for int | None, str for Literal["a", "b"], ..."""
    if _is_union(tp):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Literal:
        return type(typing.get_args(tp)[0])
    return tp


def check_fraction(value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"must be a fraction in [0, 1], got {value}")


_SCHEDULE = "learning-rate schedule"
# In TrainConfig's order: run_dir and data (required, no default) come first
# and are not here.
KNOBS: tuple[Knob, ...] = (
    Knob("model", "--model", (Train, "model"),
         help="Detector: yolov8n-x or yolo11n-x (n, s, m: the YOLOv8 sizes).  [default: n, or the architecture "
              "of --weights]"),
    Knob("weights", "--weights", (Train, "weights"), path="file",
         help="Start from these weights when the run has no checkpoint to resume: an ultralytics checkpoint "
              "(yolov8n.pt, a best.pt; read without running its pickle) or hpcyolo weights or a checkpoint."),
    Knob("epochs", "--epochs", (Train, "epochs")),
    Knob("batch", "--batch", (Train, "batch")),
    Knob("imgsz", "--imgsz", (Train, "imgsz")),
    Knob("workers", "--workers", (Train, "workers")),
    Knob("seed", "--seed", (Train, "seed")),
    Knob("optimizer", "--optimizer", (Train, "optimizer")),
    Knob("lr0", "--lr0", (Train, "lr0"), help="Initial learning rate.  [default: 0.01 for sgd, 0.001 for adamw]"),
    Knob("lrf", None, default=0.01, type=float, check=check_non_negative,
         doc=f"Final learning rate, as a fraction of lr0 ({_SCHEDULE})."),
    Knob("momentum", None, default=0.937, type=float, check=check_non_negative,
         doc="SGD momentum, or AdamW's beta1."),
    Knob("weight_decay", None, default=5e-4, type=float, check=check_non_negative,
         doc="Weight decay, scaled by the batch over nbs."),
    Knob("warmup_epochs", "--warmup-epochs", default=3.0, type=float, check=check_non_negative,
         doc="Epochs of LR warm-up (at least 100 batches unless 0)."),
    Knob("cosine", "--cosine/--linear", default=False, type=bool, doc="LR decay shape after warm-up."),
    Knob("nbs", "--nbs", (Train, "nbs")),
    Knob("clip_norm", None, default=10.0, type=float, check=check_non_negative,
         doc="Gradients are clipped to this norm (0: not clipped)."),
    Knob("close_mosaic", "--close-mosaic", (Train, "close_mosaic")),
    Knob("mosaic", None, default=1.0, type=float, check=check_fraction,
         doc="Probability of a mosaic of four images in training (until the last close_mosaic epochs)."),
    Knob("multi_scale", "--multi-scale", (Train, "multi_scale")),
    Knob("rect", "--rect/--no-rect", (Train, "rect")),
    Knob("augment", "--augment/--no-augment", default=True, type=bool,
         doc="Training augmentation (mosaic, affine, HSV, flip); off: letterbox only, e.g. to check over-fitting."),
    Knob("cache", "--cache", (Data, "cache"),
         help="Decoded-image cache: none, ram (one per node, in --cache-dir) or disk."),
    Knob("cache_dir", "--cache-dir", default=None, type=str | None, path="folder",
         doc="Node-local folder for image caches (default: RUN_DIR/cache)."),
    Knob("save_every", "--save-every", (Checkpoint, "every_steps")),
    Knob("keep", "--keep", (Checkpoint, "keep")),
    Knob("signal", "--signal", (PreemptionSite, "signal"),
         help="Signal that asks for a checkpoint and a requeue (the site's preemption.signal)."),
    Knob("dist_timeout", "--dist-timeout", (Run, "dist_timeout")),
    Knob("amp", None, default=True, type=bool, doc="Mixed precision, on GPU only."),
    Knob("val_images", None, default=4, type=int, check=check_non_negative,
         doc="Validation images drawn with predictions each epoch."),
    Knob("log_every", None, default=30.0, type=float, check=check_non_negative,
         doc="Seconds between progress lines in batch logs."),
)
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
# The options that `hpcyolo exec` shares with `hpcyolo train` (the run-level ones).
RUN_LEVEL = ("signal", "dist_timeout")


def knob(name: str) -> Any:
    """TrainConfig's field `name`: default and doc from the table."""
    return BY_NAME[name].field()


def defaults() -> dict[str, Any]:
    return {k.name: k.value_default for k in KNOBS}


def batch_problem(batch: int, world: int) -> str | None:
    """Why a global batch does not split over `world` ranks, in the words the
    job spec's train.batch and `hpcyolo train --batch` both use; None if it does."""
    if batch % world:
        return f"must be a multiple of the world size ({world}), got {batch}"
    return None


def check_train(options: dict[str, Any], world: int) -> None:
    """What `hpcyolo train` checks before it imports torch: every setting
    given, through its own check, then the batch over the world size.
    Raises OptionError (one line naming the option, exit 2)."""
    for name, value in options.items():
        if name in BY_NAME:
            BY_NAME[name].validate(value)
    problem = batch_problem(options.get("batch", BY_NAME["batch"].value_default), world)
    if problem:
        raise OptionError(f"--batch: {problem}")


def read_train_argv(words: list[str]) -> dict[str, Any]:
    """The values of a `hpcyolo train` command line (the words after
    `train`), read by this table's flags, without click: how a job's own
    command line is read before it runs (hpcyolo.rundir). --run-dir and
    --data come back as run_dir and data; --check-run is left out."""
    flags: dict[str, tuple[Knob, bool | None]] = {}
    for k in KNOBS:
        if k.flag:
            on, _, off = k.flag.partition("/")
            flags[on] = (k, True if off else None)
            if off:
                flags[off] = (k, False)
    values: dict[str, Any] = {}
    rest = iter(words)
    for word in rest:
        if word in ("--run-dir", "--data"):
            values[word[2:].replace("-", "_")] = next(rest)
        elif word == "--check-run":
            continue
        elif word in flags:
            k, switch = flags[word]
            if switch is not None:
                values[k.name] = switch
            else:
                raw, tp = next(rest), k.value_type
                values[k.name] = tp(raw) if tp in (int, float) else raw
        else:
            raise HpcyoloError(f"not an option of hpcyolo train: {word}")
    return values
