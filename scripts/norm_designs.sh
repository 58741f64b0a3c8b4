#!/usr/bin/env bash
# Norm designs (conf/experiment/norm_designs.yaml): kind {layer, rms, dyt} x placement {pre, peri,
# reordered} x qk {none, head}, 2 seeds = 36 jobs, run as two processes in parallel (one per seed,
# one thread each), then normlab-report with pre-norm LayerNorm (label layer-pre) as the baseline:
# each variant's verdict against it.
#   bash scripts/norm_designs.sh [experiment=<a twin>] [extra train overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
exp=norm_designs; rest=()
for a in "$@"; do case "$a" in experiment=*) exp="${a#experiment=}" ;; *) rest+=("$a") ;; esac; done
sweep="outputs/sweeps/$exp/$(date +%Y-%m-%d_%H-%M-%S)"
mkdir -p "$(dirname "$sweep")"
start=$(date +%s)
for seed in 0 1; do
  train experiment="$exp" seed="$seed" hydra.sweep.dir="$sweep/seed$seed" progress=false \
    "${rest[@]}" > "$sweep.seed$seed.log" 2>&1 &
done
ok=0; for job in $(jobs -p); do wait "$job" || ok=1; done
[ "$ok" = 0 ] || echo "$exp: some jobs did not complete (see $sweep.seed*.log and the report)"
normlab-report "$sweep" --baseline "layer-pre"
echo "$exp: sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
