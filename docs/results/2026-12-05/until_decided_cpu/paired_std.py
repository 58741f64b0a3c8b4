import statistics
import sys

from normlab.report import load_runs

runs = [r for r in load_runs([sys.argv[1]]) if (r.summary or {}).get("status") == "completed"]
at = {}
for r in runs:
    side = "b" if "norm=rms" in r.overrides else "a"
    seed = r.summary["seed"]
    for p in r.annealed:
        at.setdefault(p["budget_steps"], {}).setdefault(seed, {})[side] = p["val/loss"]
for steps, by_seed in sorted(at.items()):
    d = [v["b"] - v["a"] for v in by_seed.values() if len(v) == 2]
    mean, std = statistics.mean(d), statistics.stdev(d)
    print(f"{steps} steps: {len(d)} pairs, mean B-A {mean:+.4f}, paired std {std:.4f}")
