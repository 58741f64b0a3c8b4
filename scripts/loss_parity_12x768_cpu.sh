#!/usr/bin/env bash
# The loss-parity experiment at 12 x 768 on a CPU, end to end: the 4-job sweep at GPT-2 small's
# 12 x 768 (context 256, SymPy source), then the interleaved step benchmark of its two variants
# (A B B A ..., 5 pairs, written to <sweep>/step_bench.json: the report's speed verdict), then the
# report.
#   bash scripts/loss_parity_12x768_cpu.sh [extra train overrides...]
# Prints the report's path; the verdict is in <sweep>/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
sweep="outputs/sweeps/loss_parity_12x768_cpu/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
train experiment=loss_parity_12x768_cpu hydra.sweep.dir="$sweep" progress=false "$@"
normlab-bench step experiment=loss_parity_12x768_cpu "$@" --a norm=layer --b norm=rms \
  --pairs "${BENCH_PAIRS:-5}" --warmup 1 --threads 2 --json "$sweep/step_bench.json"
normlab-report "$sweep"
echo "loss parity (CPU): sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
