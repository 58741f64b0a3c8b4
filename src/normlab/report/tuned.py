"""A tuned comparison: a sweep over ``optim.lr`` x the variants x ``seed``. Each variant is
compared at its own best learning rate (the lowest mean final validation loss over its completed
runs); the runs at its other learning rates are set aside (:attr:`Run.set_aside`) and shown in the
loss-against-lr table and figure. Losses in nats/token; learning rates as configured.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.runs import Run, override_key
from normlab.report.stats import describe, paired_difference, t_interval

LR_KEY = "optim.lr"


def run_lr(run: Run) -> float | None:
    """The run's peak learning rate (``optim.lr`` as resolved), None when not recorded."""
    v = run.resolved(LR_KEY)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def lr_swept(runs: list[Run]) -> bool:
    """True when every run overrides ``optim.lr`` (as a sweep over it does) and the runs hold at
    least two learning rates: the sweep may be a tuned comparison (it is one when other keys label
    variants too). A lone run at another lr is a variant of its own, not a tuning grid."""
    overridden = bool(runs) and all(
        any(override_key(o) == LR_KEY for o in r.overrides) for r in runs
    )
    return overridden and len({run_lr(r) for r in runs} - {None}) >= 2


def choose_best_lr(runs: list[Run], labels: list[str], alpha: float = 0.05) -> dict[str, Any]:
    """Per variant label, the completed runs grouped by learning rate; the best learning rate (the
    lowest mean final validation loss; ties: the smaller lr); the runs at the other rates get
    :attr:`Run.set_aside` (this mutates ``runs``).

    Returns ``{"lrs": sorted learning rates, "points": {label: {lr: {**describe, "ci",
    "by_seed"}}}, "best": {label: lr}, "edge": labels whose best lr is the smallest or largest of
    the grid}``; ``ci`` is the 1−alpha Student t interval of the mean (nats/token).
    """
    lrs = sorted({x for x in map(run_lr, runs) if x is not None})
    points: dict[str, dict[float, dict[str, Any]]] = {}
    best: dict[str, float] = {}
    for lab in labels:
        done = [r for r in runs if r.label == lab and r.excluded is None and run_lr(r) is not None]
        by_lr: dict[float, list[Run]] = {}
        for r in done:
            by_lr.setdefault(run_lr(r), []).append(r)
        points[lab] = {
            lr: {
                **describe([r.final_val_loss for r in rs]),
                "ci": t_interval([r.final_val_loss for r in rs], 1 - alpha),
                "by_seed": {r.seed: r.final_val_loss for r in rs},
            }
            for lr, rs in sorted(by_lr.items())
        }
        if not by_lr:
            continue
        best[lab] = min(points[lab], key=lambda lr, lab=lab: (points[lab][lr]["mean"], lr))
        for r in done:
            if run_lr(r) != best[lab]:
                r.set_aside = (
                    f"{LR_KEY}={run_lr(r):g} is not the best learning rate of `{lab}` "
                    f"({best[lab]:g})"
                )
    edge = [lab for lab, lr in best.items() if len(lrs) > 2 and lr in (lrs[0], lrs[-1])]
    return {"lrs": lrs, "points": points, "best": best, "edge": edge}


def at_each_lr(
    tuned: dict[str, Any], baseline: str, margin: float, alpha: float
) -> dict[str, dict[float, dict[str, Any]]]:
    """Per non-baseline label and learning rate both ran: the paired difference (variant −
    baseline, nats/token, by seed) of :func:`~normlab.report.stats.paired_difference`."""
    base = tuned["points"].get(baseline, {})
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for lab, pts in tuned["points"].items():
        if lab == baseline:
            continue
        out[lab] = {}
        for lr, p in pts.items():
            if lr not in base:
                continue
            seeds = sorted(set(p["by_seed"]) & set(base[lr]["by_seed"]), key=str)
            diffs = [p["by_seed"][s] - base[lr]["by_seed"][s] for s in seeds]
            diffs = [d for d in diffs if math.isfinite(d)]
            out[lab][lr] = paired_difference(diffs, margin, alpha)
    return out


def lr_curves(tuned: dict[str, Any]) -> dict[str, tuple[np.ndarray, ...]]:
    """Per label ``(lrs, mean, lo, hi, n)`` arrays of shape ``(k,)`` for the loss-vs-lr figure."""
    out = {}
    for lab, pts in tuned["points"].items():
        lrs = sorted(pts)
        cols = [
            np.array([pts[x]["mean"] for x in lrs], float),
            np.array([pts[x]["ci"][0] for x in lrs], float),
            np.array([pts[x]["ci"][1] for x in lrs], float),
            np.array([pts[x]["n"] for x in lrs], int),
        ]
        out[lab] = (np.array(lrs, float), *cols)
    return out
