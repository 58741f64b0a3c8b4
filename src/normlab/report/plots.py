"""The report's figures: validation loss, smoothed training loss, the paired validation-loss
difference with its CI band and the margin, and the step-time distribution with robust limits;
the diagnostics and swept-value figures come from :mod:`normlab.report.diag_plots`.

Uses matplotlib's object API (``Figure`` rendered by the Agg canvas), so it neither needs a
display nor changes the pyplot backend of the calling process. Losses in nats/token, times in ms.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from normlab.report.compare import Report
from normlab.report.diag_plots import plot_swept_value, write_diag_figures
from normlab.report.diagnostics import diag_entries
from normlab.report.fair_plots import plot_lr_curve, plot_val_time, plot_val_tokens, zoom_to_losses
from normlab.report.series import aggregate, ema, robust_limits, series
from normlab.report.swept import swept_points

__all__ = ["plot_step_times", "plot_val_diff", "write_diag_figures", "write_figures"]

#: variant label -> one list of metrics.jsonl rows per run
Metrics = dict[str, list[list[dict[str, Any]]]]
#: variant label -> one (steps, values) per run
Curves = dict[str, list[tuple[np.ndarray, np.ndarray]]]
STEP = "optimizer step"


def _band_plot(curves: Curves, path: Path, title: str, ylabel: str) -> Path | None:
    if not any(len(s) for runs in curves.values() for s, _ in runs):
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    drawn = []
    for label, runs in curves.items():
        runs = [c for c in runs if len(c[0])]
        if not runs:
            continue
        steps, mean, lo, hi = aggregate(runs)
        marker = "o" if len(steps) < 30 else None
        line = ax.plot(steps, mean, marker=marker, ms=3, label=f"{label} (n={len(runs)})")[0]
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        drawn += [(steps, lo), (steps, hi)]
    zoom_to_losses(ax, drawn)
    ax.set(title=title, xlabel=STEP, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path


def plot_val_loss(metrics: Metrics, path: Path, corpus: str | None = None) -> Path | None:
    """Validation loss (nats/token) vs step: mean over runs per variant, min–max band; of the
    held-out corpus ``corpus`` (``val/<corpus>/loss``) when given, else the validation split."""
    key = f"val/{corpus}/loss" if corpus else "val/loss"
    curves = {lab: [series(rows, key) for rows in runs] for lab, runs in metrics.items()}
    what = f"Held-out corpus {corpus}: loss" if corpus else "Validation loss"
    title = f"{what} (mean over seeds, band: min–max)"
    return _band_plot(curves, path, title, f"{key} (nats/token)")


def plot_train_loss(metrics: Metrics, path: Path, beta: float = 0.95) -> Path | None:
    """Training loss (nats/token) vs step, each run smoothed by :func:`ema`, then mean and min–max
    over runs."""
    curves = {
        lab: [(s, ema(v, beta)) for s, v in (series(rows, "train/loss") for rows in runs)]
        for lab, runs in metrics.items()
    }
    title = f"Training loss, EMA beta={beta:g} (mean over seeds, band: min–max)"
    return _band_plot(curves, path, title, "training loss (nats/token)")


def plot_step_times(times: dict[str, list[float]], path: Path) -> Path | None:
    """Box plot per variant of post-warm-up step times (ms), all seeds pooled. The y range is
    :func:`~normlab.report.series.robust_limits` of all times; times beyond it are drawn
    as triangles at the edge with their count, so a few outliers (a busy machine) do not squash
    the boxes. None if no data."""
    times = {lab: [x for x in t if math.isfinite(x)] for lab, t in times.items()}
    times = {lab: t for lab, t in times.items() if t}
    if not times:
        return None
    lo, hi = robust_limits([x for t in times.values() for x in t])
    fig = Figure(figsize=(max(6, 1.8 * len(times)), 5), layout="constrained")
    ax = fig.add_subplot()
    ax.boxplot(list(times.values()), flierprops={"markersize": 2})
    ax.set_ylim(lo, hi)
    for i, t in enumerate(times.values(), start=1):
        for edge, n, marker in (
            (hi, sum(x > hi for x in t), "^"),
            (lo, sum(x < lo for x in t), "v"),
        ):
            if n:
                ax.plot([i], [edge], marker=marker, color="C3", ms=7, clip_on=False)
                ax.annotate(
                    f"{n} beyond",
                    (i, edge),
                    xytext=(8, -4),
                    textcoords="offset points",
                    fontsize="x-small",
                    color="C3",
                )
    ticks = [f"{lab}\n({len(t)} steps)" for lab, t in times.items()]
    ax.set_xticks(range(1, len(times) + 1), ticks, fontsize="small")
    ax.set(
        title="Step time per variant (post-warm-up steps, seeds pooled)\n"
        "y range set without outliers; triangles: steps beyond it",
        xlabel="variant",
        ylabel="step time (ms)",
    )
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=120)
    return path


def plot_val_diff(rep: Report, path: Path) -> Path | None:
    """Validation loss of each variant minus the baseline's, paired by seed, against step (and
    tokens seen, on the top axis, when every run consumes the same tokens per step): the
    mean over seeds, its 1−alpha Student t band (where n >= 2) with the 1−2·alpha band inside it
    (the interval the TOST verdict reads, so a verdict and the figure agree), 0 and the ±margin
    lines (nats/token). None without a comparison that has a paired validation step."""
    comps = [c for c in rep.comparisons if len(c["curve"]["step"])]
    if not comps:
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    for i, c in enumerate(comps):
        cur, color = c["curve"], f"C{i % 10}"
        ns = sorted(set(cur["n"].tolist()))
        n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}–{ns[-1]}"
        ax.plot(
            cur["step"], cur["mean"], marker="o", ms=3, color=color, label=f"{c['label']} ({n})"
        )
        ok = np.isfinite(cur["lo"])
        lo, hi = cur["lo"][ok], cur["hi"][ok]
        ax.fill_between(cur["step"][ok], lo, hi, color=color, alpha=0.15, lw=0)
        lo, hi = cur["lo_tost"][ok], cur["hi_tost"][ok]  # inner: the interval TOST reads
        ax.fill_between(cur["step"][ok], lo, hi, color=color, alpha=0.3, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    for sign in (-1, 1):
        ax.axhline(sign * rep.margin, color="grey", ls="--", lw=1)
    ax.plot([], [], color="grey", ls="--", label=f"±margin ({rep.margin:g} nats)")
    conf = f"{100 * (1 - rep.alpha):g}% CI, inner {100 * (1 - 2 * rep.alpha):g}% (TOST)"
    per_step = {r.tokens_per_step for r in rep.runs if r.excluded is None}
    if len(per_step) == 1 and None not in per_step:  # one token count per step: a tokens axis
        k = per_step.pop()
        top = ax.secondary_xaxis("top", functions=(lambda s: s * k, lambda t: t / k))
        top.set_xlabel("tokens seen")
    ax.set(
        title=f"Validation loss, variant − {rep.baseline}\n(mean over seeds; bands: {conf})",
        xlabel=STEP,
        ylabel="validation-loss difference (nats/token)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path


def write_figures(rep: Report, out_dir: Path, beta: float = 0.95) -> dict[str, Path | None]:
    """Write every figure of ``rep`` into ``out_dir``: ``val_loss.png``, ``val_diff.png``,
    ``val_time.png``, ``val_tokens.png``, ``train_loss.png``, ``step_time.png``; for a tuned sweep
    ``lr_curve.png``; per held-out corpus ``val_<name>.png`` (key ``val_<name>``); with ``diag/``
    keys ``resid_depth.png`` and ``gains.png``; for a numeric sweep ``swept.png``. ``beta``: EMA
    of the training loss. Returns name -> path, or None for a figure skipped for lack of data."""
    metrics = {lab: [r.metrics for r in rep.included(lab)] for lab in rep.labels}
    times = {
        lab: [
            float(t)
            for r in rep.included(lab)
            for t in (r.summary or {}).get("step_times_ms") or []
            if t is not None
        ]
        for lab in rep.labels
    }
    figs = {
        "val_loss": plot_val_loss(metrics, out_dir / "val_loss.png"),
        "val_diff": plot_val_diff(rep, out_dir / "val_diff.png"),
        "train_loss": plot_train_loss(metrics, out_dir / "train_loss.png", beta),
        "step_time": plot_step_times(times, out_dir / "step_time.png"),
    }
    for name in rep.heldout.get("heldout", {}):
        figs[f"val_{name}"] = plot_val_loss(metrics, out_dir / f"val_{name}.png", corpus=name)
    included = {lab: rep.included(lab) for lab in rep.labels}
    target = rep.target.get("target", float("nan"))
    figs["val_time"] = plot_val_time(included, target, out_dir / "val_time.png")
    figs["val_tokens"] = plot_val_tokens(included, out_dir / "val_tokens.png")
    if rep.tuned:
        conf = f"{100 * (1 - rep.alpha):g}% CI"
        figs["lr_curve"] = plot_lr_curve(rep.tuned, out_dir / "lr_curve.png", conf)
    entries = diag_entries(rep.labels, rep.runs)
    if entries:
        figs.update(write_diag_figures(entries, out_dir))
    found = swept_points(rep)
    if found is not None:
        figs["swept"] = plot_swept_value(found[1], found[0], out_dir / "swept.png")
    return figs
