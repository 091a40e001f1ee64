#!/usr/bin/env bash
# The GPU checks in one command on a GPU machine:
# the GPU test suite (tests/gpu) and the throughput benchmark
# (benchmarks/bench_gpu.py: hpcyolo train, ultralytics' trainer and the GPU
# alone, yolov8n and yolov8s at imgsz 640, batch 64, and a validation pass).
#
#   bash scripts/gpu_check.sh [suite|bench|all] [bench_gpu.py arguments]   # default: all
#
# The python is scripts/gpu_python.sh's: a machine without a package index
# gets hpcyolo and the wheels in .whl/ (scripts/gpu_wheels.sh, run where PyPI
# is reachable) installed over its own CUDA PyTorch. Ultralytics' row needs
# its wheels there; without them the benchmark prints the other rows.
# Logs go to $OUT (where set, as on the device machines) or gpu-check/:
# suite.log and bench.log. Each part takes a few minutes on one H100/H200
# (run them as two commands where one command may run 10 minutes at most).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
what=${1:-all}
[ $# -gt 0 ] && shift
case "$what" in suite|bench|all) ;; *) echo "gpu_check: suite, bench or all, not '$what'" >&2; exit 2 ;; esac
logs=${OUT:-gpu-check}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
python=$(bash scripts/gpu_python.sh) || exit 1
status=0
if [ "$what" != bench ]; then
    bash scripts/test_gpu.sh 2>&1 | tee "$logs/suite.log"
    status=${PIPESTATUS[0]}
fi
if [ "$what" != suite ]; then
    "$python" benchmarks/bench_gpu.py "$@" 2>&1 | tee "$logs/bench.log"
    bench=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] && status=$bench
fi
echo "gpu_check: $what exit $status; logs in $logs/" >&2
exit "$status"
