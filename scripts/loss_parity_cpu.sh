#!/usr/bin/env bash
# The loss-parity experiment on a CPU, end to end: the 6-job sweep (with the held-out corpora
# wiki_vital and kjv evaluated at every evaluation: eval_data in the experiment file), then the
# interleaved step benchmark of its two variants in one process (A B B A ...,
# written to <sweep>/step_bench.json: the report's speed verdict), then the report.
#   bash scripts/loss_parity_cpu.sh [extra train overrides...]
#   MAX_TIME_S=90 bash scripts/loss_parity_cpu.sh     # equal wall-clock: runs end at 90 s of training
# Prints the report's path; the verdict is in <sweep>/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
sweep="outputs/sweeps/loss_parity_cpu/$(date +%Y-%m-%d_%H-%M-%S)"
start=$(date +%s)
# the jobs' thread count (train's threads=null: $OMP_NUM_THREADS, else half the cores), for the bench
threads=${OMP_NUM_THREADS:-$(( $(nproc) / 2 ))}
[ "$threads" -ge 1 ] || threads=1
# a time budget cuts a run short of its decay and refuses cool-down branches: equal wall-clock runs
# take the cosine protocol (its lr still decays towards max_steps; the report says how far it got)
budget=(); [ -z "${MAX_TIME_S:-}" ] || budget=("max_time_s=$MAX_TIME_S" max_steps=600 optim.schedule=cosine "optim.anneal_at=[]")
train experiment=loss_parity_cpu hydra.sweep.dir="$sweep" progress=false \
  "${budget[@]}" "$@"
normlab-bench step experiment=loss_parity_cpu "$@" --a norm=layer --b norm=rms \
  --pairs "${BENCH_PAIRS:-30}" --warmup 5 --threads "$threads" --json "$sweep/step_bench.json"
normlab-report "$sweep"
echo "loss parity (CPU): sweep, step benchmark and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
