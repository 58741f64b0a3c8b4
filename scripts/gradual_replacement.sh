#!/usr/bin/env bash
# Gradual replacement, LayerNorm -> RMSNorm block by block (conf/experiment/gradual_replacement.yaml):
# the 16-job sweep as two processes in parallel (one per seed, one thread each, ~10 min on 2 idle
# cores), then normlab-report over both, then a figure: final validation loss against the number
# of switched blocks, first-blocks-first and last-blocks-first: the per-seed difference to the
# all-LayerNorm run, mean and 95% t-interval (report/gradual_replacement.png and .txt).
#   bash scripts/gradual_replacement.sh [extra train overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
sweep="outputs/sweeps/gradual_replacement/$(date +%Y-%m-%d_%H-%M-%S)"
mkdir -p "$(dirname "$sweep")"
start=$(date +%s)
for seed in 0 1; do
  train experiment=gradual_replacement seed="$seed" hydra.sweep.dir="$sweep/seed$seed" \
    progress=false "$@" > "$sweep.seed$seed.log" 2>&1 &
done
ok=0; for job in $(jobs -p); do wait "$job" || ok=1; done
[ "$ok" = 0 ] || echo "gradual_replacement: some jobs did not complete (see $sweep.seed*.log and the report)"
normlab-report "$sweep" --baseline "layer-pre"
python - "$sweep" <<'PY'
import json, math, sys
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from scipy import stats

sweep = Path(sys.argv[1])
loss: dict[tuple[str, int], dict[int, float]] = {}  # (order, n switched) -> seed -> loss
n_layer = None
for f in sorted(sweep.rglob("summary.json")):
    s = json.loads(f.read_text())
    cfg, v = s.get("config") or {}, s.get("final_val_loss")
    if not cfg or v is None or not math.isfinite(v):
        continue
    n_layer, blocks = cfg["model"]["n_layer"], cfg["norm"]["blocks"]
    if not blocks:
        keys = [("first", 0), ("last", 0)]
    else:
        lo, _, hi = blocks.split(":")[0].partition("-")
        lo, hi = int(lo), int(hi or lo)
        keys = [("first", hi - lo + 1)] if lo == 0 else []
        keys += [("last", hi - lo + 1)] if hi == n_layer - 1 else []
    for k in keys:
        loss.setdefault(k, {})[cfg["seed"]] = v
fig = Figure(figsize=(6, 4), layout="constrained")
ax = fig.add_subplot()
lines = []
for i, order in enumerate(("first", "last")):
    ns = sorted(n for o, n in loss if o == order and n > 0)
    base = loss.get((order, 0), {})
    diffs = {n: [v - base[s] for s, v in loss[(order, n)].items() if s in base] for n in ns}
    ns = [n for n in ns if diffs[n]]
    mean = np.array([np.mean(diffs[n]) for n in ns])
    half = np.array(
        [
            stats.t.ppf(0.975, len(diffs[n]) - 1) * stats.sem(diffs[n])
            if len(diffs[n]) > 1
            else np.nan
            for n in ns
        ]
    )
    ax.errorbar(np.array(ns) + 0.06 * (i - 0.5), mean, yerr=half, marker="o", capsize=3,
                label=f"{order} blocks first")
    lines += [
        f"{order} blocks first, {n} switched: {m:+.4f} nats, 95% CI [{m - h:+.4f}, {m + h:+.4f}]"
        f" (seeds: {len(diffs[n])})"
        for n, m, h in zip(ns, mean, half)
    ]
ax.axhline(0, color="black", lw=0.8)
ax.set(
    xlabel=f"blocks switched from LayerNorm to RMSNorm (of {n_layer})",
    ylabel="final val loss - all-LayerNorm (nats/token)",
    title="gradual replacement: paired by seed, mean and 95% t-interval",
)
ax.legend()
ax.grid(alpha=0.3)
out = sweep / "report" / "gradual_replacement.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
(sweep / "report" / "gradual_replacement.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"figure: {out}")
PY
echo "gradual_replacement: sweep and report in $(( $(date +%s) - start )) s; report: $sweep/report/report.md"
