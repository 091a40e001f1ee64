#!/usr/bin/env bash
# Run the GPU test suite (tests/gpu) on a machine with an NVIDIA GPU.
#
#   bash scripts/test_gpu.sh [pytest arguments]
#
# Python: .venv when its torch sees CUDA; else, where the machine's python3
# already holds a CUDA build of PyTorch (GPU nodes and images often do, and
# may have no package index), .venv-gpu on top of it (--system-site-packages)
# with hpcyolo installed in editable mode without fetching anything; else the
# usual .venv of scripts/setup.sh (a CPU build: the suite then skips itself).
# Wheels in .whl/ (hpcyolo's dependencies the machine lacks) are installed first.
# On a machine where nvidia-smi sees a GPU, a suite that skipped is a failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

sees_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

python=
if [ -x .venv/bin/python ] && sees_cuda .venv/bin/python; then
    python=.venv/bin/python
elif sees_cuda "${PYTHON:-python3}"; then
    [ -x .venv-gpu/bin/python ] || "${PYTHON:-python3}" -m venv --system-site-packages .venv-gpu || exit 1
    python=.venv-gpu/bin/python
    if ls .whl/*.whl >/dev/null 2>&1; then
        "$python" -m pip install -q --no-index --no-deps --disable-pip-version-check .whl/*.whl || exit 1
    fi
    if ! "$python" -c 'import hpcyolo_trainer, hpcyolo.cli' 2>/dev/null; then
        # --no-build-isolation --no-deps: nothing is fetched (setuptools and wheel must be there).
        "$python" -m pip install -q --no-index --no-build-isolation --no-deps --disable-pip-version-check -e . \
            || exit 1
    fi
else
    bash scripts/setup.sh --no-system || exit 1
    python=.venv/bin/python
fi
"$python" - <<'PY'
import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
names = ", ".join(torch.cuda.get_device_name(k) for k in range(n)) or "none"
bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
print(f"test_gpu: torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s): {names}; AMP "
      f"{'bf16' if bf16 else 'fp16 with the gradient scaler' if n else 'off'}", flush=True)
PY
"$python" -m pytest -ra tests/gpu "$@"
status=$?
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU \
        && ! sees_cuda "$python"; then
    echo "test_gpu: nvidia-smi sees a GPU but $python's torch does not: the suite skipped" >&2
    exit 1
fi
[ "$status" -eq 5 ] && { echo "test_gpu: no tests were collected" >&2; exit 1; }
exit "$status"
