"""``normlab-report``: a sweep (or any run dirs) -> ``report.md`` and figures, every variant against
the baseline paired by seed; a pure reader of run dirs (no torch, model, training nor Hydra).
Modules, each importing only those before it: ``text``, ``stats``, ``sequential``, ``runs``,
``variants``, ``series``, ``paired``, ``plots``; one per qualifier, computation, section and figure
together: ``speed``, ``context``, ``heldout``, ``target``, ``tuned``, ``family``, ``stability``,
``downstream``, ``diagnostics``, ``swept``, ``unfinished``; then ``compare`` (the verdict and k),
``plan``, ``markdown`` (``report.md``), ``laws``, ``ladder``, ``wandb_log``.

Why: docs/reports.md
"""

from __future__ import annotations

from pathlib import Path

from normlab.report.compare import build_report
from normlab.report.diagnostics import diagnostics_figures
from normlab.report.heldout import heldout_figures
from normlab.report.ladder import (
    Ladder,
    build_ladder,
    is_ladder,
    render_ladder,
    write_ladder_figures,
)
from normlab.report.markdown import render_markdown
from normlab.report.paired import Report
from normlab.report.plots import write_curve_figures
from normlab.report.runs import METRIC_RENAMES, ReportError, Run, load_runs, write_atomic
from normlab.report.speed import step_time_figure
from normlab.report.stats import (
    describe,
    holm,
    paired_difference,
    ratio_interval,
    seeds_needed,
    t_interval,
    tost_power,
)
from normlab.report.swept import swept_figure
from normlab.report.target import target_figure
from normlab.report.tuned import tuned_figure
from normlab.report.variants import INERT_KEYS
from normlab.report.wandb_log import log_report_to_wandb, report_tables, wandb_settings

__all__ = [
    "INERT_KEYS",
    "METRIC_RENAMES",
    "Ladder",
    "Report",
    "ReportError",
    "Run",
    "build_ladder",
    "build_report",
    "describe",
    "holm",
    "is_ladder",
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
    "write_figures",
    "write_ladder",
    "write_report",
]


def write_figures(rep: Report, out_dir: Path) -> dict[str, Path | None]:
    """Every figure of ``rep`` into ``out_dir``; name -> path, None for a figure without data."""
    figures = {**write_curve_figures(rep, out_dir), **step_time_figure(rep, out_dir)}
    figures |= heldout_figures(rep, out_dir) | target_figure(rep, out_dir)
    figures |= tuned_figure(rep, out_dir) | diagnostics_figures(rep, out_dir)
    return figures | swept_figure(rep, out_dir)


def write_report(rep: Report, out_dir: str | Path) -> Path:
    """Write the figures and ``report.md`` into ``out_dir`` (``write_atomic``); returns
    ``report.md``'s path. Raises OSError: ``out_dir`` cannot be created or written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep.figures = write_figures(rep, out)
    return write_atomic(out / "report.md", render_markdown(rep).encode())


def write_ladder(lad: Ladder, out_dir: str | Path) -> Path:
    """Write each size's report into ``<shape>/``, the ladder's figures and ``report.md``; returns
    its path. Raises OSError: ``out_dir`` cannot be created or written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for size in lad.sizes:
        write_report(size["report"], out / size["shape"])
    lad.figures = write_ladder_figures(lad, out)
    return write_atomic(out / "report.md", render_ladder(lad).encode())
