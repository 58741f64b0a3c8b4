#!/usr/bin/env bash
# DyT with its LLM recipe against RMSNorm (conf/experiment/dyt_llm_cpu.yaml): for each seed, the
# RMSNorm run then the recipe's DyT run (one thread each, one after another, so that a stopped
# study still leaves whole pairs), then normlab-report with RMSNorm as the baseline.
#   bash scripts/dyt_llm_cpu.sh [extra train overrides for both variants...]
#   SEEDS="0 1" bash scripts/dyt_llm_cpu.sh     # fewer seeds
# The recipe's overrides are RECIPE below (docs/norms.md, "DyT's LLM recipe").
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=(norm=dyt norm.bias=false norm.alpha_init=0.2 norm.positions.attn_in.alpha_init=0.8
  model.embedding_scale=true)
sweep="outputs/sweeps/dyt_llm_cpu/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
ok=0
for seed in ${SEEDS:-0 1 2}; do
  train experiment=dyt_llm_cpu seed="$seed" norm=rms hydra.sweep.dir="$sweep/seed$seed-rms" \
    progress=false "$@" || ok=1
  train experiment=dyt_llm_cpu seed="$seed" "${RECIPE[@]}" \
    hydra.sweep.dir="$sweep/seed$seed-dyt_llm" progress=false "$@" || ok=1
done
[ "$ok" = 0 ] || echo "dyt_llm_cpu: some jobs did not complete (listed in the report)"
normlab-report "$sweep" --baseline norm=rms
echo "dyt_llm_cpu: sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
