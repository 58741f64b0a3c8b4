#!/usr/bin/env bash
# The first run on a GPU, sized to a short rental (docs/gpu.md): in order of value, each step
# time-boxed and skipped when the budget left (540 s, or less before NORMLAB_CHECK_DEADLINE) is
# under its minimum: versions, the norm contract on the device (Triton first, compiled last),
# normlab-bench of torch/triton/compiled at 65536 x 768 and 8192 x 4096, the measured matmul peak,
# 200 steps of the 12 x 768 model in bf16 with the Triton norm and with norm.impl=compiled (MFU
# against the datasheet's and the measured peak, graph breaks, the kernels that ran), and the
# step bench of triton against compiled. Writes gpu_check.md, gpu_check.json and logs.tar.gz into
# --out DIR (default outputs/gpu_check/<time>) after every step; SIGTERM ends the running step and
# still writes them. --dry-run: the same steps on a CPU, tiny sizes. Run from the repository root
# (the contract tests live in tests/). On a bare offline GPU machine use scripts/gpu_run.sh with
# the kit of scripts/gpu_kit.sh.
# Usage: scripts/gpu_check.sh [--dry-run] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m normlab.commands.gpu_check "$@"
