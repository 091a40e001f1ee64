#!/usr/bin/env bash
# Set everything up and run the whole test suite, the Slurm tests included
# (they bring up the local testbed cluster themselves; that needs root).
#
#   bash scripts/test.sh [pytest arguments]
#
# Three lanes run at once (tests/conftest.py marks each test with its lane):
# the Slurm testbed's tier (`-m lane_slurm`: its jobs spend most of their time
# waiting on Slurm, for a time limit, a signal, a requeue's hold or the
# scheduler), the trainer's tests (`-m lane_trainer`: multi-rank runs,
# CPU-bound), and the rest (`-m lane_rest`). Two lanes left the CPUs idle
# whenever both waited (17% of a CI run); a third fills those gaps (7%). Each lane's output follows the one before it and ends with its own
# summary. HPCYOLO_TEST_LANES=1 runs them one after the other instead.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bash scripts/setup.sh || exit 1

# The lanes' torch processes outnumber the cores: an OpenMP thread that spins
# while it waits for its team burns a core another lane needs. Waiting passively
# (no numeric change), yolo11n's validation of 400 images took 11 CPU-seconds
# beside two busy cores instead of 32, and 11 instead of 16 on an idle machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
names=(rest trainer slurm)
marks=(lane_rest lane_trainer lane_slurm)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hpcyolo-test-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
lane() {  # lane INDEX [pytest arguments]
    .venv/bin/python -m pytest -ra -p no:cacheprovider --basetemp="$tmp/${names[$1]}" -m "${marks[$1]}" "${@:2}"
}
codes=()
if [ "${HPCYOLO_TEST_LANES:-3}" = 1 ]; then
    for i in "${!names[@]}"; do
        lane "$i" "$@"
        codes+=($?)
    done
else
    pids=()
    for i in 1 2; do
        lane "$i" "$@" >"$tmp/${names[$i]}.log" 2>&1 &
        pids+=($!)
    done
    lane 0 "$@"
    codes+=($?)
    for i in 1 2; do
        wait "${pids[$((i - 1))]}"
        codes+=($?)
        echo
        echo "== the ${names[$i]} lane (-m \"${marks[$i]}\"), run beside the lanes above =="
        cat "$tmp/${names[$i]}.log"
    done
fi
summary=""
for i in "${!names[@]}"; do
    summary+=" ${names[$i]} ${codes[$i]};"
done
echo "test: lanes exited:${summary%;}"
# pytest exits 5 when it collected no tests: a lane may collect none (a path
# given that holds only Slurm tests, say), not every lane.
collected=0
for code in "${codes[@]}"; do
    if [ "$code" -ne 5 ]; then
        collected=1
    fi
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then
        exit "$code"
    fi
done
if [ "$collected" = 0 ]; then
    echo "test: no tests were collected" >&2
    exit 1
fi
exit 0
