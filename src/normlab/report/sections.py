"""Study sections of ``normlab-report``: what happened to each variant, per-block diagnostics, and
final validation loss against a swept numeric override (``norm.eps``, ``optim.warmup_steps``).

Like :mod:`normlab.report`, a pure reader of run dirs: it sees :class:`~normlab.report.Report` and
its runs' ``metrics.jsonl`` rows and ``summary.json``, never model code. Losses in nats/token.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from normlab.report.core import Report, Run

NAN = float("nan")


# --- reading diag/ rows ----------------------------------------------------------------------------

RESID_KEY = "diag/block{}/resid_rms"


def diag_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The metrics rows of diagnosed steps (those with ``diag/block0/resid_rms``), by step."""
    return sorted(
        (r for r in rows if RESID_KEY.format(0) in r and "step" in r), key=lambda r: r["step"]
    )


def n_blocks(rows: list[dict[str, Any]]) -> int:
    """Number of blocks with a residual RMS in the first diagnosed row (0 without diagnostics)."""
    rows = diag_rows(rows)
    n = 0
    while rows and RESID_KEY.format(n) in rows[0]:
        n += 1
    return n


def num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan")


def resid_profile(row: dict[str, Any], n: int) -> np.ndarray:
    """Residual RMS entering blocks 0..n-1 and the final norm (n+1 values; nan where missing)."""
    return np.array(
        [num(row.get(RESID_KEY.format(i))) for i in range(n)]
        + [num(row.get("diag/final/resid_rms"))]
    )


def _f(x: Any, spec: str = ".4f") -> str:
    return (
        "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)
    )


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


# --- outcome per variant -------------------------------------------------------------------------


def _what_happened(run: Run) -> str:
    s = run.summary or {}
    if run.excluded is None:
        return "completed"
    if s.get("status") == "diverged":
        reason = s.get("diverged_reason")
        last = s.get("last_finite_loss")
        extra = "; ".join(
            x
            for x in (
                reason,
                f"last finite train loss {_f(last, '.3f')}" if last is not None else None,
            )
            if x
        )
        return f"diverged at step {s.get('diverged_at_step', '?')}" + (
            f" ({extra})" if extra else ""
        )
    return run.excluded


def outcome_rows(rep: Report) -> list[list[Any]]:
    """One row per variant (baseline first): runs, completed, what happened to the others (per seed),
    mean final validation loss, and the paired mean difference to the baseline with its n."""
    comp = {c["label"]: c for c in rep.comparisons}
    rows = []
    for v in rep.variants:
        runs = [r for r in rep.runs if r.label == v["label"]]
        others = [f"seed {r.seed}: {_what_happened(r)}" for r in runs if r.excluded is not None]
        c = comp.get(v["label"])
        vs = (
            "baseline"
            if v["label"] == rep.baseline
            else (
                f"{_f(c['mean'], '+.4f')} (n = {c['n']})"
                if c and c["n"]
                else "n/a (no seed completed in both)"
            )
        )
        rows.append(
            [f"`{v['label']}`", len(runs), v["n"], "; ".join(others) or "-", _f(v["mean"]), vs]
        )
    return rows


def render_outcome(rep: Report) -> list[str]:
    """ "## Outcome per variant", shown when the sweep has more than two variants or excluded runs."""
    if len(rep.variants) <= 2 and all(r.excluded is None for r in rep.runs):
        return []
    L = [
        "",
        "## Outcome per variant",
        "",
        "What happened to every run, by variant. Final validation loss is the mean over completed runs; "
        f"the difference to `{rep.baseline}` is the mean of the per-seed differences (variant − baseline).",
        "",
    ]
    return L + _table(
        ["variant", "runs", "completed", "not completed", "final val loss", "vs baseline"],
        outcome_rows(rep),
    )


# --- diagnostics ------------------------------------------------------------------------------------


def diag_entries(rep: Report) -> dict[str, list[list[dict[str, Any]]]]:
    """Display label -> metrics rows of each run with ``diag/`` keys. Excluded runs (diverged ones
    above all) are kept, apart, as ``"<label> (excluded)"``: their diagnostics show what went wrong."""
    out: dict[str, list[list[dict[str, Any]]]] = {}
    for v in rep.variants:
        for excluded in (False, True):
            runs = [
                r.metrics
                for r in rep.runs
                if r.label == v["label"]
                and (r.excluded is not None) == excluded
                and diag_rows(r.metrics)
            ]
            if runs:
                out[v["label"] + (" (excluded)" if excluded else "")] = runs
    return out


def _gain_range(row: dict[str, Any]) -> tuple[float, float]:
    lo = [v for k, v in row.items() if k.endswith("_gain_min") and isinstance(v, (int, float))]
    hi = [v for k, v in row.items() if k.endswith("_gain_max") and isinstance(v, (int, float))]
    return (min(lo), max(hi)) if lo and hi else (NAN, NAN)


def _mean_at(rows: list[dict[str, Any]], n: int, idx: int) -> float:
    """Mean over ``rows`` of the finite residual RMS at depth ``idx`` (``n``: the final norm)."""
    vals = [x for x in (resid_profile(r, n)[idx] for r in rows) if math.isfinite(x)]
    return float(np.mean(vals)) if vals else NAN


def diag_summary(entries: dict[str, list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per entry, means over runs at each run's first and last diagnosed step: residual RMS entering
    block 0 and entering the final norm, their ratio (growth with depth), the gain range over all
    norms (min of element minima, max of element maxima) and the largest |logit|."""
    out = []
    for label, runs in entries.items():
        firsts = [diag_rows(rows)[0] for rows in runs]
        lasts = [diag_rows(rows)[-1] for rows in runs]
        n = n_blocks(runs[0])

        g = [_gain_range(r) for r in lasts]
        logits = [
            r.get("diag/max_logit")
            for r in lasts
            if isinstance(r.get("diag/max_logit"), (int, float))
        ]
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


def render_diagnostics(rep: Report) -> list[str]:
    """ "## Diagnostics" with the figures and :func:`diag_summary`; nothing without ``diag/`` keys."""
    summary = diag_summary(diag_entries(rep))
    if not summary:
        return []
    L = [
        "",
        "## Diagnostics (per-block statistics, `diag/` keys)",
        "",
        "Every `diag_interval` steps the trainer records the RMS of the residual stream entering each block "
        "and the final norm, and each norm's gain (see `normlab.diagnostics`). Excluded runs are shown apart, "
        "as `(excluded)`: for a diverged run these are the last statistics before it stopped. Values below are "
        "means over runs; growth = RMS entering the final norm / RMS entering block 0.",
        "",
    ]
    L += _table(
        [
            "variant",
            "runs",
            "diag steps",
            "RMS into final norm (first step)",
            "RMS into block 0 (last)",
            "RMS into final norm (last)",
            "growth (last)",
            "gain min–max (last)",
            "max abs logit (last)",
        ],
        [
            [
                f"`{s['label']}`",
                s["runs"],
                f"{s['first_step']}–{s['last_step']}",
                _f(s["final_first"], ".3g"),
                _f(s["block0_last"], ".3g"),
                _f(s["final_last"], ".3g"),
                _f(s["growth_last"], ".2f"),
                f"{_f(s['gain_min'], '.3f')}–{_f(s['gain_max'], '.3f')}",
                _f(s["max_logit"], ".3g"),
            ]
            for s in summary
        ],
    )
    titles = {
        "resid_depth": "Residual-stream RMS vs depth (first, middle, last diagnosed step)",
        "gains": "Norm gains over training (mean per norm, band min–max)",
    }
    L.append("")
    L += [
        f"![{t}]({rep.figures[k].name})\n" if rep.figures.get(k) else f"- {t}: no data\n"
        for k, t in titles.items()
    ]
    return L


# --- final loss vs a swept numeric override -----------------------------------------------------------


def _number(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def swept_numeric(labels: list[str]) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """The numeric override that varies most across variant labels, and per label its value and the
    label of the other overrides (the line it belongs to; ``"all"`` when none). None when no override
    with at least two numeric values is set in every label (e.g. ``norm=layer`` vs ``norm=rms``)."""
    parsed = {}
    for lab in labels:
        parts = [o.split("=", 1) for o in lab.split(",")]
        if not parts or any(len(p) != 2 for p in parts):
            return None
        parsed[lab] = dict(parts)
    if not parsed:
        return None
    keys = sorted(set.intersection(*(set(p) for p in parsed.values())))
    numeric = [k for k in keys if all(_number(p[k]) is not None for p in parsed.values())]
    numeric = [k for k in numeric if len({_number(p[k]) for p in parsed.values()}) >= 2]
    if not numeric:
        return None
    key = max(
        numeric, key=lambda k: (len({_number(p[k]) for p in parsed.values()}), -keys.index(k))
    )
    return key, {
        lab: (
            _number(p[key]),
            ",".join(f"{k}={v}" for k, v in sorted(p.items()) if k != key) or "all",
        )
        for lab, p in parsed.items()
    }


def swept_points(rep: Report) -> tuple[str, dict[str, list[tuple[float, list[float]]]]] | None:
    """``(key, line label -> [(value, final losses of the completed runs)]``) for :func:`swept_numeric`."""
    found = swept_numeric([v["label"] for v in rep.variants])
    if found is None:
        return None
    key, where = found
    points: dict[str, list[tuple[float, list[float]]]] = {}
    for lab, (x, line) in where.items():
        points.setdefault(line, []).append((x, [r.final_val_loss for r in rep.included(lab)]))
    return key, points


def render_swept(rep: Report) -> list[str]:
    """ "## Final validation loss vs <key>": a value x group table and the figure, or nothing."""
    found = swept_points(rep)
    if found is None:
        return []
    key, points = found
    lines = list(points)
    values = sorted({x for pts in points.values() for x, _ in pts})
    cell = {(line, x): v for line, pts in points.items() for x, v in pts}

    def fmt(v):
        if v is None:
            return "-"
        return f"{np.mean(v):.4f} (n = {len(v)})" if v else "no completed run"

    L = [
        "",
        f"## Final validation loss vs `{key}`",
        "",
        f"Mean final validation loss (nats/token) of the completed runs, by `{key}` (rows) and the other "
        "overrides (columns).",
        "",
    ]
    L += _table(
        [f"`{key}`", *(f"`{ln}`" for ln in lines)],
        [[f"{x:g}", *(fmt(cell.get((ln, x))) for ln in lines)] for x in values],
    )
    fig = rep.figures.get("swept")
    L += [
        "",
        f"![Final validation loss vs {key}]({fig.name})"
        if fig
        else f"- Final validation loss vs {key}: no data",
    ]
    return L


def write_study_figures(rep: Report, out: Path) -> dict[str, Path | None]:
    """The diagnostics figures (when any run has ``diag/`` keys) and the swept-value figure (when the
    variants differ by a numeric override); keys ``resid_depth``, ``gains``, ``swept``."""
    from normlab.report.plots import plot_swept_value, write_diag_figures

    figs: dict[str, Path | None] = {}
    entries = diag_entries(rep)
    if entries:
        figs.update(write_diag_figures(entries, out))
    found = swept_points(rep)
    if found is not None:
        figs["swept"] = plot_swept_value(found[1], found[0], out / "swept.png")
    return figs
