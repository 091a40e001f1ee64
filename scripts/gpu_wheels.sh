#!/usr/bin/env bash
# Fetch, on a machine that reaches PyPI, the wheels a GPU machine without a
# package index needs beside its own CUDA PyTorch, into .whl/ (or DIR), for
# scripts/gpu_python.sh to install there without fetching anything:
#
#   bash scripts/gpu_wheels.sh [DIR]        # default .whl (git ignores it)
#
# - setuptools >= 77: hpcyolo's editable install reads its pyproject's license
#   field with it, and a machine's own may be older (below 82: torch's pin);
# - submitit, hpcyolo's dependency that such images lack;
# - ultralytics (the version benchmarks/ultralytics_venv.sh pins) and its
#   ultralytics-thop, for benchmarks/bench_gpu.py's rows of ultralytics. Its
#   other needs (torchvision, opencv, scipy, ...) come with such machines'
#   images; polars (54 MB, more than a device call carries) does not:
#   bench_gpu.py reads ultralytics' results.csv without it.
#
# Target: CPython $GPU_PYTHON_VERSION (default 3.12) on manylinux x86_64, the
# device machines' python; set GPU_PYTHON_VERSION for another. About 2 MB.
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
    "setuptools>=77,<82" "submitit" "ultralytics==$ul_version" "ultralytics-thop>=2"
echo "gpu_wheels: $(find "$dir" -maxdepth 1 -name '*.whl' | wc -l) wheels in $dir ($(du -sh "$dir" | cut -f1)):" >&2
ls "$dir" >&2
