"""Figures of the diagnostics (residual-stream RMS vs depth, norm gains over training) and of
final validation loss against a swept numeric override. Matplotlib's object API (Agg canvas, no
display). Losses in nats/token.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from normlab.report.diagnostics import (
    Diag,
    diag_rows,
    gain_names,
    gain_series,
    n_blocks,
    panel_steps,
    profile_at,
)


def plot_resid_depth(diag: Diag, path: Path) -> Path | None:
    """Residual-stream RMS vs depth, one panel per step (first, middle, last diagnosed), one line
    per variant (mean over its runs). A variant not diagnosed at a panel's step shows its latest
    earlier diagnosed step, named in the legend. None without diagnostics."""
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


def plot_gains(diag: Diag, path: Path) -> Path | None:
    """Norm gains over training, one panel per variant: per norm (colour = depth) the mean gain,
    band from its smallest to its largest element. None without gain statistics
    (``norm.affine=false``)."""
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


def write_diag_figures(diag: Diag, out_dir: Path) -> dict[str, Path | None]:
    """``resid_depth.png`` and ``gains.png`` from ``diag`` (variant label -> one list of metrics
    rows per run); both None when no row has ``diag/`` keys."""
    if not any(diag_rows(rows) for runs in diag.values() for rows in runs):
        return {"resid_depth": None, "gains": None}
    return {
        "resid_depth": plot_resid_depth(diag, out_dir / "resid_depth.png"),
        "gains": plot_gains(diag, out_dir / "gains.png"),
    }


def plot_swept_value(
    points: dict[str, list[tuple[float, list[float]]]], key: str, path: Path
) -> Path | None:
    """Final validation loss (nats/token) against a swept numeric override ``key``: one line per
    group of the other overrides, mean over seeds with a min–max bar. ``points``: line label ->
    ``(value, final losses of its completed runs)``. Log x axis when every value is > 0 and they
    span >= 100x."""
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
