"""Final validation loss against a swept numeric override (``norm.eps``, ``optim.warmup_steps``):
which override it is, and the points per line of the other overrides."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from normlab.report.compare import Report

Points = dict[str, list[tuple[float, list[float]]]]


def _number(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def swept_numeric(labels: list[str]) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """The numeric override that varies most across variant labels, and per label its value and the
    label of the other overrides (the line it belongs to; ``"all"`` when none). None when no
    override with at least two numeric values is set in every label (``norm=layer`` vs
    ``norm=rms``)."""
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
    """``(key, line label -> [(value, final losses of the completed runs)])`` for
    :func:`swept_numeric` of the report's variants; None when nothing numeric is swept."""
    found = swept_numeric(rep.labels)
    if found is None:
        return None
    key, where = found
    points: Points = {}
    for lab, (x, line) in where.items():
        points.setdefault(line, []).append((x, [r.final_val_loss for r in rep.included(lab)]))
    return key, points
