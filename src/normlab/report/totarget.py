"""Time to a target loss: the first evaluation at or below a validation loss, in training seconds
(``perf/train_time_s``: cumulative training wall time, evaluations and checkpoints excluded), in
optimizer steps and in tokens; per variant and paired by seed as ratios variant / baseline.

Losses in nats/token, times in seconds. Runs written before ``perf/train_time_s`` have steps and
tokens but no seconds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.runs import NAN, Run
from normlab.report.stats import describe, ratio_interval

TIME_KEY = "perf/train_time_s"


def seconds_at(run: Run, step: float) -> float:
    """Training seconds of ``run`` at ``step``: ``perf/train_time_s`` of a row of that step, else
    of the latest earlier row that has it (an evaluation row written apart from its step's row);
    nan when no row up to ``step`` records it."""
    times = [
        (float(r["step"]), float(r[TIME_KEY]))
        for r in run.metrics
        if "step" in r and r.get(TIME_KEY) is not None and float(r["step"]) <= step
    ]
    return max(times)[1] if times else NAN


def first_reach(run: Run, target: float, key: str = "val/loss") -> dict[str, float] | None:
    """The first evaluation row (by step) of ``run`` whose ``key`` is at or below ``target``:
    ``{"step", "seconds", "tokens"}`` (seconds: :func:`seconds_at`, nan without
    ``perf/train_time_s``; tokens nan without tokens per step; ``last``: whether it is the run's
    last evaluation); None when no evaluation reaches it."""
    rows = sorted((r for r in run.metrics if "step" in r and r.get(key) is not None), key=_step)
    k = run.tokens_per_step
    for row in rows:
        v = float(row[key])
        if math.isfinite(v) and v <= target:
            return {
                "step": float(row["step"]),
                "seconds": seconds_at(run, float(row["step"])),
                "tokens": float(row["step"] * k) if k else NAN,
                "last": row is rows[-1],
            }
    return None


def _step(row: dict[str, Any]) -> float:
    return float(row["step"])


def default_target(included: dict[str, list[Run]]) -> float:
    """The highest final validation loss of any included run (the worst variant's worst seed),
    so that every run reaches it; nan without a finite one."""
    finals = [r.final_val_loss for runs in included.values() for r in runs]
    finals = [x for x in finals if math.isfinite(x)]
    return max(finals) if finals else NAN


def _ratios(base: dict[Any, dict], var: dict[Any, dict], what: str, alpha: float) -> dict:
    seeds = sorted(set(base) & set(var), key=str)
    pairs = {s: var[s][what] / base[s][what] for s in seeds if base[s][what] > 0}
    pairs = {s: x for s, x in pairs.items() if math.isfinite(x) and x > 0}
    return {**ratio_interval(list(pairs.values()), alpha), "seeds": list(pairs)}


def time_to_target(
    included: dict[str, list[Run]], baseline: str, target: float | None, alpha: float
) -> dict[str, Any]:
    """Per variant how many runs reach ``target`` (nats/token; None: :func:`default_target`) and
    ``describe`` of their seconds, steps and tokens; per other variant the paired ratios
    (variant / baseline, geometric mean and its 1−alpha CI on logs, see
    :func:`~normlab.report.stats.ratio_interval`) of seconds, steps and tokens, over the seeds
    where both reached the target at a step > 0. ``only_last``: every run that reached it did so
    at its last evaluation only (the times then say nothing beyond the run lengths)."""
    chosen = default_target(included) if target is None else float(target)
    reach = {
        lab: {r.seed: first_reach(r, chosen) for r in runs if r.seed is not None}
        for lab, runs in included.items()
    }
    got_all = [x for by_seed in reach.values() for x in by_seed.values() if x is not None]
    out: dict[str, Any] = {
        "target": chosen,
        "default": target is None,
        "only_last": bool(got_all) and all(x["last"] for x in got_all),
        "variants": {},
        "comparisons": {},
    }
    for lab, by_seed in reach.items():
        got = [x for x in by_seed.values() if x is not None]
        out["variants"][lab] = {
            "runs": len(by_seed),
            "reached": len(got),
            **{
                w: describe([x[w] for x in got if math.isfinite(x[w])])
                for w in ("seconds", "step", "tokens")
            },
        }
    base = {s: x for s, x in reach.get(baseline, {}).items() if x is not None}
    for lab, by_seed in reach.items():
        if lab == baseline:
            continue
        var = {s: x for s, x in by_seed.items() if x is not None}
        out["comparisons"][lab] = {
            w: _ratios(base, var, w, alpha) for w in ("seconds", "step", "tokens")
        }
    return out


def time_curves(runs: list[Run], key: str = "val/loss") -> list[tuple[np.ndarray, np.ndarray]]:
    """Per run ``(training seconds, key)`` at its evaluations (seconds: :func:`seconds_at`;
    float arrays of shape ``(k,)``; empty for runs written before ``perf/train_time_s``)."""
    out = []
    for r in runs:
        pts = [
            (seconds_at(r, float(row["step"])), float(row[key]))
            for row in sorted(r.metrics, key=lambda x: x.get("step", 0))
            if "step" in row and row.get(key) is not None
        ]
        pts = [p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1])]
        out.append((np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
    return out
