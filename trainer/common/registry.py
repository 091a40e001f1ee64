"""The tasks and detectors hpcyolo trains, by name: no torch here, so that the CLI and
the job spec can check a name on a login node. Each family is one module of
hpcyolo_trainer.model.families (its sizes, body, ultralytics layer map); adding a
family is that module, and its name and published parameter counts here."""

# The tasks hpcyolo trains, as ultralytics names them (train.task, --task): each
# is a folder of hpcyolo_trainer.tasks; adding one is that folder and its name here.
TASKS = ("detect", "segment", "classify", "obb", "pose")
DEFAULT_TASK = "detect"
# The tasks whose dataset is a folder of class folders (train/CLASS/*.jpg), not a data YAML
# with label files (each task's Task.folders says the same; a test holds them together).
FOLDER_TASKS = ("classify",)
# The model class an ultralytics checkpoint pickles, by task: how a file says what it holds.
ULTRALYTICS_MODELS = {"DetectionModel": "detect", "SegmentationModel": "segment", "ClassificationModel": "classify",
                      "PoseModel": "pose", "OBBModel": "obb"}

FAMILIES = ("yolov8", "yolo11", "yolo26")
SCALES = ("n", "s", "m", "l", "x")  # every family's sizes (a test holds each family module to them)
MODELS = tuple(f"{family}{scale}" for family in FAMILIES for scale in SCALES)
# The sizes hpcyolo offered first, YOLOv8's: weights and runs that say "n" stay YOLOv8n.
ALIASES = {"n": "yolov8n", "s": "yolov8s", "m": "yolov8m"}
CHOICES = MODELS + tuple(ALIASES)  # what train.model and --model take
DEFAULT = "n"
# Parameters at nc=80 as ultralytics prints them, by family and scale (each
# family module names its own; here, without torch, for `hpcyolo doctor`'s
# checkpoint size).
PUBLISHED_PARAMETERS = {
    "yolov8": {"n": 3_157_200, "s": 11_166_560, "m": 25_902_640, "l": 43_691_520, "x": 68_229_648},
    "yolo11": {"n": 2_624_080, "s": 9_458_752, "m": 20_114_688, "l": 25_372_160, "x": 56_966_176},
    "yolo26": {"n": 2_572_280, "s": 10_009_784, "m": 21_896_248, "l": 26_299_704, "x": 58_993_368},
}

# Every detector here downsamples by 32 at its coarsest level: a side that is
# not a multiple of it breaks the concatenation of upsampled and skip features
# (a RuntimeError deep in the neck). Ultralytics rounds up with a warning;
# hpcyolo refuses, so that the size trained is the size asked for.
MAX_STRIDE = 32
MAX_IMGSZ = 8192  # 8192 px a side is 164 times the pixels of 640: beyond that, a typo


def check_imgsz(value: int) -> None:
    """The one check of an image size, for the job spec and every command
    that takes --imgsz; raises ValueError naming the nearest valid sizes."""
    if value < MAX_STRIDE:
        raise ValueError(f"must be at least {MAX_STRIDE} (got {value}); 640 is the usual size")
    if value > MAX_IMGSZ:
        raise ValueError(f"must be at most {MAX_IMGSZ} (got {value})")
    if value % MAX_STRIDE:
        below = value // MAX_STRIDE * MAX_STRIDE
        raise ValueError(f"must be a multiple of {MAX_STRIDE} (the models' largest stride), got {value}: "
                         f"use {below} or {below + MAX_STRIDE}")
