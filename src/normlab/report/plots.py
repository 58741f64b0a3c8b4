"""The figure kit of a report (an Agg ``Figure`` written atomically, the not-comparable stamp, the
mean-and-band plot) and the curves every report has. Losses in nats/token.

Why: docs/reports.md
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from normlab.report.paired import Report
from normlab.report.runs import Run, write_atomic
from normlab.report.series import aggregate, ema, loss_limits, series

#: variant label -> one list of metrics.jsonl rows per run
Metrics = dict[str, list[list[dict[str, Any]]]]
#: variant label -> one (steps, values) per run
Curves = dict[str, list[tuple[np.ndarray, np.ndarray]]]
STEP = "optimizer step"
EMA_BETA = 0.95  # training-loss smoothing in the figure, per logged step


def axes(figsize: tuple[float, float] = (8, 5)) -> tuple[Figure, Any]:
    """A new figure (constrained layout, Agg: no display) and its one axes."""
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def zoom_to_losses(ax: Any, curves: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Zoom ``ax`` to ``loss_limits`` of ``(x, loss)`` ``curves``, initial points off the top."""
    lo, hi = loss_limits(curves)
    if math.isfinite(lo) and math.isfinite(hi):
        ax.set_ylim(lo, hi)


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a 120 dpi PNG to ``path`` with ``write_atomic``; returns ``path``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return write_atomic(path, buf.getvalue())


def finish(fig: Figure, ax: Any, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    """Title, axis labels, grid and legend on ``ax``, then ``save``; returns ``path``."""
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, path)


def stamp(fig: Figure, ax: Any, mark: str | None) -> None:
    """Stamp ``mark`` in red above and across the figure, so no crop loses it; nothing when None."""
    if not mark:
        return
    fig.suptitle(mark, color="C3", fontweight="bold", fontsize="medium")
    ax.text(
        0.5,
        0.5,
        "NOT COMPARABLE",
        transform=ax.transAxes,
        ha="center",
        va="center",
        rotation=20,
        fontsize=32,
        color="C3",
        alpha=0.25,
        fontweight="bold",
    )


def band(ax: Any, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: Any, alpha: float) -> None:
    """Shade ``ax`` between ``lo`` and ``hi`` over ``x`` in ``color`` (no edge line)."""
    ax.fill_between(x, lo, hi, color=color, alpha=alpha, linewidth=0)


def band_plot(
    curves: Curves, path: Path, title: str, ylabel: str, xlabel: str = STEP
) -> Path | None:
    """Per label the mean of its runs' curves, a min–max band, colour by place; None if empty."""
    if not any(len(s) for runs in curves.values() for s, _ in runs):
        return None
    fig, ax = axes()
    drawn = []
    for i, (label, runs) in enumerate(curves.items()):
        runs = [c for c in runs if len(c[0])]
        if not runs:
            continue
        x, mean, lo, hi = aggregate(runs)
        marker = "o" if len(x) < 30 else None
        colour = f"C{i % 10}"
        ax.plot(x, mean, color=colour, marker=marker, ms=3, label=f"{label} (n={len(runs)})")
        band(ax, x, lo, hi, colour, 0.2)
        drawn += [(x, lo), (x, hi)]
    zoom_to_losses(ax, drawn)
    return finish(fig, ax, path, title, xlabel, ylabel)


# --- the curves of every report ------------------------------------------------------------------


def plot_val_loss(metrics: Metrics, path: Path, corpus: str | None = None) -> Path | None:
    """Validation loss (nats/token) vs step per variant, of held-out ``corpus`` when given."""
    key = f"val/{corpus}/loss" if corpus else "val/loss"
    curves = {lab: [series(rows, key) for rows in runs] for lab, runs in metrics.items()}
    what = f"Held-out corpus {corpus}: loss" if corpus else "Validation loss"
    title = f"{what} (mean over seeds, band: min–max)"
    return band_plot(curves, path, title, f"{key} (nats/token)")


def plot_train_loss(metrics: Metrics, path: Path, beta: float = 0.95) -> Path | None:
    """Training loss (nats/token) vs step, each run smoothed by ``ema``, mean and band over runs."""
    curves = {
        lab: [(s, ema(v, beta)) for s, v in (series(rows, "train/loss") for rows in runs)]
        for lab, runs in metrics.items()
    }
    title = f"Training loss, EMA beta={beta:g} (mean over seeds, band: min–max)"
    return band_plot(curves, path, title, "training loss (nats/token)")


def plot_val_diff(rep: Report, path: Path) -> Path | None:
    """Paired validation loss variant − baseline vs step: mean, 1−alpha band with the TOST's
    1−2·alpha band inside, 0 and ±margin (nats/token). None without a paired step."""
    comps = [c for c in rep.comparisons if len(c["curve"]["step"])]
    if not comps:
        return None
    fig, ax = axes()
    for i, c in enumerate(comps):
        cur, color = c["curve"], f"C{i % 10}"
        ns = sorted(set(cur["n"].tolist()))
        n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}–{ns[-1]}"
        ax.plot(
            cur["step"], cur["mean"], marker="o", ms=3, color=color, label=f"{c['label']} ({n})"
        )
        ok = np.isfinite(cur["lo"])
        lo, hi = cur["lo"][ok], cur["hi"][ok]
        band(ax, cur["step"][ok], lo, hi, color, 0.15)
        lo, hi = cur["lo_tost"][ok], cur["hi_tost"][ok]  # inner: the interval TOST reads
        band(ax, cur["step"][ok], lo, hi, color, 0.3)
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
    title = f"Validation loss, variant − {rep.baseline}\n(mean over seeds; bands: {conf})"
    return finish(fig, ax, path, title, STEP, "validation-loss difference (nats/token)")


def plot_val_tokens(included: dict[str, list[Run]], path: Path) -> Path | None:
    """Validation loss against tokens seen, mean and band per variant; None without tokens."""
    curves = {
        lab: [
            (s * r.tokens_per_step, v)
            for r in runs
            if r.tokens_per_step
            for s, v in [series(r.metrics, "val/loss")]
        ]
        for lab, runs in included.items()
    }
    title = "Validation loss vs tokens seen (mean over seeds, band: min–max)"
    return band_plot(curves, path, title, "validation loss (nats/token)", xlabel="tokens seen")


def write_curve_figures(
    rep: Report, out_dir: Path, beta: float = EMA_BETA
) -> dict[str, Path | None]:
    """The four curve figures of ``rep``'s included runs into ``out_dir``; name -> path or None."""
    metrics = {lab: [r.metrics for r in rep.included(lab)] for lab in rep.labels}
    included = {lab: rep.included(lab) for lab in rep.labels}
    return {
        "val_loss": plot_val_loss(metrics, out_dir / "val_loss.png"),
        "val_diff": plot_val_diff(rep, out_dir / "val_diff.png"),
        "train_loss": plot_train_loss(metrics, out_dir / "train_loss.png", beta),
        "val_tokens": plot_val_tokens(included, out_dir / "val_tokens.png"),
    }
