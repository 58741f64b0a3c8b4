#!/usr/bin/env bash
# eps from 1e-8 to 1e-2 for LayerNorm and RMSNorm: the sweep, then the report (baseline: LayerNorm
# at eps 1e-5, the default). The report draws final validation loss vs eps per kind (swept.png).
#   bash scripts/eps_sweep.sh [experiment=eps_sweep_gpu] [extra train overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
exp=eps_sweep; rest=()
for a in "$@"; do case "$a" in experiment=*) exp="${a#experiment=}" ;; *) rest+=("$a") ;; esac; done
sweep="outputs/sweeps/$exp/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
train experiment="$exp" hydra.sweep.dir="$sweep" progress=false "${rest[@]}" || echo "eps_sweep: some jobs did not complete (listed in the report)"
normlab-report "$sweep" --baseline "norm=layer,norm.eps=1e-05"
echo "eps_sweep: sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
