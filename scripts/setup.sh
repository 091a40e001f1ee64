#!/usr/bin/env bash
# Set up everything hpcyolo needs on a fresh Debian/Ubuntu machine.
#
#   bash scripts/setup.sh            # system packages (when root) + .venv
#   bash scripts/setup.sh --no-system  # only the Python side
#
# System packages: Slurm, munge, slurmdbd and MariaDB (the local test cluster,
# tests/testbed, with Slurm's accounting) and
# the linter that the tests run on the rendered scripts (shellcheck). Python: a venv in
# .venv with PyTorch's CPU build and hpcyolo in editable mode, with the dev and
# export extras.
set -euo pipefail
cd "$(dirname "$0")/.."

system=1
[ "${1:-}" = "--no-system" ] && system=0

if [ "$system" = 1 ]; then
    # The testbed's packages (tests/testbed/slurm_testbed.py APT_PACKAGES: Slurm,
    # munge, slurmdbd and MariaDB for its accounting) and shellcheck.
    packages=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server shellcheck)
    missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "setup: not root, so not installing ${missing[*]} (the Slurm tests and shellcheck need them)" >&2
        else
            echo "setup: installing ${missing[*]}" >&2
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        fi
    fi
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# torch==2.13.0 exactly: these machines carry its CPU build locally, while a
# bare "torch" requirement would pull gigabytes of CUDA wheels.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
# The export, mlflow and wandb extras too: the test suite checks `hpcyolo export` and
# reads the trackers' offline runs back with their own clients.
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,export,mlflow,wandb]'
# Bytecode for the editable sources, as a wheel install would have it (some
# environments set PYTHONDONTWRITEBYTECODE, which makes every start recompile).
.venv/bin/python -m compileall -q hpcyolo trainer >/dev/null
echo "setup: ready (.venv/bin/hpcyolo $(.venv/bin/hpcyolo --version | cut -d' ' -f3))" >&2
