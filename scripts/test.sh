#!/usr/bin/env bash
# Set everything up and run the whole test suite, the Slurm tests included
# (they bring up the local testbed cluster themselves; that needs root).
#
#   bash scripts/test.sh [pytest arguments]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bash scripts/setup.sh || exit 1
# Two workers (pytest-xdist; HPCYOLO_TEST_WORKERS=0 runs in this process):
# the Slurm tests, on one of them (tests/conftest.py), mostly wait for their
# jobs, and the other worker trains meanwhile.
workers=${HPCYOLO_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
    .venv/bin/python -m pytest -ra "$@"
else
    .venv/bin/python -m pytest -ra -n "$workers" --dist loadgroup "$@"
fi
status=$?
# pytest exits 5 when it collected no tests: that is a failure here.
if [ "$status" -eq 5 ]; then
    echo "test: no tests were collected" >&2
    exit 1
fi
exit "$status"
