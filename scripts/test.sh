#!/usr/bin/env bash
# Set everything up and run the whole test suite, the Slurm tests included
# (they bring up the local testbed cluster themselves; that needs root).
#
#   bash scripts/test.sh [pytest arguments]
#
# Two lanes run at once: the Slurm testbed's tier (`-m slurm`: its jobs
# spend most of their time waiting on Slurm, for a time limit, a signal, a
# requeue's hold or the scheduler), with a few files that even out the two
# lanes' time (tests/conftest.py's BESIDE_SLURM), beside every other test.
# The Slurm lane's output follows the other's; each ends with its own
# summary. HPCYOLO_TEST_LANES=1 runs them one after the other instead.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bash scripts/setup.sh || exit 1

# pytest exits 5 when it collected no tests: one lane may collect none (a
# path given that holds only Slurm tests, or none), not both.
lane() {
    .venv/bin/python -m pytest -ra -p no:cacheprovider --basetemp="$tmp/$1" -m "$2" "${@:3}"
}
slurm_tests="slurm or beside_slurm"
rest_tests="not slurm and not beside_slurm"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hpcyolo-test-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ "${HPCYOLO_TEST_LANES:-2}" = 1 ]; then
    lane rest "$rest_tests" "$@"
    rest=$?
    lane slurm "$slurm_tests" "$@"
    slurm=$?
else
    lane slurm "$slurm_tests" "$@" >"$tmp/slurm.log" 2>&1 &
    pid=$!
    lane rest "$rest_tests" "$@"
    rest=$?
    wait "$pid"
    slurm=$?
    echo
    echo "== the Slurm lane (-m \"$slurm_tests\"), run beside the lane above =="
    cat "$tmp/slurm.log"
fi
echo "test: lanes exited ${rest} (-m \"$rest_tests\") and ${slurm} (-m \"$slurm_tests\")"
if [ "$rest" -eq 5 ] && [ "$slurm" -eq 5 ]; then
    echo "test: no tests were collected" >&2
    exit 1
fi
for status in "$rest" "$slurm"; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
        exit "$status"
    fi
done
exit 0
