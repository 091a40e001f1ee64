#!/usr/bin/env bash
# Print the python to run GPU work with (tests/gpu, benchmarks/bench_gpu.py),
# making its environment first where needed. Nothing is fetched.
#
#   python=$(bash scripts/gpu_python.sh [BASE_PYTHON])
#
# 1. .venv, when its torch sees CUDA.
# 2. Else a GPU environment on the machine's own CUDA PyTorch: BASE_PYTHON
#    (named: always), or $PYTHON / python3 when its torch sees CUDA. GPU nodes
#    and images often hold such a PyTorch and have no package index. The
#    environment (.venv-gpu, or $HPCYOLO_GPU_VENV) is a venv over that python's
#    packages, hpcyolo installed into it in editable mode, after the wheels in
#    .whl/ (or $HPCYOLO_GPU_WHEELS): what the machine lacks, which
#    scripts/gpu_wheels.sh fetches on a machine that reaches PyPI.
# 3. Else the usual .venv of scripts/setup.sh (a CPU build: GPU tests skip).
#
# Why not `python3 -m venv --system-site-packages` alone: where python3 is
# itself a venv's (as on images that keep PyTorch in /opt/.../.venv), the new
# venv sees the base interpreter's site-packages, not that venv's, and torch
# is gone. A .pth file in the new venv lists the base venv's site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."

sees_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

if [ -x .venv/bin/python ] && sees_cuda .venv/bin/python; then
    echo .venv/bin/python
    exit 0
fi
base=${1:-${PYTHON:-python3}}
if [ -z "${1:-}" ] && ! sees_cuda "$base"; then
    bash scripts/setup.sh --no-system >&2
    echo .venv/bin/python
    exit 0
fi

venv=${HPCYOLO_GPU_VENV:-.venv-gpu}
python=$venv/bin/python
log() { echo "gpu_python: $*" >&2; }
pip() { "$python" -m pip install -q --no-index --no-deps --disable-pip-version-check "$@" >&2; }
if [ ! -x "$python" ]; then
    log "making $venv over $base's packages"
    # Without a pip of its own: ensurepip would also put an old setuptools in
    # front of the base's (Python 3.11 bundles 65, which cannot read our
    # pyproject's license field); the base's pip and setuptools serve.
    "$base" -m venv --system-site-packages --without-pip "$venv" >&2
    # The base's own site-packages when it is a venv (see above); nothing otherwise.
    "$base" - "$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" <<'PY'
import site, sys
from pathlib import Path
if sys.prefix != sys.base_prefix:
    Path(sys.argv[1], "hpcyolo-base-venv.pth").write_text("".join(p + "\n" for p in site.getsitepackages()))
PY
    "$python" -m pip --version >/dev/null 2>&1 || "$python" -m ensurepip >&2
fi
wheels=${HPCYOLO_GPU_WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
    log "installing the wheels in $wheels/ that $venv lacks"
    pip --upgrade "$wheels"/*.whl
fi
if [ ! -x "$venv/bin/hpcyolo" ]; then
    # --no-build-isolation: the build uses the environment's setuptools (>= 77,
    # for the license field; a wheel of it in .whl/ where the machine's is older).
    log "installing hpcyolo (editable) into $venv"
    pip --no-build-isolation -e .
fi
"$python" -c 'import hpcyolo.cli, hpcyolo_trainer, torch' >&2
echo "$python"
