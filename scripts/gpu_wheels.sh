#!/usr/bin/env bash
# Fetch, on a machine that reaches PyPI, the wheels a GPU machine without a
# package index needs beside its own CUDA PyTorch, into .whl/ (or DIR), for
# scripts/gpu_python.sh to install there without fetching anything:
#
#   bash scripts/gpu_wheels.sh [DIR]        # default .whl (git ignores it)
#
# - setuptools >= 77: hpcyolo's editable install reads its pyproject's license
#   field with it, and a machine's own may be older;
# - ultralytics (the version benchmarks/ultralytics_venv.sh pins), its
#   ultralytics-thop and polars (its trainer reads results.csv with it), for
#   benchmarks/bench_gpu.py's row of ultralytics' trainer. Its other needs
#   (torchvision, opencv, scipy, ...) come with such machines' images.
#
# Target: CPython $GPU_PYTHON_VERSION (default 3.12) on manylinux x86_64, the
# device machines' python; set GPU_PYTHON_VERSION for another. About 57 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
version=${GPU_PYTHON_VERSION:-3.12}
ul_version=${ULTRALYTICS_VERSION:-8.4.190}
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
mkdir -p "$dir"
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$version" \
    --implementation cp "${platforms[@]}" -d "$dir" \
    "setuptools>=77" "ultralytics==$ul_version" "ultralytics-thop>=2" "polars" "polars-runtime-32"
echo "gpu_wheels: $(find "$dir" -maxdepth 1 -name '*.whl' | wc -l) wheels in $dir ($(du -sh "$dir" | cut -f1)):" >&2
ls "$dir" >&2
