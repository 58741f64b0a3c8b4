"""Study sections of ``report.md``: what happened to each variant, per-block diagnostics, and
final validation loss against a swept numeric override. Each returns Markdown lines ([] when it
has nothing to say). Losses in nats/token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.report.compare import Report
from normlab.report.diagnostics import diag_entries, diag_summary
from normlab.report.runs import Run
from normlab.report.swept import swept_numeric, swept_points
from normlab.report.text import figure_lines, fmt, table

__all__ = ["outcome_rows", "render_diagnostics", "render_outcome", "render_swept", "swept_numeric"]


def _what_happened(run: Run) -> str:
    s = run.summary or {}
    if run.excluded is None:
        return "completed"
    if s.get("status") != "diverged":
        return run.excluded
    last = s.get("last_finite_loss")
    parts = [
        s.get("diverged_reason"),
        f"last finite train loss {fmt(last, '.3f')}" if last is not None else None,
    ]
    extra = "; ".join(p for p in parts if p)
    return f"diverged at step {s.get('diverged_at_step', '?')}" + (f" ({extra})" if extra else "")


def outcome_rows(rep: Report) -> list[list[Any]]:
    """One row per variant (baseline first): runs, completed, what happened to the others (per
    seed), mean final validation loss, and the paired mean difference to the baseline with its n."""
    comp = {c["label"]: c for c in rep.comparisons}
    rows = []
    for v in rep.variants:
        runs = [r for r in rep.runs if r.label == v["label"]]
        others = [f"seed {r.seed}: {_what_happened(r)}" for r in runs if r.excluded is not None]
        c = comp.get(v["label"])
        if v["label"] == rep.baseline:
            vs = "baseline"
        elif c and c["n"]:
            vs = f"{fmt(c['mean'], '+.4f')} (n = {c['n']})"
        else:
            vs = "n/a (no seed completed in both)"
        rows.append(
            [f"`{v['label']}`", len(runs), v["n"], "; ".join(others) or "-", fmt(v["mean"]), vs]
        )
    return rows


def render_outcome(rep: Report) -> list[str]:
    """``## Outcome per variant``, shown when there are more than two variants or excluded runs."""
    if len(rep.variants) <= 2 and all(r.excluded is None for r in rep.runs):
        return []
    head = ["variant", "runs", "completed", "not completed", "final val loss", "vs baseline"]
    return [
        "",
        "## Outcome per variant",
        "",
        "What happened to every run, by variant. Final validation loss (nats/token) is the mean "
        f"over completed runs; the difference to `{rep.baseline}` is the mean of the per-seed "
        "differences (variant − baseline).",
        "",
        *table(head, outcome_rows(rep)),
    ]


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
    """``## Diagnostics`` with the figures and :func:`diag_summary`; nothing without ``diag/``."""
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
    titles = {
        "resid_depth": "Residual-stream RMS vs depth (first, middle, last diagnosed step)",
        "gains": "Norm gains over training (mean per norm, band min–max)",
    }
    return [
        "",
        "## Diagnostics (per-block statistics, `diag/` keys)",
        "",
        "Every `diag_interval` steps the trainer records the RMS of the residual stream entering "
        "each block and the final norm, and each norm's gain (see `normlab.training.diagnostics`). "
        "Excluded runs are shown apart, as `(excluded)`: for a diverged run these are the last "
        "statistics before it stopped. Values below are means over runs; growth = RMS entering the "
        "final norm / RMS entering block 0.",
        "",
        *table(DIAG_HEADER, rows),
        "",
        *figure_lines(rep.figures, titles),
    ]


def _cell(v: list[float] | None) -> str:
    if v is None:
        return "-"
    return f"{np.mean(v):.4f} (n = {len(v)})" if v else "no completed run"


def render_swept(rep: Report) -> list[str]:
    """``## Final validation loss vs <key>``: a value x group table and the figure, or nothing."""
    found = swept_points(rep)
    if found is None:
        return []
    key, points = found
    lines = list(points)
    values = sorted({x for pts in points.values() for x, _ in pts})
    cell = {(line, x): v for line, pts in points.items() for x, v in pts}
    fig = rep.figures.get("swept")
    return [
        "",
        f"## Final validation loss vs `{key}`",
        "",
        f"Mean final validation loss (nats/token) of the completed runs, by `{key}` (rows) and the "
        "other overrides (columns).",
        "",
        *table(
            [f"`{key}`", *(f"`{ln}`" for ln in lines)],
            [[f"{x:g}", *(_cell(cell.get((ln, x))) for ln in lines)] for x in values],
        ),
        "",
        f"![Final validation loss vs {key}]({fig.name})"
        if fig
        else f"- Final validation loss vs {key}: no data",
    ]
