#!/usr/bin/env bash
# The norm designs of 2025-26 (conf/experiment/norm_designs_2026.yaml; the designs in conf/design/)
# against pre-norm RMSNorm: the sweep in one process (one thread, jobs one after another), then
# normlab-report with design=rms as the baseline (Holm-adjusted over the family of designs).
#   bash scripts/norm_designs_2026.sh [experiment=norm_designs_2026_gpu] [extra train overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
exp=norm_designs_2026; rest=()
for a in "$@"; do case "$a" in experiment=*) exp="${a#experiment=}" ;; *) rest+=("$a") ;; esac; done
sweep="outputs/sweeps/$exp/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
train experiment="$exp" hydra.sweep.dir="$sweep" progress=false "${rest[@]}" \
  || echo "$exp: some jobs did not complete (see the report's excluded runs)"
normlab-report "$sweep" --baseline "design=rms"
echo "$exp: sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
