#!/usr/bin/env bash
# The tuned loss-parity experiment on a CPU, end to end: 12 jobs (norm layer,rms x optim.lr
# 1e-3,2e-3,4e-3 x seed 0,1; 40 min measured on a shared 2-core EPYC), then the report, which compares
# each norm kind at its own best learning rate.
#   bash scripts/loss_parity_tuned_cpu.sh [extra train overrides...]
# Prints the report's path; the tuned verdict is in <sweep>/report/report.md ("Tuned comparison").
set -euo pipefail
cd "$(dirname "$0")/.."
sweep="outputs/sweeps/loss_parity_tuned_cpu/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
train experiment=loss_parity_tuned_cpu hydra.sweep.dir="$sweep" progress=false "$@"
normlab-report "$sweep"
echo "tuned loss parity (CPU): sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
