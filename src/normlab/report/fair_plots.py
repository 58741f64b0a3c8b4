"""Figures of fair comparisons: validation loss against training seconds and against tokens seen,
and final validation loss against the learning rate of a tuned sweep. Matplotlib's object API
(Agg canvas, no display). Losses in nats/token, times in seconds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from normlab.report.runs import Run
from normlab.report.series import aggregate, loss_limits, series
from normlab.report.totarget import time_curves
from normlab.report.tuned import lr_curves


def zoom_to_losses(ax: Any, curves: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Zoom ``ax`` to :func:`~normlab.report.series.loss_limits` of ``curves`` (``(x, loss)``
    pairs): the initial model's point is drawn off the top instead of squashing the rest."""
    lo, hi = loss_limits(curves)
    if math.isfinite(lo) and math.isfinite(hi):
        ax.set_ylim(lo, hi)


def _finish(fig: Figure, ax: Any, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path


def plot_val_time(included: dict[str, list[Run]], target: float, path: Path) -> Path | None:
    """Validation loss against cumulative training seconds (``perf/train_time_s``), one thin line
    per run and one colour per variant, the target loss dotted. None when no run records it."""
    curves = {lab: [c for c in time_curves(runs) if len(c[0])] for lab, runs in included.items()}
    if not any(curves.values()):
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    for i, (lab, runs) in enumerate(curves.items()):
        for j, (t, v) in enumerate(runs):
            name = f"{lab} ({len(runs)} runs)" if j == 0 else None
            ax.plot(t, v, color=f"C{i % 10}", lw=1, marker="o", ms=2, alpha=0.8, label=name)
    zoom_to_losses(ax, [c for runs in curves.values() for c in runs])
    if math.isfinite(target):
        ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.4f}")
    title = "Validation loss vs training time (each run; evaluations excluded from the time)"
    return _finish(fig, ax, path, title, "training seconds", "validation loss (nats/token)")


def plot_val_tokens(included: dict[str, list[Run]], path: Path) -> Path | None:
    """Validation loss against tokens seen (step × tokens per step): mean over a variant's runs
    with a min–max band. None without validation points or tokens per step."""
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    drawn: list[tuple[np.ndarray, np.ndarray]] = []
    for i, (lab, runs) in enumerate(included.items()):
        curves = [
            (s * r.tokens_per_step, v)
            for r in runs
            if r.tokens_per_step
            for s, v in [series(r.metrics, "val/loss")]
            if len(s)
        ]
        if not curves:
            continue
        x, mean, lo, hi = aggregate(curves)
        ax.plot(x, mean, color=f"C{i % 10}", marker="o", ms=3, label=f"{lab} (n={len(curves)})")
        ax.fill_between(x, lo, hi, color=f"C{i % 10}", alpha=0.2, lw=0)
        drawn += [(x, lo), (x, hi)]
    if not drawn:
        return None
    zoom_to_losses(ax, drawn)
    title = "Validation loss vs tokens seen (mean over seeds, band: min–max)"
    return _finish(fig, ax, path, title, "tokens seen", "validation loss (nats/token)")


def plot_lr_curve(tuned: dict[str, Any], path: Path, conf: str) -> Path | None:
    """Mean final validation loss against ``optim.lr`` (log scale) per variant, error bars the
    ``conf`` interval (where n >= 2), each variant's best learning rate circled."""
    curves = lr_curves(tuned)
    if not any(len(c[0]) for c in curves.values()):
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    for i, (lab, (lrs, mean, lo, hi, _n)) in enumerate(curves.items()):
        color = f"C{i % 10}"
        err = np.vstack([mean - lo, hi - mean])
        err = np.where(np.isfinite(err), err, 0.0)
        ax.errorbar(lrs, mean, yerr=err, color=color, marker="o", ms=4, capsize=3, label=lab)
        best = tuned["best"].get(lab)
        if best is not None:
            y = mean[list(lrs).index(best)]
            ax.plot([best], [y], "o", ms=12, mfc="none", color=color)
    ax.set_xscale("log")
    title = f"Final validation loss vs learning rate (mean over seeds, bars: {conf}; ring: best)"
    return _finish(fig, ax, path, title, "optim.lr (peak)", "final validation loss (nats/token)")
