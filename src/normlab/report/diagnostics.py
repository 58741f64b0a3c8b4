"""Per-block diagnostics read from ``diag/`` keys of ``metrics.jsonl`` (written every
``diag_interval`` steps by the trainer): residual-stream RMS by depth and norm gains.

Pure functions of metrics rows; the figures are in :mod:`normlab.report.diag_plots`, the section
in :mod:`normlab.report.sections`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from normlab.config.schedule import diag_norm_names
from normlab.report.runs import Run

NAN = float("nan")
RESID_KEY = "diag/block{}/resid_rms"
Rows = list[dict[str, Any]]
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
