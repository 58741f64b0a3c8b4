#!/usr/bin/env bash
# The first run on a GPU, in one go (at most 7.5 minutes on one H100/H200): the norm contract
# tests on the device (every implementation against the float64 oracle at model widths, NaN/inf
# inputs, the preflight), normlab-bench of every norm in fp32/bf16, the measured matmul peak,
# a 12 x 768 bf16 compiled training run (tokens/s, MFU against the measured peak, graph breaks)
# and the step bench of the fused kernel against torch and compiled. Writes gpu_check.md and
# gpu_check.json under outputs/gpu_check/<time>/ (or --out DIR). --dry-run: the same steps on
# CPU, tiny sizes. Run from the repository root (the contract tests live in tests/). On a bare
# offline GPU machine use scripts/gpu_run.sh with the kit of scripts/gpu_kit.sh (docs/gpu.md).
# Usage: scripts/gpu_check.sh [--dry-run] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m normlab.commands.gpu_check "$@"
