"""Metric series from ``metrics.jsonl`` rows: per-step values, smoothing, aggregation over seeds,
the paired difference per step, the step-time checks that say whether sequential step times
can be compared, axis limits, and the per-block diagnostics of ``diag/`` keys (written every
``diag_interval`` steps by the trainer): residual-stream RMS by depth and norm gains.

Rows carry the namespaced names (``train/loss``, ``val/loss``, ``perf/step_time_ms``; see
:data:`normlab.report.runs.METRIC_RENAMES`). Losses in nats/token, times in ms.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from normlab.config.schedule import diag_norm_names
from normlab.report.runs import Run
from normlab.report.stats import NAN, t_interval

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


# --- per-block diagnostics (diag/ keys) ----------------------------------------------------------

RESID_KEY = "diag/block{}/resid_rms"
#: display label -> one list of metrics rows per run
Diag = dict[str, list[Rows]]


def diag_rows(rows: Rows) -> Rows:
    """The metrics rows of diagnosed steps (those with ``diag/block0/resid_rms``), by step."""
    return sorted(
        (r for r in rows if RESID_KEY.format(0) in r and "step" in r), key=lambda r: r["step"]
    )


def n_blocks(rows: Rows) -> int:
    """Number of blocks with a residual RMS in the first diagnosed row (0 without diagnostics)."""
    rows = diag_rows(rows)
    n = 0
    while rows and RESID_KEY.format(n) in rows[0]:
        n += 1
    return n


def num(v: Any) -> float:
    """``v`` as a float when it is a finite number, else nan."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else NAN


def resid_profile(row: dict[str, Any], n: int) -> np.ndarray:
    """Residual RMS entering blocks 0..n-1 and the final norm (shape ``(n+1,)``; nan if missing)."""
    return np.array(
        [num(row.get(RESID_KEY.format(i))) for i in range(n)]
        + [num(row.get("diag/final/resid_rms"))]
    )


def panel_steps(diag: Diag) -> list[int]:
    """First, middle and last diagnosed step over every run (duplicates dropped)."""
    steps = sorted({r["step"] for runs in diag.values() for rows in runs for r in diag_rows(rows)})
    return list(dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]])) if steps else []


def profile_at(runs: list[Rows], step: int, n: int) -> tuple[np.ndarray, int] | None:
    """Mean over runs of :func:`resid_profile` at each run's last diagnosed step <= ``step``, and
    the latest such step; None when no run was diagnosed by then."""
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


def gain_names(rows: Rows) -> list[str]:
    """Norms with gain statistics, in depth order (:func:`normlab.config.schedule.diag_norm_names`:
    ``embedding/norm``, ``block0/attn_in``, ``block0/qk_q``, ..., ``final/norm``)."""
    keys = set().union(*(r.keys() for r in diag_rows(rows))) if diag_rows(rows) else set()
    return [nm for nm in diag_norm_names(n_blocks(rows)) if f"diag/{nm}_gain_mean" in keys]


def gain_series(runs: list[Rows], name: str) -> tuple[np.ndarray, ...]:
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


def diag_entries(labels: list[str], runs: list[Run]) -> Diag:
    """Display label -> metrics rows of each run with ``diag/`` keys, for variants ``labels``.
    Excluded runs (diverged ones above all) are kept, apart, as ``"<label> (excluded)"``: their
    diagnostics show what went wrong."""
    out: Diag = {}
    for lab in labels:
        for excluded in (False, True):
            rows = [
                r.metrics
                for r in runs
                if r.label == lab and (r.excluded is not None) == excluded and diag_rows(r.metrics)
            ]
            if rows:
                out[lab + (" (excluded)" if excluded else "")] = rows
    return out


def _gain_range(row: dict[str, Any]) -> tuple[float, float]:
    lo = [v for k, v in row.items() if k.endswith("_gain_min") and isinstance(v, (int, float))]
    hi = [v for k, v in row.items() if k.endswith("_gain_max") and isinstance(v, (int, float))]
    return (min(lo), max(hi)) if lo and hi else (NAN, NAN)


def _mean_at(rows: Rows, n: int, idx: int) -> float:
    """Mean over ``rows`` of the finite residual RMS at depth ``idx`` (``n``: the final norm)."""
    vals = [x for x in (resid_profile(r, n)[idx] for r in rows) if math.isfinite(x)]
    return float(np.mean(vals)) if vals else NAN


def diag_summary(entries: Diag) -> list[dict[str, Any]]:
    """Per entry, means over runs at each run's first and last diagnosed step: residual RMS entering
    block 0 and entering the final norm, their ratio (growth with depth), the gain range over all
    norms (min of element minima, max of element maxima) and the largest |logit|."""
    out = []
    for label, runs in entries.items():
        firsts = [diag_rows(rows)[0] for rows in runs]
        lasts = [diag_rows(rows)[-1] for rows in runs]
        n = n_blocks(runs[0])
        g = [_gain_range(r) for r in lasts]
        logits = [x for x in (num(r.get("diag/max_logit")) for r in lasts) if math.isfinite(x)]
        b0, fin = _mean_at(lasts, n, 0), _mean_at(lasts, n, n)
        out.append(
            {
                "label": label,
                "runs": len(runs),
                "blocks": n,
                "first_step": min(r["step"] for r in firsts),
                "last_step": max(r["step"] for r in lasts),
                "final_first": _mean_at(firsts, n, n),
                "block0_last": b0,
                "final_last": fin,
                "growth_last": fin / b0 if b0 and math.isfinite(b0) and b0 > 0 else NAN,
                "gain_min": min(x[0] for x in g),
                "gain_max": max(x[1] for x in g),
                "max_logit": max(logits) if logits else NAN,
            }
        )
    return out
