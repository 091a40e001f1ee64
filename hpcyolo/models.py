"""The detectors hpcyolo trains, by name: no torch here, so that the CLI and
the job spec can check a name on a login node. hpcyolo_trainer.model builds
them (its MODELS and ALIASES are these; a test keeps the two in step)."""

MODELS = ("yolov8n", "yolov8s", "yolov8m", "yolov8l", "yolov8x", "yolo11n", "yolo11s", "yolo11m", "yolo11l", "yolo11x")
# The sizes hpcyolo offered first, YOLOv8's: weights and runs that say "n" stay YOLOv8n.
ALIASES = {"n": "yolov8n", "s": "yolov8s", "m": "yolov8m"}
CHOICES = MODELS + tuple(ALIASES)
DEFAULT = "n"
