#!/usr/bin/env bash
# Pre- vs post-norm, with and without learning-rate warm-up: the 4-job sweep, then the report.
#   bash scripts/placement_warmup.sh [experiment=placement_warmup_gpu] [extra train overrides...]
# A job that diverges makes the sweep exit 1; the report is written anyway and says what happened.
# Baseline: pre-norm with warm-up (the last warm-up value swept in the experiment file).
set -euo pipefail
cd "$(dirname "$0")/.."
exp=placement_warmup; rest=()
for a in "$@"; do case "$a" in experiment=*) exp="${a#experiment=}" ;; *) rest+=("$a") ;; esac; done
warm=$(python -c "import yaml; print(yaml.safe_load(open('conf/experiment/$exp.yaml'))['hydra']['sweeper']['params']['optim.warmup_steps'].split(',')[-1])")
sweep="outputs/sweeps/$exp/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
train experiment="$exp" hydra.sweep.dir="$sweep" progress=false "${rest[@]}" || echo "placement_warmup: some jobs did not complete (listed in the report)"
normlab-report "$sweep" --baseline "norm.placement=pre,optim.warmup_steps=$warm"
echo "placement_warmup: sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
