#!/usr/bin/env bash
# Run the GPU test suite (tests/gpu) on a machine with an NVIDIA GPU.
#
#   bash scripts/test_gpu.sh [pytest arguments]
#
# The python: scripts/gpu_python.sh's (.venv when its torch sees CUDA, else
# an environment over the machine's own CUDA PyTorch, with hpcyolo and the
# wheels in .whl/ installed without fetching anything, else .venv).
# On a machine where nvidia-smi sees a GPU, a suite that skipped is a failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

sees_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

python=$(bash scripts/gpu_python.sh) || exit 1
"$python" - <<'PY'
import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
names = ", ".join(torch.cuda.get_device_name(k) for k in range(n)) or "none"
bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
print(f"test_gpu: torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s): {names}; AMP "
      f"{'bf16' if bf16 else 'fp16 with the gradient scaler' if n else 'off'}", flush=True)
PY
"$python" -m pytest -ra --durations=0 tests/gpu "$@"
status=$?
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU \
        && ! sees_cuda "$python"; then
    echo "test_gpu: nvidia-smi sees a GPU but $python's torch does not: the suite skipped" >&2
    exit 1
fi
[ "$status" -eq 5 ] && { echo "test_gpu: no tests were collected" >&2; exit 1; }
exit "$status"
