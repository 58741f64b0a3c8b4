#!/usr/bin/env bash
# Where the step time goes (norm, attention, MLP, other, optimizer) for every norm implementation.
#   bash scripts/norm_cost.sh [experiment=norm_cost_gpu] [overrides...] [--steps N] [--out DIR]
# Writes norm_cost.{md,png,json} under outputs/studies/norm_cost/<time>/ (or --out).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
python -m normlab.commands.study norm-cost "$@"
echo "norm_cost: done in $(( $(date +%s) - start )) s"
