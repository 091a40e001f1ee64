#!/usr/bin/env bash
# Set up and run the main job on the built-in default (no cluster needed):
# generate a shapes dataset, train the n model with 2 CPU processes on this
# machine (the `local` site), and finish with mAP and the results plot.
#
#   bash scripts/demo.sh
#
# Running it again continues the same run (--resume); a finished run just
# prints its results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-system
[ -f data/shapes/data.yaml ] || .venv/bin/hpcyolo make-dataset shapes data/shapes
.venv/bin/hpcyolo validate site_configs/local.yaml examples/shapes.yaml
.venv/bin/hpcyolo run --resume site_configs/local.yaml examples/shapes.yaml
