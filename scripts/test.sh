#!/usr/bin/env bash
# Set everything up and run the whole test suite, the Slurm tests included
# (they bring up the local testbed cluster themselves; that needs root).
#
#   bash scripts/test.sh [pytest arguments]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest -ra "$@"
status=$?
# pytest exits 5 when it collected no tests: that is a failure here.
if [ "$status" -eq 5 ]; then
    echo "test: no tests were collected" >&2
    exit 1
fi
exit "$status"
