"""Metric series from ``metrics.jsonl`` rows: per-step values, smoothing, aggregation over seeds,
the paired difference per step, and the step-time checks that say whether sequential step times
can be compared.

Rows carry the namespaced names (``train/loss``, ``val/loss``, ``perf/step_time_ms``; see
:data:`normlab.report.runs.METRIC_RENAMES`). Losses in nats/token, times in ms.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.report.stats import t_interval

NAN = float("nan")
Rows = list[dict[str, Any]]

#: Sequential step times are flagged as not comparable when, in any run of the comparison:
#: p90 / median of its post-warm-up step times > SPREAD_LIMIT (the machine was busy part of the
#: time), or the median of its second half differs from the median of its first half by more than
#: DRIFT_LIMIT (relative; the machine changed during the run); or when, within one variant, the
#: largest run median / the smallest > BETWEEN_LIMIT (the machine changed between runs of one
#: config). A run with fewer than MIN_STEPS measured steps is not checked, and says so.
SPREAD_LIMIT = 1.5
DRIFT_LIMIT = 0.20
BETWEEN_LIMIT = 1.5
MIN_STEPS = 4


def ema(values: np.ndarray, beta: float) -> np.ndarray:
    """Bias-corrected exponential moving average (as in Adam): m_t = beta·m_{t−1} + (1−beta)·x_t,
    returned as m_t / (1 − beta^t); units of ``values``."""
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
    """Per step, the difference variant − baseline of ``key`` paired by seed (``base``,
    ``variant``: seed -> metrics rows), over the seeds where both logged that step.

    Returns arrays of shape ``(k,)``: ``step``, ``n`` (pairs), ``mean``, ``lo``, ``hi`` (the 1−alpha
    Student t interval; nan where n < 2), ``lo_tost``, ``hi_tost`` (the 1−2·alpha interval, the one
    TOST's verdict reads), in the unit of ``key``.
    """
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


def timing_check(times_ms: list[float]) -> dict[str, Any]:
    """One run's post-warm-up step times (ms): ``median``, ``spread`` (p90/median), ``drift``
    (median of the second half / median of the first half − 1) and ``problems``: the rules of
    :data:`SPREAD_LIMIT` and :data:`DRIFT_LIMIT` it breaks, as text (``checked`` False and no
    problem below :data:`MIN_STEPS` steps)."""
    t = np.asarray([x for x in times_ms if x is not None and np.isfinite(x)], float)
    out: dict[str, Any] = {"steps": int(t.size), "median": NAN, "spread": NAN, "drift": NAN}
    if t.size < MIN_STEPS:
        return {**out, "checked": False, "problems": []}
    half = t.size // 2
    med = float(np.median(t))
    out |= {
        "median": med,
        "spread": float(np.percentile(t, 90)) / med,
        "drift": float(np.median(t[half:]) / np.median(t[:half]) - 1),
    }
    problems = []
    if out["spread"] > SPREAD_LIMIT:
        problems.append(f"p90/median {out['spread']:.2f} > {SPREAD_LIMIT:g}")
    if abs(out["drift"]) > DRIFT_LIMIT:
        problems.append(
            f"median shift {out['drift']:+.0%} between halves (limit ±{DRIFT_LIMIT:.0%})"
        )
    return {**out, "checked": True, "problems": problems}


def between_runs_problem(medians_ms: list[float]) -> str | None:
    """The :data:`BETWEEN_LIMIT` rule for the run medians (ms) of one variant, or None."""
    m = [x for x in medians_ms if np.isfinite(x) and x > 0]
    if len(m) < 2 or max(m) / min(m) <= BETWEEN_LIMIT:
        return None
    return f"run medians span {max(m) / min(m):.2f}x > {BETWEEN_LIMIT:g}x"


def robust_limits(values: list[float], margin: float = 0.1) -> tuple[float, float]:
    """Y-axis limits that outliers do not set: from max(1st percentile, Q1 − 3·IQR) to
    min(99th percentile, Q3 + 3·IQR) (Tukey's far-out fences), widened by ``margin`` of that range
    on each side (5% of the median when the range is 0). Values outside are for the plot to mark at
    the edge. Units of ``values``; ``(nan, nan)`` if there is no finite value."""
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
    """Y-axis limits for loss curves that the initial model does not set: each curve's first
    point (step 0: ln(vocab) for an untrained model, 2-3x the final loss) is left out of the
    upper limit when the curve has 3 points or more; the lower limit is the minimum of every
    point. Widened by ``pad`` of the range on each side. Units of the values (nats/token);
    ``(nan, nan)`` without a finite value. The first point still is drawn, off the top."""
    values = [np.asarray(v, float) for _, v in curves] or [np.empty(0)]
    top = np.concatenate([v[1:] if len(v) >= 3 else v for v in values])
    low = np.concatenate(values)
    top, low = top[np.isfinite(top)], low[np.isfinite(low)]
    if not top.size:
        return NAN, NAN
    lo, hi = float(low.min()), float(top.max())
    margin = pad * (hi - lo) or 0.05 * abs(hi) or 1.0
    return lo - margin, hi + margin
