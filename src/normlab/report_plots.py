"""Figures for ``normlab-report``: validation loss, smoothed training loss and step-time distribution.

Uses matplotlib's object API (``Figure`` rendered by the Agg canvas), so it neither needs a display
nor changes the pyplot backend of the calling process. Losses in nats/token, times in ms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

Metrics = dict[str, list[list[dict[str, Any]]]]  # variant label -> one list of metrics.jsonl rows per run
Curves = dict[str, list[tuple[np.ndarray, np.ndarray]]]  # variant label -> one (steps, values) per run


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
    curves = {lab: [(s, ema(v, beta)) for s, v in (series(rows, "train/loss") for rows in runs)]
              for lab, runs in metrics.items()}
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
    ax.set(title="Step time per variant (post-warm-up steps, seeds pooled)", ylabel="step time (ms)")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=120)
    return path


def write_figures(metrics: Metrics, times: dict[str, list[float]], out_dir: Path,
                  beta: float = 0.95) -> dict[str, Path | None]:
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
