"""Reference figures made by ultralytics itself, for hpcyolo's tests to
compare with. Runs in the benchmark venv (benchmarks/ultralytics_venv.sh)
and imports nothing of hpcyolo:

    /work/bench-ul-venv/bin/python benchmarks/ultralytics_reference.py parameters

`parameters` writes tests/reference/ultralytics/parameters.json: for each
task, family and size, the parameters (sum of numel, frozen ones included)
of the model ultralytics builds from its YAML for training, at its default
classes (80; 1000 for classification), with the ultralytics version."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "reference" / "ultralytics"
FAMILIES = {"yolov8": "yolov8", "yolo11": "yolo11", "yolo26": "yolo26"}
SIZES = "nsmlx"
# task -> (ultralytics' model class, the YAML's suffix, its default classes)
TASKS = {"detect": ("DetectionModel", "", 80), "segment": ("SegmentationModel", "-seg", 80),
         "classify": ("ClassificationModel", "-cls", 1000)}


def parameters() -> dict:
    import ultralytics
    from ultralytics.nn import tasks

    counts: dict = {"ultralytics": ultralytics.__version__, "tasks": {}}
    for task, (cls, suffix, nc) in TASKS.items():
        by_model = counts["tasks"].setdefault(task, {"classes": nc, "models": {}})["models"]
        for family in FAMILIES:
            for size in SIZES:
                with contextlib.redirect_stdout(io.StringIO()):  # its layer table
                    model = getattr(tasks, cls)(f"{family}{size}{suffix}.yaml", nc=nc, verbose=False)
                by_model[f"{family}{size}"] = sum(p.numel() for p in model.parameters())
                print(f"{task} {family}{size}: {by_model[f'{family}{size}']:,}", file=sys.stderr)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["parameters"])
    args = parser.parse_args()
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())  # ultralytics' settings file, not the home's
    OUT.mkdir(parents=True, exist_ok=True)
    if args.what == "parameters":
        path = OUT / "parameters.json"
        path.write_text(json.dumps(parameters(), indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
