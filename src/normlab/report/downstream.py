"""Downstream tasks (``eval_tasks``): final accuracy (or LAMBADA bpb) per variant, paired by seed
with a TOST at one accuracy point; its section.

Why: docs/reports.md
"""

from __future__ import annotations

from typing import Any

from normlab.report.paired import Report, comparison_rows, metric_comparison, variant_rows
from normlab.report.runs import Run
from normlab.report.text import ci_name, method, table

#: The equivalence margin of a downstream accuracy (a fraction: one accuracy point) and of a
#: downstream bits per byte (bits/byte), for the paired TOST of ``downstream_comparisons``.
DOWNSTREAM_MARGIN = 0.01


def downstream_keys(runs: list[Run]) -> list[str]:
    """The ``downstream/<task>/acc`` and ``downstream/<task>/bpb`` keys the runs logged, sorted."""
    keys = {
        k
        for r in runs
        for row in r.metrics
        for k in row
        if k.startswith("downstream/") and k.endswith(("/acc", "/bpb")) and k.count("/") == 2
    }
    return sorted(keys)


def downstream_comparisons(
    included: dict[str, list[Run]], baseline: str, alpha: float
) -> dict[str, Any]:
    """``{key: metric_comparison}`` per downstream key, TOST at ``DOWNSTREAM_MARGIN``."""
    every = [r for runs in included.values() for r in runs]
    out = {}
    for key in downstream_keys(every):
        unit = "bits/byte" if key.endswith("/bpb") else "accuracy"
        out[key] = metric_comparison(included, baseline, key, DOWNSTREAM_MARGIN, alpha, unit)
    return out


# --- the section ---------------------------------------------------------------------------------


def render_downstream(rep: Report) -> list[str]:
    """``## Downstream tasks``: final value and paired verdict per key; nothing without tasks."""
    if not rep.downstream:
        return []
    conf = ci_name(rep.alpha)
    out = [
        "",
        "## Downstream tasks (`eval_tasks`)",
        "",
        "Final values: accuracy a fraction (higher is better), bpb in bits per byte (lower is "
        f"better); paired by seed, variant − `{rep.baseline}`, TOST at "
        f"±{next(iter(rep.downstream.values()))['margin']:g}. " + method("downstream-tasks"),
    ]
    for key, comp in rep.downstream.items():
        out += [
            "",
            f"### `{key}`",
            "",
            *table(["variant", "n", "mean", "std"], variant_rows(comp)),
            "",
            *table(["variant", "n", "mean diff", conf, "verdict"], comparison_rows(comp)),
        ]
    return out
