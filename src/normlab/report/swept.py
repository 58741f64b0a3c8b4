"""A swept value: when the variants differ by one numeric override, the final validation loss
against it; its section and ``swept.png``.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from normlab.report.paired import Report
from normlab.report.plots import axes, finish
from normlab.report.text import figure_lines, method, table

#: line label -> [(swept value, final losses of the completed runs)]
Points = dict[str, list[tuple[float, list[float]]]]


def _number(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def swept_numeric(labels: list[str]) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """The numeric override varying most across labels, per label its value and line; or None."""
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

    def spread(k: str) -> tuple[int, int]:
        return len({_number(p[k]) for p in parsed.values()}), -keys.index(k)

    key = max(numeric, key=spread)
    return key, {
        lab: (
            _number(p[key]),
            ",".join(f"{k}={v}" for k, v in sorted(p.items()) if k != key) or "all",
        )
        for lab, p in parsed.items()
    }


def swept_points(rep: Report) -> tuple[str, Points] | None:
    """``(key, line -> [(value, final losses)])`` of ``swept_numeric``, or None."""
    found = swept_numeric(rep.labels)
    if found is None:
        return None
    key, where = found
    points: Points = {}
    for lab, (x, line) in where.items():
        points.setdefault(line, []).append((x, [r.final_val_loss for r in rep.included(lab)]))
    return key, points


# --- the section and the figure ------------------------------------------------------------------


def _cell(v: list[float] | None) -> str:
    """A cell of the swept-value table: the mean of the final losses with n."""
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
    title = f"Final validation loss vs {key}"
    caption = f"{title}: mean over seeds, bar min–max, one line per group of other overrides."
    return [
        "",
        f"## Final validation loss vs `{key}`",
        "",
        f"Mean final validation loss (nats/token) of the completed runs, by `{key}` (rows) and the "
        "other overrides (columns). " + method("swept-value"),
        "",
        *table(
            [f"`{key}`", *(f"`{ln}`" for ln in lines)],
            [[f"{x:g}", *(_cell(cell.get((ln, x))) for ln in lines)] for x in values],
        ),
        "",
        *figure_lines(rep.figures, {"swept": (title, caption)}),
    ]


def plot_swept_value(
    points: dict[str, list[tuple[float, list[float]]]], key: str, path: Path
) -> Path | None:
    """Final loss against swept ``key``: mean and min–max bar per line, log x when it spans 100x."""
    points = {lab: sorted((x, v) for x, v in pts if v) for lab, pts in points.items()}
    points = {lab: pts for lab, pts in points.items() if pts}
    if not points:
        return None
    fig, ax = axes((7, 4.8))
    xs_all = [x for pts in points.values() for x, _ in pts]
    for i, (label, pts) in enumerate(points.items()):
        x = np.array([p[0] for p in pts])
        mean = np.array([np.mean(p[1]) for p in pts])
        err = np.array([[m - min(p[1]), max(p[1]) - m] for m, p in zip(mean, pts, strict=True)]).T
        ns = sorted({len(p[1]) for p in pts})
        n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}–{ns[-1]}"
        ax.errorbar(
            x,
            mean,
            yerr=err,
            marker="o",
            ms=4,
            capsize=3,
            color=f"C{i % 10}",
            label=f"{label} ({n})",
        )
    if min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 100:
        ax.set_xscale("log")
    title = f"Final validation loss vs {key} (mean over seeds, bar: min–max)"
    return finish(fig, ax, path, title, key, "final validation loss (nats/token)")


def swept_figure(rep: Report, out_dir: Path) -> dict[str, Path | None]:
    """``swept.png`` when the variants differ by one numeric override; else nothing."""
    found = swept_points(rep)
    if found is None:
        return {}
    return {"swept": plot_swept_value(found[1], found[0], out_dir / "swept.png")}
