#!/usr/bin/env bash
# The loss-parity experiment at 6 x 384 on a CPU, end to end: the 6-job mid-size sweep (6 x 384 on SymPy source), then the report.
#   bash scripts/loss_parity_mid_cpu.sh [extra train overrides...]
# Prints the report's path; the verdict is in <sweep>/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
sweep="outputs/sweeps/loss_parity_mid_cpu/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
train experiment=loss_parity_mid_cpu hydra.sweep.dir="$sweep" progress=false "$@"
normlab-report "$sweep"
echo "loss parity (CPU): sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
