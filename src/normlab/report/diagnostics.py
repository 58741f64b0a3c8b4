"""Per-block diagnostics (``diag/`` keys): residual RMS by depth and norm gains per variant,
excluded runs apart; their section, ``resid_depth.png`` and ``gains.png``.

Why: docs/reports.md
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from normlab.config.schedule import diag_norm_names
from normlab.report import plots
from normlab.report.paired import Report
from normlab.report.plots import band
from normlab.report.runs import Run
from normlab.report.series import Rows, num
from normlab.report.stats import NAN
from normlab.report.text import figure_lines, fmt, method, table

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


def resid_profile(row: dict[str, Any], n: int) -> np.ndarray:
    """Residual RMS entering blocks 0..n-1 and the final norm, shape ``(n+1,)``; nan if missing."""
    return np.array(
        [num(row.get(RESID_KEY.format(i))) for i in range(n)]
        + [num(row.get("diag/final/resid_rms"))]
    )


def panel_steps(diag: Diag) -> list[int]:
    """First, middle and last diagnosed step over every run (duplicates dropped)."""
    steps = sorted({r["step"] for runs in diag.values() for rows in runs for r in diag_rows(rows)})
    return list(dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]])) if steps else []


def profile_at(runs: list[Rows], step: int, n: int) -> tuple[np.ndarray, int] | None:
    """Mean ``resid_profile`` at each run's last diagnosed step <= ``step``, that step; or None."""
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
    """Norms with gain statistics, in depth order (``diag_norm_names``)."""
    keys = set().union(*(r.keys() for r in diag_rows(rows))) if diag_rows(rows) else set()
    return [nm for nm in diag_norm_names(n_blocks(rows)) if f"diag/{nm}_gain_mean" in keys]


def gain_series(runs: list[Rows], name: str) -> tuple[np.ndarray, ...]:
    """``(steps, mean, min, max)`` of one norm's gain over training, over runs."""
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
    """Label -> rows per run with ``diag/`` keys; excluded runs as ``"<label> (excluded)"``."""
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
    """Per entry, run means at first and last diagnosed step: residual RMS in and out, growth, gain
    range, largest |logit|."""
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


# --- the section and the figures -----------------------------------------------------------------


DIAG_HEADER = [
    "variant",
    "runs",
    "diag steps",
    "RMS into final norm (first step)",
    "RMS into block 0 (last)",
    "RMS into final norm (last)",
    "growth (last)",
    "gain min–max (last)",
    "max abs logit (last)",
]


def render_diagnostics(rep: Report) -> list[str]:
    """``## Diagnostics`` with the figures and ``diag_summary``; nothing without ``diag/``."""
    summary = diag_summary(diag_entries(rep.labels, rep.runs))
    if not summary:
        return []
    rows = [
        [
            f"`{s['label']}`",
            s["runs"],
            f"{s['first_step']}–{s['last_step']}",
            fmt(s["final_first"], ".3g"),
            fmt(s["block0_last"], ".3g"),
            fmt(s["final_last"], ".3g"),
            fmt(s["growth_last"], ".2f"),
            f"{fmt(s['gain_min'], '.3f')}–{fmt(s['gain_max'], '.3f')}",
            fmt(s["max_logit"], ".3g"),
        ]
        for s in summary
    ]
    captions = {
        "resid_depth": (
            "Residual-stream RMS vs depth",
            "Residual-stream RMS vs depth at the first, middle and last diagnosed step, mean "
            "over runs.",
        ),
        "gains": (
            "Norm gains over training",
            "Norm gains over training: mean per norm, band min–max of its elements.",
        ),
    }
    return [
        "",
        "## Diagnostics (per-block statistics, `diag/` keys)",
        "",
        "Means over runs; excluded runs apart, as `(excluded)`; growth = RMS entering the final "
        "norm / RMS entering block 0. " + method("diagnostics"),
        "",
        *table(DIAG_HEADER, rows),
        "",
        *figure_lines(rep.figures, captions),
    ]


def plot_resid_depth(diag: Diag, path: Path) -> Path | None:
    """Residual RMS vs depth, a panel per step (first, middle, last), a line per variant."""
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
    return plots.save(fig, path)  # the one writer of figure files


def plot_gains(diag: Diag, path: Path) -> Path | None:
    """Norm gains over training, a panel per variant, a band per norm; None without gains."""
    panels = {lab: runs for lab, runs in diag.items() if any(gain_names(rows) for rows in runs)}
    if not panels:
        return None
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
            band(ax, steps, lo, hi, color, 0.12)
        ax.set(title=label, xlabel="optimizer step", ylabel="gain (weight)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", ncol=2)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        "Norm gains over training: mean per norm, band min–max of its elements (over runs)"
    )
    return plots.save(fig, path)  # the one writer of figure files


def write_diag_figures(diag: Diag, out_dir: Path) -> dict[str, Path | None]:
    """``resid_depth.png`` and ``gains.png`` of label -> rows per run (None without ``diag/``)."""
    if not any(diag_rows(rows) for runs in diag.values() for rows in runs):
        return {"resid_depth": None, "gains": None}
    return {
        "resid_depth": plot_resid_depth(diag, out_dir / "resid_depth.png"),
        "gains": plot_gains(diag, out_dir / "gains.png"),
    }


def diagnostics_figures(rep: Report, out_dir: Path) -> dict[str, Path | None]:
    """``write_diag_figures`` of ``rep``'s diagnosed runs; nothing when none has ``diag/`` keys."""
    entries = diag_entries(rep.labels, rep.runs)
    return write_diag_figures(entries, out_dir) if entries else {}
