"""Figures for ``normlab-report``: validation loss, smoothed training loss and step-time distribution;
with ``diag/`` keys in the metrics, residual-stream RMS vs depth and norm gains over training; for a
sweep of one numeric override, final validation loss against its value.

Uses matplotlib's object API (``Figure`` rendered by the Agg canvas), so it neither needs a display
nor changes the pyplot backend of the calling process. Losses in nats/token, times in ms.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from normlab.report.sections import diag_rows, n_blocks, num, resid_profile

Metrics = dict[
    str, list[list[dict[str, Any]]]
]  # variant label -> one list of metrics.jsonl rows per run
Curves = dict[
    str, list[tuple[np.ndarray, np.ndarray]]
]  # variant label -> one (steps, values) per run


def ema(values: np.ndarray, beta: float) -> np.ndarray:
    """Bias-corrected exponential moving average (as in Adam): m_t = beta·m_{t−1} + (1−beta)·x_t,
    returned as m_t / (1 − beta^t); units of ``values``."""
    out, m = np.empty(len(values)), 0.0
    for i, x in enumerate(values):
        m = beta * m + (1 - beta) * x
        out[i] = m / (1 - beta ** (i + 1))
    return out


def series(rows: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of the metrics rows that have a finite ``key``."""
    pts = [(r["step"], float(r[key])) for r in rows if r.get(key) is not None and "step" in r]
    pts = [p for p in pts if np.isfinite(p[1])]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Per step over the runs that logged it: ``(steps, mean, min, max)``."""
    by_step: dict[float, list[float]] = {}
    for steps, vals in curves:
        for s, v in zip(steps, vals, strict=True):
            by_step.setdefault(float(s), []).append(float(v))
    steps = np.array(sorted(by_step))
    cols = [np.array([f(by_step[s]) for s in steps]) for f in (np.mean, np.min, np.max)]
    return (steps, *cols)


def _band_plot(curves: Curves, path: Path, title: str, ylabel: str) -> Path | None:
    if not any(len(s) for runs in curves.values() for s, _ in runs):
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    for label, runs in curves.items():
        runs = [c for c in runs if len(c[0])]
        if not runs:
            continue
        steps, mean, lo, hi = aggregate(runs)
        marker = "o" if len(steps) < 30 else None
        line = ax.plot(steps, mean, marker=marker, ms=3, label=f"{label} (n={len(runs)})")[0]
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path


def plot_val_loss(metrics: Metrics, path: Path) -> Path | None:
    """Validation loss (nats/token) vs step: mean over runs per variant, min–max band. None if no data."""
    curves = {lab: [series(rows, "val/loss") for rows in runs] for lab, runs in metrics.items()}
    title = "Validation loss (mean over seeds, band: min–max)"
    return _band_plot(curves, path, title, "validation loss (nats/token)")


def plot_train_loss(metrics: Metrics, path: Path, beta: float = 0.95) -> Path | None:
    """Training loss (nats/token) vs step, each run smoothed by :func:`ema`, then mean and min–max over runs."""
    curves = {
        lab: [(s, ema(v, beta)) for s, v in (series(rows, "train/loss") for rows in runs)]
        for lab, runs in metrics.items()
    }
    title = f"Training loss, EMA beta={beta:g} (mean over seeds, band: min–max)"
    return _band_plot(curves, path, title, "training loss (nats/token)")


def plot_step_times(times: dict[str, list[float]], path: Path) -> Path | None:
    """Box plot per variant of post-warm-up step times (ms), all seeds pooled. None if no data."""
    times = {lab: t for lab, t in times.items() if len(t)}
    if not times:
        return None
    fig = Figure(figsize=(max(6, 1.6 * len(times)), 5), layout="constrained")
    ax = fig.add_subplot()
    ax.boxplot(list(times.values()), flierprops={"markersize": 2})
    ticks = [f"{lab}\n({len(t)} steps)" for lab, t in times.items()]
    ax.set_xticks(range(1, len(times) + 1), ticks, fontsize="small")
    ax.set(
        title="Step time per variant (post-warm-up steps, seeds pooled)", ylabel="step time (ms)"
    )
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=120)
    return path


def write_figures(
    metrics: Metrics, times: dict[str, list[float]], out_dir: Path, beta: float = 0.95
) -> dict[str, Path | None]:
    """Write ``val_loss.png``, ``train_loss.png``, ``step_time.png`` into ``out_dir``.

    ``metrics``: variant label -> one list of metrics rows per run; ``times``: label -> step times (ms);
    ``beta``: EMA smoothing of the training loss.
    Returns name -> path, or None for a figure skipped for lack of data.
    """
    return {
        "val_loss": plot_val_loss(metrics, out_dir / "val_loss.png"),
        "train_loss": plot_train_loss(metrics, out_dir / "train_loss.png", beta),
        "step_time": plot_step_times(times, out_dir / "step_time.png"),
    }


# --- diagnostics (``diag/`` keys, see normlab.diagnostics) -------------------------------------------


def panel_steps(diag: Metrics) -> list[int]:
    """First, middle and last diagnosed step over every run (duplicates dropped)."""
    steps = sorted({r["step"] for runs in diag.values() for rows in runs for r in diag_rows(rows)})
    return list(dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]])) if steps else []


def profile_at(
    runs: list[list[dict[str, Any]]], step: int, n: int
) -> tuple[np.ndarray, int] | None:
    """Mean over runs of :func:`resid_profile` at each run's last diagnosed step <= ``step``, and the
    latest such step; None when no run was diagnosed by then."""
    picked = []
    for rows in runs:
        before = [r for r in diag_rows(rows) if r["step"] <= step]
        if before:
            picked.append(before[-1])
    if not picked:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan columns (a diverged run): nan
        prof = np.nanmean([resid_profile(r, n) for r in picked], axis=0)
    return prof, max(r["step"] for r in picked)


def plot_resid_depth(diag: Metrics, path: Path) -> Path | None:
    """Residual-stream RMS vs depth, one panel per step (first, middle, last diagnosed), one line per
    variant (mean over its runs). A variant not diagnosed at a panel's step shows its latest earlier
    diagnosed step, named in the legend. None without diagnostics."""
    n = max((n_blocks(rows) for runs in diag.values() for rows in runs), default=0)
    steps = panel_steps(diag)
    if not n or not steps:
        return None
    fig = Figure(figsize=(5 * len(steps), 4.8), layout="constrained")
    axes = fig.subplots(1, len(steps), sharey=True, squeeze=False)[0]
    positive = True
    for ax, step in zip(axes, steps, strict=True):
        for i, (label, runs) in enumerate(diag.items()):
            got = profile_at(runs, step, n)
            if got is None:
                continue
            prof, at = got
            positive &= bool(np.all(prof[np.isfinite(prof)] > 0))
            name = label if at == step else f"{label} (step {at})"
            ax.plot(np.arange(n + 1), prof, marker="o", ms=3, color=f"C{i % 10}", label=name)
        ax.set_xticks(np.arange(n + 1), [f"b{i}" for i in range(n)] + ["final"], fontsize="small")
        ax.set(
            title=f"step {step}", xlabel="residual stream entering block (final: the final norm)"
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel("residual RMS  sqrt(mean(x^2))")
    if positive:
        axes[0].set_yscale("log")
    fig.suptitle("Residual-stream RMS vs depth (mean over runs)")
    fig.savefig(path, dpi=120)
    return path


def gain_names(rows: list[dict[str, Any]]) -> list[str]:
    """Norms with gain statistics, in depth order: ``block0/norm1``, ``block0/norm2``, ..., ``final/norm_f``."""
    keys = set().union(*(r.keys() for r in diag_rows(rows))) if diag_rows(rows) else set()
    names = [f"block{i}/{m}" for i in range(n_blocks(rows)) for m in ("norm1", "norm2")] + [
        "final/norm_f"
    ]
    return [nm for nm in names if f"diag/{nm}_gain_mean" in keys]


def gain_series(runs: list[list[dict[str, Any]]], name: str) -> tuple[np.ndarray, ...]:
    """``(steps, mean, min, max)`` of one norm's gain over training: per step, the mean over runs of
    ``gain_mean`` and the smallest ``gain_min`` / largest ``gain_max`` of any run."""
    by_step: dict[int, list[tuple[float, float, float]]] = {}
    for rows in runs:
        for r in diag_rows(rows):
            vals = tuple(num(r.get(f"diag/{name}_gain_{s}")) for s in ("mean", "min", "max"))
            if all(math.isfinite(v) for v in vals):
                by_step.setdefault(r["step"], []).append(vals)
    steps = np.array(sorted(by_step), float)
    if not len(steps):
        return steps, steps, steps, steps
    mean = np.array([np.mean([v[0] for v in by_step[s]]) for s in steps])
    lo = np.array([min(v[1] for v in by_step[s]) for s in steps])
    hi = np.array([max(v[2] for v in by_step[s]) for s in steps])
    return steps, mean, lo, hi


def plot_gains(diag: Metrics, path: Path) -> Path | None:
    """Norm gains over training, one panel per variant: per norm (colour = depth) the mean gain, band
    from its smallest to its largest element. None without gain statistics (``norm.affine=false``)."""
    panels = {lab: runs for lab, runs in diag.items() if any(gain_names(rows) for rows in runs)}
    if not panels:
        return None
    from matplotlib import colormaps

    cols = min(2, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6.5 * cols, 4.2 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols, squeeze=False)).ravel()
    cmap = colormaps["viridis"]
    for ax, (label, runs) in zip(axes, panels.items(), strict=False):
        names = max((gain_names(rows) for rows in runs), key=len)
        every = max(1, math.ceil(len(names) / 9))  # at most about 9 legend entries
        for j, name in enumerate(names):
            steps, mean, lo, hi = gain_series(runs, name)
            if not len(steps):
                continue
            color = cmap(j / max(1, len(names) - 1))
            show = j % every == 0 or j == len(names) - 1
            ax.plot(steps, mean, color=color, lw=1.2, label=name if show else None)
            ax.fill_between(steps, lo, hi, color=color, alpha=0.12, linewidth=0)
        ax.set(title=label, xlabel="optimizer step", ylabel="gain (weight)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", ncol=2)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        "Norm gains over training: mean per norm, band min–max of its elements (over runs)"
    )
    fig.savefig(path, dpi=120)
    return path


def write_diag_figures(diag: Metrics, out_dir: Path) -> dict[str, Path | None]:
    """``resid_depth.png`` and ``gains.png`` from ``diag`` (variant label -> one list of metrics rows
    per run); both None when no row has ``diag/`` keys."""
    if not any(diag_rows(rows) for runs in diag.values() for rows in runs):
        return {"resid_depth": None, "gains": None}
    return {
        "resid_depth": plot_resid_depth(diag, out_dir / "resid_depth.png"),
        "gains": plot_gains(diag, out_dir / "gains.png"),
    }


def plot_swept_value(
    points: dict[str, list[tuple[float, list[float]]]], key: str, path: Path
) -> Path | None:
    """Final validation loss (nats/token) against a swept numeric override ``key``: one line per group
    of the other overrides, mean over seeds with a min–max bar. ``points``: line label -> ``(value,
    final losses of its completed runs)``. Log x axis when every value is > 0 and they span >= 100x."""
    points = {lab: sorted((x, v) for x, v in pts if v) for lab, pts in points.items()}
    points = {lab: pts for lab, pts in points.items() if pts}
    if not points:
        return None
    fig = Figure(figsize=(7, 4.8), layout="constrained")
    ax = fig.add_subplot()
    xs_all = [x for pts in points.values() for x, _ in pts]
    for i, (label, pts) in enumerate(points.items()):
        x = np.array([p[0] for p in pts])
        mean = np.array([np.mean(p[1]) for p in pts])
        err = np.array([[m - min(p[1]), max(p[1]) - m] for m, p in zip(mean, pts, strict=True)]).T
        ns = sorted({len(p[1]) for p in pts})
        n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}–{ns[-1]}"
        ax.errorbar(
            x,
            mean,
            yerr=err,
            marker="o",
            ms=4,
            capsize=3,
            color=f"C{i % 10}",
            label=f"{label} ({n})",
        )
    if min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 100:
        ax.set_xscale("log")
    ax.set(
        title=f"Final validation loss vs {key} (mean over seeds, bar: min–max)",
        xlabel=key,
        ylabel="final validation loss (nats/token)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path
