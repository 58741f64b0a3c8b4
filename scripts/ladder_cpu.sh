#!/usr/bin/env bash
# The model-size ladder on a CPU, end to end: the 20-run sweep of experiment=ladder_cpu (LayerNorm
# vs RMSNorm at 5 sizes x 2 seeds, one run after another on one thread), then the ladder report
# (normlab-report on a sweep over model sizes: a report per size, the loss-compute law per kind,
# the trend of the compute multiplier with size and its value at 124M parameters).
#   bash scripts/ladder_cpu.sh [extra train overrides...]
# Prints the report's path; the ladder report is <sweep>/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
sweep="outputs/sweeps/ladder_cpu/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
train experiment=ladder_cpu hydra.sweep.dir="$sweep" progress=false "$@"
normlab-report "$sweep"
echo "ladder (CPU): sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
