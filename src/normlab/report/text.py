"""Markdown text helpers shared by the report's sections: numbers, intervals, tables."""

from __future__ import annotations

import math
from typing import Any


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt(x: Any, spec: str = ".4f") -> str:
    """``x`` formatted by ``spec``; ``"n/a"`` for None and non-finite floats."""
    return "n/a" if _missing(x) else format(x, spec)


def fmt_power(p: Any) -> str:
    """A power (probability) as a percentage, ``">99%"`` above 0.99 and ``"<1%"`` below 0.01:
    a power computed from an estimated std is not known to the last percent."""
    if _missing(p):
        return "n/a"
    return ">99%" if p > 0.99 else "<1%" if p < 0.01 else format(p, ".0%")


def fmt_ci(ci: tuple[float, float], spec: str = "+.4f") -> str:
    """An interval as ``[lo, hi]``."""
    return f"[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table: a header line, the rule, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def figure_lines(figures: dict[str, Any], titles: dict[str, str]) -> list[str]:
    """An image link per figure written, ``- <title>: no data`` for one skipped."""
    return [
        f"![{t}]({figures[k].name})\n" if figures.get(k) else f"- {t}: no data\n"
        for k, t in titles.items()
    ]
