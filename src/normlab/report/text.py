"""How a report writes numbers and Markdown: a number, an interval, a power, a table, an image link,
and the pointer to the page that explains a method (text, not a link).

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

#: The page that explains every method a report uses; a report names its sections by anchor.
METHODS_PAGE = "docs/reports.md"


def missing(x: Any) -> bool:
    """True for None and for a float that is not finite."""
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt(x: Any, spec: str = ".4f") -> str:
    """``x`` formatted by ``spec``; ``"n/a"`` for None and non-finite floats."""
    return "n/a" if missing(x) else format(x, spec)


def fmt_ci(ci: tuple[float, float], spec: str = "+.4f") -> str:
    """An interval as ``[lo, hi]``, each end by ``fmt``."""
    return f"[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def fmt_power(p: Any) -> str:
    """A probability as a percentage, ``">99%"`` and ``"<1%"`` at the ends."""
    if missing(p):
        return "n/a"
    # a power from an estimated std is not known to the last percent
    return ">99%" if p > 0.99 else "<1%" if p < 0.01 else format(p, ".0%")


def ci_name(alpha: float) -> str:
    """The name of a 1−alpha interval: ``"95% CI"`` for alpha 0.05."""
    return f"{100 * (1 - alpha):g}% CI"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table: the header line, the rule, one line per row (cells as ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def figure_lines(figures: dict[str, Any], captions: dict[str, tuple[str, str]]) -> list[str]:
    """Per figure ``(title, caption)``: caption and image, or ``- <title>: no data``."""
    return [
        f"*{caption}*\n\n![{title}]({figures[k].name})\n"
        if figures.get(k)
        else f"- {title}: no data\n"
        for k, (title, caption) in captions.items()
    ]


def method(anchor: str) -> str:
    """The pointer to the section of ``METHODS_PAGE`` that explains a method."""
    return f"Method: `{METHODS_PAGE}#{anchor}`."
