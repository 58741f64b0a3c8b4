#!/usr/bin/env bash
# RMSNorm statistics in fp16 vs fp32: norm-level error sweep and the model-level overflow detector.
#   bash scripts/fp16_statistics.sh [experiment=fp16_statistics_gpu] [overrides...] [--out DIR]
# Writes fp16_statistics.{md,png,json} under outputs/studies/fp16_statistics/<time>/ (or --out).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
python -m normlab.commands.study fp16-statistics "$@"
echo "fp16_statistics: done in $(( $(date +%s) - start )) s"
