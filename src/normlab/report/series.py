"""Metric curves from ``metrics.jsonl`` rows: per-step values, smoothing, the mean over seeds, the
paired difference per step, and axis limits outliers do not set. Losses in nats/token.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.stats import NAN, t_interval

Rows = list[dict[str, Any]]


def ema(values: np.ndarray, beta: float) -> np.ndarray:
    """Bias-corrected EMA as in Adam: m_t = beta·m_{t−1} + (1−beta)·x_t, over (1 − beta^t)."""
    out, m = np.empty(len(values)), 0.0
    for i, x in enumerate(values):
        m = beta * m + (1 - beta) * x
        out[i] = m / (1 - beta ** (i + 1))
    return out


def series(rows: Rows, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` (float arrays, shape ``(k,)``) of the rows that have a finite ``key``."""
    pts = [(r["step"], float(r[key])) for r in rows if r.get(key) is not None and "step" in r]
    pts = [p for p in pts if np.isfinite(p[1])]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Per step over the runs that logged it: ``(steps, mean, min, max)``, each shape ``(k,)``."""
    by_step: dict[float, list[float]] = {}
    for steps, vals in curves:
        for s, v in zip(steps, vals, strict=True):
            by_step.setdefault(float(s), []).append(float(v))
    steps = np.array(sorted(by_step))
    cols = [np.array([f(by_step[s]) for s in steps]) for f in (np.mean, np.min, np.max)]
    return (steps, *cols)


def paired_curve(
    base: dict[Any, Rows], variant: dict[Any, Rows], key: str = "val/loss", alpha: float = 0.05
) -> dict[str, np.ndarray]:
    """Per step, ``key`` variant − baseline by seed: arrays ``step``, ``n``, ``mean``, ``lo``/``hi``
    (1−alpha), ``lo_tost``/``hi_tost`` (1−2·alpha), shape ``(k,)``."""
    by_step: dict[float, list[float]] = {}
    for seed in sorted(set(base) & set(variant), key=str):
        b = dict(zip(*series(base[seed], key), strict=True))
        for s, v in zip(*series(variant[seed], key), strict=True):
            if s in b:
                by_step.setdefault(float(s), []).append(v - b[s])
    steps = sorted(by_step)
    cis = [t_interval(by_step[s], 1 - alpha) for s in steps]
    tost = [t_interval(by_step[s], 1 - 2 * alpha) for s in steps]
    return {
        "lo_tost": np.array([c[0] for c in tost], float),
        "hi_tost": np.array([c[1] for c in tost], float),
        "step": np.array(steps, float),
        "n": np.array([len(by_step[s]) for s in steps], int),
        "mean": np.array([np.mean(by_step[s]) for s in steps], float),
        "lo": np.array([c[0] for c in cis], float),
        "hi": np.array([c[1] for c in cis], float),
    }


def robust_limits(values: list[float], margin: float = 0.1) -> tuple[float, float]:
    """Y limits: Tukey's far fences clipped to the 1st-99th percentiles, padded; nan if empty."""
    v = np.asarray([x for x in values if np.isfinite(x)], float)
    if not v.size:
        return NAN, NAN
    p1, q1, q3, p99 = np.percentile(v, [1, 25, 75, 99])
    lo, hi = max(p1, q1 - 3 * (q3 - q1)), min(p99, q3 + 3 * (q3 - q1))
    pad = margin * (hi - lo) or 0.05 * abs(float(np.median(v))) or 1.0
    return float(lo - pad), float(hi + pad)


def loss_limits(
    curves: list[tuple[np.ndarray, np.ndarray]], pad: float = 0.05
) -> tuple[float, float]:
    """Y limits for loss curves without each curve's first point (when 3+), padded; nan if empty."""
    values = [np.asarray(v, float) for _, v in curves] or [np.empty(0)]
    top = np.concatenate([v[1:] if len(v) >= 3 else v for v in values])
    low = np.concatenate(values)
    top, low = top[np.isfinite(top)], low[np.isfinite(low)]
    if not top.size:
        return NAN, NAN
    lo, hi = float(low.min()), float(top.max())
    margin = pad * (hi - lo) or 0.05 * abs(hi) or 1.0
    return lo - margin, hi + margin


def num(v: Any) -> float:
    """``v`` as a float when it is a finite number, else nan."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else NAN
