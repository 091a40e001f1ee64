#!/usr/bin/env bash
# Set up and run the main job on the built-in default (no cluster needed):
# check the example job against the local site and print its sbatch script.
#
#   bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-system
.venv/bin/hpcyolo validate site_configs/local.yaml examples/coco8.yaml
.venv/bin/hpcyolo render site_configs/local.yaml examples/coco8.yaml
