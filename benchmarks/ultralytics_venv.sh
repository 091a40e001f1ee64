#!/usr/bin/env bash
# Build a separate venv with ultralytics, only for benchmarks/bench_loader.py
# (its loader against ours) and benchmarks/ultralytics_reference.py. Never part
# of hpcyolo's own dependencies.
#
#   bash benchmarks/ultralytics_venv.sh [VENV]      # default: /work/bench-ul-venv
#
# torch==2.13.0 (the CPU build these machines carry), ultralytics with
# --no-deps plus the light packages its data module imports, and a stand-in
# `torchvision`: the registry's torchvision wheels cannot load their compiled
# ops against this CPU torch, and ultralytics only needs the distribution's
# version (importlib.metadata, at import), `ops.nms` (at validation/predict,
# never in the training loader) and, for classification, `transforms` (taken
# from the torchvision wheel: pure Python). The stand-in is a dozen lines of plain torch,
# written below into the venv's site-packages with a dist-info so that
# importlib.metadata finds it.
set -euo pipefail
venv=${1:-/work/bench-ul-venv}
python=${PYTHON:-python3}
ul_version=${ULTRALYTICS_VERSION:-8.4.190}

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" numpy opencv-python-headless pillow pyyaml requests psutil polars matplotlib
"${pip[@]}" --no-deps "ultralytics==$ul_version" ultralytics-thop

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# torch 2.13 pairs with torchvision 0.28 (ultralytics' check_torchvision rule: 0.(minor + 15)).
tv_version=0.28.0
rm -rf "$site/torchvision" "$site"/torchvision-*.dist-info
mkdir -p "$site/torchvision" "$site/torchvision-$tv_version.dist-info"
cat > "$site/torchvision/__init__.py" <<PY
"""Stand-in torchvision for benchmarks only (hpcyolo benchmarks/ultralytics_venv.sh):
version metadata and ops.nms in plain torch; transforms and datasets.ImageFolder from torchvision's wheel below."""
__version__ = "$tv_version"
from . import ops  # noqa: E402,F401
PY
cat > "$site/torchvision/ops.py" <<'PY'
"""ops.nms in plain torch (greedy, as torchvision's: highest score first, drop IoU > threshold)."""
import torch


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-12)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    order = scores.argsort(descending=True)
    iou = box_iou(boxes[order], boxes[order])
    keep = torch.ones(len(order), dtype=torch.bool, device=boxes.device)
    for k in range(len(order)):
        if keep[k]:
            keep[k + 1:] &= iou[k, k + 1:] <= iou_threshold
    return order[keep]
PY
cat > "$site/torchvision-$tv_version.dist-info/METADATA" <<PY
Metadata-Version: 2.1
Name: torchvision
Version: $tv_version
Summary: Stand-in for benchmarks (version metadata and ops.nms in plain torch)
PY
# torchvision's transforms are plain Python on Pillow and torch (no compiled op): ultralytics' classify_transforms
# and classify_augmentations build on them (benchmarks/ultralytics_reference.py's classify references). Taken
# from the registry's wheel of the same version, the transforms package, ImageFolder's two modules and the
# utils module they import.
wheel_dir=$(mktemp -d)
"$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps "torchvision==$tv_version" -d "$wheel_dir"
"$venv/bin/python" - "$wheel_dir" "$site" <<'PY'
import sys, zipfile
from pathlib import Path

wheel = next(Path(sys.argv[1]).glob("torchvision-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if (name.startswith("torchvision/transforms/") and "/v2/" not in name) or name in (
                "torchvision/utils.py", "torchvision/datasets/folder.py", "torchvision/datasets/vision.py"):
            z.extract(name, sys.argv[2])
PY
# datasets: ImageFolder alone (ultralytics' ClassificationDataset lists the class folders with it)
echo "from .folder import DatasetFolder, ImageFolder  # noqa: F401" > "$site/torchvision/datasets/__init__.py"
rm -rf "$wheel_dir"
cat >> "$site/torchvision/__init__.py" <<'PY'
from . import datasets, transforms  # noqa: E402,F401  (torchvision's own, from its wheel)
PY
echo "hpcyolo-bench-stand-in" > "$site/torchvision-$tv_version.dist-info/INSTALLER"
: > "$site/torchvision-$tv_version.dist-info/RECORD"

# ultralytics writes its settings file under YOLO_CONFIG_DIR (or the home directory).
YOLO_CONFIG_DIR=$(mktemp -d) "$venv/bin/python" -c \
    'import ultralytics, torchvision; from ultralytics.data.build import build_yolo_dataset, build_dataloader; print("ultralytics", ultralytics.__version__, "torchvision stand-in", torchvision.__version__)'
