"""The trainer's settings: one row each, the one place a setting is stated.

From this table come:
- `TrainConfig`, the trainer's frozen config (config.py), saved in every
  checkpoint and as RUN/config.yaml;
- the job spec's `train` and `checkpoint` sections, and the fields of the
  other sections that are trainer settings (`data.cache`, `run.dist_timeout`,
  the site's `preemption.signal`): hpcyolo.login.config takes their default, doc
  and check from here;
- the options of `hpcyolo train` (hpcyolo.cli), and the batch script's
  `hpcyolo train` command line (hpcyolo.login.plan: every setting of the job spec);
- the same-run rule (rundir.py): whether another value makes another run;
- the table of settings in docs/configuration.md (tests/test_settings.py
  compares them).

Adding a setting is one row here plus its use in the trainer. No torch and
nothing of hpcyolo here: the CLI reads this table before it imports torch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable, Literal

from .errors import HpcyoloError, shown
from .record import make_record, record
from .registry import ALIASES, CHOICES, DEFAULT_TASK, FAMILIES, MODELS, SCALES, TASKS, check_imgsz

REQUIRED = dataclasses.MISSING  # a setting without a default: the command line must give it


class OptionError(HpcyoloError):
    """A bad value of a command-line option: one line naming the option, exit 2
    as for a bad key in a job spec."""

    exit_code = 2


# -- value checks: each raises ValueError with the words the user sees -------

SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG")


def check_positive(value: int) -> None:
    if value < 1:
        raise ValueError(f"must be at least 1 (got {value})")


def check_non_negative(value: int | float) -> None:
    if value < 0:
        raise ValueError(f"must not be negative (got {value})")


def check_hours(value: float) -> None:
    if not value > 0:
        raise ValueError(f"must be a number of hours above 0 (0.5: half an hour), got {value}")


def check_fraction(value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"must be a fraction in [0, 1], got {value}")


def check_multi_scale(value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"must be a fraction in [0, 1) (0.5: sizes from half to 1.5 times imgsz), got {value}")


def check_share(value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1], got {value}")


def check_degrees(value: float) -> None:
    if not 0 <= value <= 180:
        raise ValueError(f"must be in [0, 180] degrees, got {value}")


def check_scale(value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"must be in [0, 1) (the gain is 1 +/- scale), got {value}")


def check_classes(value: tuple[int, ...]) -> None:
    if not value:
        raise ValueError("must name at least one class id (leave it empty for all classes)")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in value):
        raise ValueError(f"must be class ids from 0, got {list(value)}")


def parse_classes(text: str) -> tuple[int, ...]:
    """`0,2` -> (0, 2): the command line's spelling of a list of class ids."""
    try:
        return tuple(int(word) for word in text.replace(" ", "").split(","))
    except ValueError:
        raise ValueError(f"must be class ids separated by commas (0,2), got {shown(text)}") from None


def check_signal(value: str) -> None:
    if value not in SIGNALS:
        raise ValueError(f"{shown(value)} is not a signal hpcyolo handles; use one of {', '.join(SIGNALS)}")


# -- the table -----------------------------------------------------------------

@record(kw_only=False)
class Setting:
    """One row of the table: a setting of the trainer, everywhere it appears."""

    name: str  # TrainConfig's field, and the key in the run's config.yaml
    default: Any
    type: Any  # as annotated: int, str | None, Literal["sgd", "adamw"], ...
    doc: str
    same_run: bool  # another value makes another run (rundir: a run is continued only by the same run)
    why: str  # why it does, or why it may differ from one start of a run to the next
    check: Callable[[Any], None] | None = None
    key: str | None = None  # the job spec's key ("site:" for the site config's), where it has one
    flag: str | None = None  # the option of `hpcyolo train` ("--cos-lr/--no-cos-lr" for a switch)
    help: str | None = None  # the option's help, where the doc speaks of the job spec's words
    path: str | None = None  # "file": an existing file; "file-name": a file's path; "folder": a folder's
    compare: Callable[[dict], object] | None = None  # the value compared by the same-run rule, where not the raw one
    alias: str | None = None  # an older spelling of the option that still works ("--cosine/--linear")
    parse: Callable[[str], Any] | None = None  # the option's text to a value, where not click's own type

    @property
    def value_type(self) -> Any:
        """The Python type of a value, without None and Literal: int, str, ..."""
        return plain_type(self.type)

    @property
    def choices(self) -> tuple | None:
        """The values a Literal type allows, else None."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)] if _is_union(self.type) else [self.type]
        return typing.get_args(args[0]) if typing.get_origin(args[0]) is Literal else None

    @property
    def option(self) -> str | None:
        """The option's name as it appears in an error: --cos-lr for --cos-lr/--no-cos-lr."""
        return self.flag.split("/")[0] if self.flag else None

    @property
    def option_help(self) -> str:
        return self.help or self.doc

    def of(self, config: dict) -> object:
        """The value the same-run rule compares in a config.yaml's `config`."""
        return self.compare(config) if self.compare else config.get(self.name, self.default)

    def validate(self, value: Any) -> None:
        """Raise OptionError, naming the option, when `value` fails the check."""
        if self.check is None or value is None:
            return
        try:
            self.check(value)
        except ValueError as e:
            raise OptionError(f"{self.option or self.name}: {e}") from None


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def plain_type(tp: Any) -> Any:
    """int for int | None, str for Literal["a", "b"], ..."""
    if _is_union(tp):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is Literal:
        return type(typing.get_args(tp)[0])
    return tp


def _model(config: dict) -> str | None:
    """n -> yolov8n; no model and no weights is the default one; with
    weights, None stands for their architecture."""
    from .registry import DEFAULT

    name = config.get("model") or (None if config.get("weights") else DEFAULT)
    return ALIASES.get(name, name)


def _dataset(config: dict) -> str:
    from .stagedcopy import dataset_of

    return config.get("dataset") or dataset_of(config["data"])


def _path(config: dict, key: str) -> str | None:
    import os

    return os.path.abspath(config[key]) if config.get(key) else None


_FAMILIES = ", ".join(f"{family}{SCALES[0]}-{SCALES[-1]}" for family in FAMILIES)  # yolov8n-x, yolo11n-x, ...
_ALIASES = ", ".join(ALIASES)
_SCHEDULE = "the learning-rate schedule: a resumed run is the run it continues, exactly"
_AUGMENT = "the augmentation of each epoch"
_CACHE = "where decoded images are kept: the node's"
_LOSS = "the loss every step minimises"
S = Setting


def U(name: str, default: Any, type_: Any, doc: str, same_run: bool, why: str, check=None, **more) -> Setting:
    """A setting of ultralytics' trainer, by its name: the job spec's
    train.NAME and `hpcyolo train --NAME` (underscores as dashes; a switch
    --NAME/--no-NAME), with ultralytics' default and meaning."""
    dashed = "--" + name.replace("_", "-")
    flag = f"{dashed}/--no-{name.replace('_', '-')}" if type_ is bool else dashed
    return Setting(name, default, type_, doc, same_run, why, check, key=f"train.{name}", flag=flag, **more)


# In TrainConfig's order.
SETTINGS: tuple[Setting, ...] = (
    S("run_dir", REQUIRED, str, "Run directory (shared).", False, "the same directory, however it is spelled",
      flag="--run-dir", path="folder"),
    S("data", REQUIRED, str, "Ultralytics-style data YAML (path, train, val, names; for train.task pose also kpt_shape, "
      "and flip_idx for the flips), or for train.task classify a folder of "
      "train/CLASS/*.jpg and val/CLASS/*.jpg; relative to this file.", True,
      "the images and classes the weights learnt; the results would mix two datasets (compared as the dataset: a "
      "staged copy stands for its source)", key="data.yaml", flag="--data", path="file-name", help="Data YAML (classify: a folder of class folders).",
      compare=_dataset),
    S("task", DEFAULT_TASK, Literal[TASKS], f"The task, as ultralytics names it: {', '.join(TASKS)}.", True,
      "its model's head, labels and checkpoints are the task's", key="train.task", flag="--task"),
    S("model", None, Literal[CHOICES] | None, f"Detector: {', '.join(MODELS)} ({_ALIASES}: the YOLOv8 sizes); "
      "empty: n, or the architecture of train.weights; with train.task segment, classify, obb or pose, that model's "
      "-seg, -cls, -obb or -pose form.", True, "the checkpoints hold this architecture's weights",
      key="train.model", flag="--model", compare=_model,
      help=f"Detector: {_FAMILIES} ({_ALIASES}: the YOLOv8 sizes).  [default: n, or the architecture of --weights]"),
    S("weights", None, str | None, "Start from these weights: an ultralytics checkpoint (read without running its "
      "pickle) or hpcyolo weights/checkpoint; relative to this file. A run's own checkpoint, when it resumes, wins.",
      True, "the run's starting point", key="train.weights", flag="--weights", path="file",
      compare=lambda c: _path(c, "weights"),
      help="Start from these weights when the run has no checkpoint to resume: an ultralytics checkpoint "
           "(yolov8n.pt, a best.pt; read without running its pickle) or hpcyolo weights or a checkpoint."),
    S("epochs", 100, int, "Epochs to train.", False, "raising it trains the run further (a finished one too): the "
      "learning rate then decays to the new end from where the run is, and the last close_mosaic epochs move with it",
      check_positive, key="train.epochs", flag="--epochs"),
    U("time", None, float | None, "Hours the run trains, counted across its jobs and requeues; overrides epochs: "
      "after each epoch the run plans ceil(time / its mean epoch time) epochs (the learning-rate decay and "
      "close_mosaic follow the plan), and it stops, mid-epoch if need be, leaving room for its final validation "
      "and weights inside the budget; empty: epochs decides.", False, "how long the run trains: raising it trains "
      "the run further (a finished one too), as epochs does", check_hours),
    S("batch", 16, int, "Global batch size, split evenly over all ranks (more than 16 ranks: set a multiple of "
      "them).", True, "the global batch sets the steps "
      "per epoch: a checkpoint's place in its epoch would stand for other images", check_positive,
      key="train.batch", flag="--batch"),
    S("imgsz", 640, int, "Training image size (pixels, a multiple of 32).", True, "the size the weights were "
      "trained and measured at", check_imgsz, key="train.imgsz", flag="--imgsz"),
    S("workers", 8, int, "Data-loader worker processes per rank, at most the CPUs the rank may run on (a GPU "
      "rank: shared with the other ranks on its node that may run on them too); 0: load in the training process.",
      False, "loader processes per rank: the hardware's", check_non_negative, key="train.workers", flag="--workers"),
    S("seed", 0, int, "Random seed (each rank derives its own from it).", True, "the order of the images and the "
      "augmentation drawn in every epoch", check_non_negative, key="train.seed", flag="--seed"),
    S("optimizer", "auto", Literal["sgd", "adamw", "musgd", "auto"], "Optimizer: sgd, adamw, musgd (ultralytics' "
      "MuSGD, YOLO26's: Muon-orthogonalised plus SGD updates for matrices and conv filters, SGD for the rest) or "
      "auto (ultralytics' rule: musgd at lr0 0.01 beyond 10,000 steps of max(batch, nbs) images, else adamw at lr0 "
      "0.002 x 5 / (4 + classes); momentum 0.9, warmup_bias_lr 0, lr0 ignored).", True,
      "the checkpoint holds this optimizer's state", key="train.optimizer", flag="--optimizer"),
    S("lr0", None, float | None, "Initial learning rate; empty: 0.01 for sgd and musgd, 0.001 for adamw.", True,
      _SCHEDULE, check_non_negative, key="train.lr0", flag="--lr0",
      help="Initial learning rate.  [default: 0.01 for sgd and musgd, 0.001 for adamw]"),
    U("lrf", 0.01, float, "Final learning rate, as a fraction of lr0.", True, _SCHEDULE, check_fraction),
    U("momentum", 0.937, float, "SGD (and MuSGD) momentum, or AdamW's beta1.", True, _SCHEDULE, check_fraction),
    U("weight_decay", 5e-4, float, "Weight decay, scaled by the batch over nbs.", True, _SCHEDULE, check_fraction),
    U("warmup_epochs", 3.0, float, "Epochs of LR warm-up (at most all but the last epoch).", True, _SCHEDULE,
      check_non_negative),
    U("warmup_momentum", 0.8, float, "Momentum at the start of the warm-up, rising to momentum.", True, _SCHEDULE,
      check_fraction),
    U("warmup_bias_lr", 0.1, float, "Learning rate of the biases at the start of the warm-up, falling to lr0.", True,
      _SCHEDULE, check_fraction),
    U("cos_lr", False, bool, "Cosine learning-rate decay after the warm-up; off: linear.", True, _SCHEDULE,
      alias="--cosine/--linear", compare=lambda c: c.get("cos_lr", c.get("cosine", False))),
    U("box", 7.5, float, "Gain of the box (CIoU) loss.", True, _LOSS, check_non_negative),
    U("cls", 0.5, float, "Gain of the classification (BCE) loss.", True, _LOSS, check_non_negative),
    U("dfl", 1.5, float, "Gain of the distribution focal loss (YOLO26: of its L1 box loss).", True, _LOSS,
      check_non_negative),
    U("pose", 12.0, float, "Keypoints (train.task pose): gain of the keypoint location (OKS) loss.", True, _LOSS,
      check_non_negative),
    U("kobj", 1.0, float, "Keypoints: gain of the keypoint visibility (BCE) loss.", True, _LOSS, check_non_negative),
    U("rle", 1.0, float, "Keypoints, YOLO26: gain of the residual log-likelihood (RLE) loss.", True, _LOSS,
      check_non_negative),
    U("overlap_mask", True, bool, "Segmentation: an image's ground-truth masks as one map, each smaller instance "
      "drawn over the larger ones; off: one mask per instance.", True, _LOSS),
    U("mask_ratio", 4, int, "Segmentation: the ground-truth masks at 1/mask_ratio of the image's side (4: the "
      "prototypes' resolution).", True, _LOSS, check_positive),
    S("nbs", 64, int, "Nominal batch: gradients accumulate until about this many images per step.", True,
      "gradient accumulation, and the scale of the weight decay", check_positive, key="train.nbs", flag="--nbs"),
    S("clip_norm", 10.0, float, "Gradients are clipped to this norm (0: not clipped).", True, "the size of every step",
      check_non_negative),
    S("close_mosaic", 10, int, "Train the last N epochs without mosaic.", True, _AUGMENT, check_non_negative,
      key="train.close_mosaic", flag="--close-mosaic"),
    U("mosaic", 1.0, float, "Probability of a mosaic of four images in training (until the last close_mosaic "
      "epochs).", True, _AUGMENT, check_fraction),
    U("hsv_h", 0.015, float, "Hue jitter: a fraction of the hue circle, +/-.", True, _AUGMENT, check_fraction),
    U("hsv_s", 0.7, float, "Saturation jitter: gain 1 +/- this.", True, _AUGMENT, check_fraction),
    U("hsv_v", 0.4, float, "Value (brightness) jitter: gain 1 +/- this.", True, _AUGMENT, check_fraction),
    U("degrees", 0.0, float, "Rotation, +/- degrees.", True, _AUGMENT, check_degrees),
    U("translate", 0.1, float, "Translation, +/- this fraction of the image size.", True, _AUGMENT, check_fraction),
    U("scale", 0.5, float, "Scale gain 1 +/- this.", True, _AUGMENT, check_scale),
    U("shear", 0.0, float, "Shear, +/- degrees.", True, _AUGMENT, check_degrees),
    U("perspective", 0.0, float, "Perspective warp: +/- this in the warp's bottom row (0-0.001 is the usual range).",
      True, _AUGMENT, check_fraction),
    U("flipud", 0.0, float, "Probability of an upside-down flip.", True, _AUGMENT, check_fraction),
    U("fliplr", 0.5, float, "Probability of a left-right flip.", True, _AUGMENT, check_fraction),
    U("mixup", 0.0, float, "Probability of blending a sample with a second one (both sets of boxes kept), while "
      "mosaics are on.", True, _AUGMENT, check_fraction),
    U("cutmix", 0.0, float, "Probability of pasting a rectangle of a second sample (and its boxes there) where no "
      "box is, while mosaics are on.", True, _AUGMENT, check_fraction),
    U("copy_paste", 0.0, float, "Share of the pasted instances' candidates pasted into each training sample, while "
      "mosaics are on: those covering less than 0.3 of every box already there, the least overlapping first. "
      "Needs instance outlines: polygon label rows (x1 y1 x2 y2 ...); with box rows nothing is pasted (one warning "
      "says so), as in ultralytics.", True, _AUGMENT, check_fraction),
    U("copy_paste_mode", "flip", Literal["flip", "mixup"], "Where pasted instances come from: flip, the sample "
      "itself mirrored left-right (between the mosaic and the warp); mixup, a second sample made the same way "
      "(mosaic and warp), pasted after the warp.", True, _AUGMENT),
    U("auto_augment", "randaugment", Literal["randaugment", "none"], "Classification: randaugment, torchvision's "
      "RandAugment (2 operations an image at magnitude 9 of 31) in place of the colour jitter (hsv_h, hsv_s, "
      "hsv_v), as ultralytics' default; none: the colour jitter (ultralytics' augmix and autoaugment are not "
      "built).", True, _AUGMENT),
    U("erasing", 0.4, float, "Classification: probability of erasing a random rectangle (2-33% of the image, "
      "filled with 0) of a training image, as ultralytics' random erasing.", True, _AUGMENT, check_fraction),
    U("bgr", 0.0, float, "Probability of swapping the colour channels (RGB to BGR).", True, _AUGMENT, check_fraction),
    U("dropout", 0.0, float, "Classification: probability of zeroing each of the head's 1280 pooled features "
      "before its linear layer while training, as ultralytics' dropout; other tasks' models have no dropout.", True,
      "the steps of the classifier's training", check_fraction),
    S("multi_scale", 0.0, float, "Multi-scale training: each step's image size drawn from imgsz x [1 - f, 1 + f], a "
      "multiple of 32, the same on every rank; 0: off.", True, "the image size of every step", check_multi_scale,
      key="train.multi_scale", flag="--multi-scale"),
    S("rect", False, bool, "Rectangular training batches: images sorted by aspect ratio, each batch letterboxed to "
      "its own shape; no mosaic and no affine augmentation.", True, "the batches of every epoch (rectangular ones "
      "are other images together)", key="train.rect", flag="--rect/--no-rect"),
    S("augment", True, bool, "Training augmentation (mosaic, affine, HSV, flip); off: letterbox only, e.g. to check "
      "over-fitting.", True, _AUGMENT, flag="--augment/--no-augment"),
    S("cache", "none", Literal["none", "ram", "disk"], "Decoded-image cache: none, ram (one per node), disk.", False,
      _CACHE, key="data.cache", flag="--cache",
      help="Decoded-image cache: none, ram (one per node, in --cache-dir) or disk."),
    S("cache_dir", None, str | None, "Node-local folder for image caches (default: RUN_DIR/cache).", False, _CACHE,
      flag="--cache-dir", path="folder"),
    S("save_every", 0, int, "Also checkpoint every N optimizer steps; 0: at the end of each epoch only.", False,
      "how often a checkpoint is written", check_non_negative, key="checkpoint.every_steps", flag="--save-every"),
    S("keep", 3, int, "How many recent checkpoints to keep.", False, "how many checkpoints are kept", check_positive,
      key="checkpoint.keep", flag="--keep"),
    S("signal", "USR2", str, "Signal Slurm sends before the time limit; hpcyolo checkpoints on it.", False,
      "the site's preemption signal", check_signal, key="site:preemption.signal", flag="--signal",
      help="Signal that asks for a checkpoint and a requeue (the site's preemption.signal)."),
    S("dist_timeout", 600, int, "Seconds a collective may wait before the job gives up (hang protection).", False,
      "how long a collective may wait", check_positive, key="run.dist_timeout", flag="--dist-timeout"),
    S("hang_factor", 10.0, float, "The hang watchdog: a step (or a validation, a checkpoint) taking more than this "
      "many times the median of its kind so far in the job ends the job (exit 79) with every rank's stacks in "
      "RUN/hangs/ and the rank that did not arrive named; a job's first steps, first validation and first "
      "checkpoint have run.hang_cold instead; 0: off.", False, "when a hung job is ended", check_non_negative,
      key="run.hang_factor", flag="--hang-factor"),
    S("hang_min", 60.0, float, "The hang watchdog's floor: no step or phase is called hung before this many "
      "seconds.", False, "when a hung job is ended", check_positive, key="run.hang_min", flag="--hang-min"),
    S("hang_cold", 300.0, float, "The hang watchdog's bound for what it has not timed yet in this job (its first "
      "steps, first validation and first checkpoint; a validation counts from its latest batch): generous, as a "
      "cold start compiles, warms caches and reads data for the first time; 0: those are left to dist_timeout.",
      False, "when a hung job is ended", check_non_negative, key="run.hang_cold", flag="--hang-cold"),
    S("straggler_every", 50, int, "Every this many optimizer steps the ranks share their data wait and forward "
      "time (one all-gather of two numbers); 0: off.", False, "how often slow ranks are looked for",
      check_non_negative, key="run.straggler_every", flag="--straggler-every"),
    S("straggler_margin", 0.25, float, "A rank slower than the ranks' median by more than this share, 3 intervals "
      "in a row, is named in the log (host, rank, data or compute) and recorded in RUN/stragglers.csv.", False,
      "which ranks are named as slow", check_non_negative, key="run.straggler_margin", flag="--straggler-margin"),
    U("amp", True, bool, "Mixed precision, on GPU only.", True, "the arithmetic of every step"),
    U("channels_last", True, bool, "On a GPU, the model's weights and batches in channels_last (NHWC) memory "
      "format, as ultralytics trains there (its channels_last: null); off: NCHW. The CPU trains NCHW either way.",
      False, "the memory layout of the same arithmetic"),
    U("fraction", 1.0, float, "Train on this fraction of the training images: the first of them in file-name "
      "order, the same on every rank and after a resume.", True, "the images trained on", check_share),
    U("single_cls", False, bool, "Train every class as one, named item (ultralytics' single_cls): a detector of "
      "objects, not of their kinds.", True, "the classes the weights learn"),
    U("classes", None, tuple[int, ...] | None, "Train on these classes only (the data YAML's ids: [0, 2] in the job "
      "spec, --classes 0,2): the other classes' boxes are dropped from training and validation, their images stay "
      "as background, as in ultralytics; empty: all.", True, "the classes the weights learn", check_classes,
      parse=parse_classes),
    U("freeze", None, int | None, "Freeze the first N layers (ultralytics' layer numbers: 10 is YOLOv8's or YOLO11's "
      "backbone): their weights stay as they are (BatchNorm statistics still follow the data, as in ultralytics).",
      True, "which weights train", check_non_negative),
    U("patience", 100, int, "Stop early after this many epochs without a better fitness (as ultralytics 8.4 "
      "measures it: mAP50-95, an OBB model's of its rotated boxes; a segmentation's, the boxes' plus the masks'; a "
      "keypoint model's, the boxes' plus the keypoints' (by OKS); a classifier's, the mean of top-1 and "
      "top-5), decided on every rank at once; 0: never.", False, "when the run stops early", check_non_negative),
    U("save_period", -1, int, "Also keep the weights of every Nth epoch as weights/epochE.pt (E counted from 0, as "
      "ultralytics names them); below 1: off.", False, "which epochs' weights are kept"),
    S("end2end", False, bool, "Validate each epoch with YOLO26's one-to-one head, NMS-free (ultralytics' "
      "nms=False; detectors, segmenters, OBB and keypoint models); off: its one-to-many head and NMS, as ultralytics validates by default.", True,
      "best.pt is the best epoch by this measure", key="train.end2end", flag="--end2end/--nms"),
    S("cfg", None, str | None, "An ultralytics recipe: an args.yaml or hyperparameter YAML; its settings are "
      "taken where the job spec (or the command line) does not give them, keys with no meaning here are listed, "
      "training settings hpcyolo lacks are refused; relative to this file.", False, "where the recipe came from (its "
      "values are compared, as the settings they set)", key="train.cfg", flag="--cfg", path="file"),
    U("val", True, bool, "Validate every epoch; off: only the last (the planned end, the time budget's), as "
      "ultralytics' val=False: the other epochs' result rows hold zeros for P, R and mAP, best.pt is "
      "the last epoch's, and patience never stops the run.", False, "which epochs are validated"),
    S("val_images", 4, int, "Validation images drawn with predictions each epoch.", False,
      "how many validation images are drawn", check_non_negative),
    U("plots", True, bool, "Draw ultralytics' plots into the run directory (rank 0, on a thread beside the loop): "
      "labels.jpg and train_batch0..2.jpg at a new run's start; from the last validation confusion_matrix.png and "
      "confusion_matrix_normalized.png, BoxPR/F1/P/R_curve.png, val_batchN_labels.jpg and val_batchN_pred.jpg.",
      False, "what is drawn beside the run"),
    S("tensorboard", True, bool, "TensorBoard event files in the run directory's tensorboard/, written by rank 0 "
      "off the training loop: each epoch's results (every column) and the learning rate of each parameter group, "
      "the running training losses every 10 optimizer steps, the plots at the end; a requeued run continues the "
      "same curves (`tensorboard --logdir RUN` on a login node).", False, "what is logged beside the run",
      key="train.tensorboard", flag="--tensorboard/--no-tensorboard"),
    S("mlflow", None, str | None, "MLflow tracking (pip install 'hpcyolo[mlflow]'): `local` logs to a store in the "
      "run directory (RUN/mlruns; `mlflow ui --backend-store-uri RUN/mlruns` on a login node), anything else is a "
      "tracking URI; the resolved config, world size and Slurm job ids once, every column of each epoch's "
      "results, the plots at the end; a requeued job continues the same MLflow run; empty: off.", False,
      "what is logged beside the run", key="train.mlflow", flag="--mlflow"),
    S("wandb", None, str | None, "Weights & Biases in offline mode (pip install 'hpcyolo[wandb]'): the project "
      "name; the run is written into RUN/wandb with no network use (WANDB_MODE=online in the environment logs live), "
      "what MLflow gets, and the run's end prints the `wandb sync` command for a login node; a requeued job "
      "continues the same W&B run; empty: off.", False, "what is logged beside the run", key="train.wandb",
      flag="--wandb"),
    S("log_every", 30.0, float, "Seconds between progress lines in batch logs.", False,
      "how often progress is logged", check_non_negative),
)
del S
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS if s.key}
SAME_RUN: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.same_run)
# The options that `hpcyolo exec` shares with `hpcyolo train` (the run-level ones).
RUN_LEVEL = ("run_dir", "data", "signal", "dist_timeout")


def batch_problem(batch: int, world: int) -> str | None:
    """Why a global batch does not split over `world` ranks, in the words the
    job spec's train.batch and `hpcyolo train --batch` both use; None if it does."""
    if batch % world:
        default = " (the default)" if batch == BY_NAME["batch"].default else ""
        return f"must be a multiple of the world size ({world}), got {batch}{default}"
    return None


def check_train(options: dict[str, Any], world: int) -> None:
    """What `hpcyolo train` checks before it imports torch: every setting
    given, through its own check, then the batch over the world size.
    Raises OptionError (one line naming the option, exit 2)."""
    for name, value in options.items():
        if name in BY_NAME:
            BY_NAME[name].validate(value)
    problem = batch_problem(options.get("batch", BY_NAME["batch"].default), world)
    if problem:
        raise OptionError(f"--batch: {problem}")


def _train_config_methods() -> dict:
    def learning_rate(self) -> float:
        return self.lr0 if self.lr0 is not None else (0.001 if self.optimizer == "adamw" else 0.01)

    def to_dict(self) -> dict:
        """The fields, as YAML writes them (a tuple as a list)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    return {"learning_rate": property(learning_rate), "to_dict": to_dict,
            "__doc__": "The trainer's configuration: one field per row of hpcyolo_trainer.common.settings, in its order."}


TrainConfig = make_record(
    "TrainConfig",
    [(s.name, s.type) if s.default is REQUIRED else
     (s.name, s.type, dataclasses.field(default=s.default, metadata={"doc": s.doc})) for s in SETTINGS],
    namespace={**_train_config_methods(), "__module__": __name__})


def markdown() -> str:
    """The table of the settings in docs/configuration.md (tests/test_settings.py
    keeps that copy equal to this)."""
    rows = ["| setting | `hpcyolo train` | job spec | default | another value | what it does |",
            "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = "required" if s.default is REQUIRED else "empty" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.name}` | {f'`{s.flag}`' if s.flag else ''} | {f'`{s.key}`' if s.key else ''} | {default} "
                    f"| {'another run' if s.same_run else 'the same run'} | {s.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
