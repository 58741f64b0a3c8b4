"""``normlab-report``: compare the variants of a sweep (or of any run dirs) by final validation
loss and step time, paired by seed, and write ``report.md`` with figures.

A pure reader of run dirs (``.hydra/overrides.yaml``, ``.hydra/config.yaml``, ``metrics.jsonl``,
``summary.json``); it never imports torch, the model, training or Hydra. Modules, each importing
only those above it: ``runs`` (read run dirs, old metric names) <- ``stats`` (CI, TOST, power),
``series`` (curves, step-time checks), ``variants`` (labels, comparability, confounds),
``diagnostics``, ``compare`` (:func:`build_report`) <- ``swept``, ``sections``, ``markdown``,
``diag_plots``, ``plots`` <- this package (:func:`write_report`). The verdict's qualifiers, each
a module: ``heldout`` (bpb, ``eval_data`` corpora), ``totarget`` (time to a target loss),
``tuned`` (each variant at its best lr), ``speed`` (the interleaved step benchmark), ``context``;
rendered by ``sections_context`` / ``sections_fair``, drawn by ``fair_plots``; ``wandb_log``.
"""

from __future__ import annotations

from pathlib import Path

from normlab.report.compare import Report, build_report
from normlab.report.markdown import EMA_BETA, render_markdown
from normlab.report.plots import write_figures
from normlab.report.runs import METRIC_RENAMES, ReportError, Run, load_runs
from normlab.report.stats import (
    describe,
    paired_difference,
    ratio_interval,
    seeds_needed,
    t_interval,
    tost_power,
)
from normlab.report.variants import INERT_KEYS
from normlab.report.wandb_log import log_report_to_wandb, report_tables, wandb_settings

__all__ = [
    "INERT_KEYS",
    "METRIC_RENAMES",
    "Report",
    "ReportError",
    "Run",
    "build_report",
    "describe",
    "load_runs",
    "log_report_to_wandb",
    "paired_difference",
    "ratio_interval",
    "render_markdown",
    "report_tables",
    "seeds_needed",
    "t_interval",
    "tost_power",
    "wandb_settings",
    "write_report",
]


def write_report(rep: Report, out_dir: str | Path) -> Path:
    """Write the figures and ``report.md`` into ``out_dir`` (created); returns ``report.md``'s path.

    Raises:
        OSError: ``out_dir`` cannot be created or written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep.figures = write_figures(rep, out, EMA_BETA)
    path = out / "report.md"
    path.write_text(render_markdown(rep))
    return path
