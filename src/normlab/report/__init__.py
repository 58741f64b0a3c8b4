"""``normlab-report``: compare the variants of a sweep (or of any run dirs) by effective compute
(steps x speed), final validation loss and step time, paired by seed, and write ``report.md``
with figures.

A pure reader of run dirs (``.hydra/overrides.yaml``, ``.hydra/config.yaml``, ``metrics.jsonl``,
``summary.json``); it never imports torch, the model, training or Hydra. Modules by job, each
importing only those before it:

- ``runs``: read run dirs (old metric names too), label the variants, check that nothing else
  differs, choose the baseline, name the confounds;
- ``stats``: descriptive statistics, t intervals, the paired TOST, ratio intervals, power,
  Holm, the compute multiplier of two curves and the nats <-> compute conversion;
- ``series``: metric curves, smoothing, the step-time checks, axis limits, ``diag/`` statistics;
- ``compare``: :func:`build_report`, the verdict and all its qualifiers (the compute-equivalent
  verdict, context, bpb and held-out corpora, time to target, the tuned comparison, the
  interleaved speed verdict, a swept value) and the planner (``plan_study``);
- ``ladder``: :func:`build_ladder`, one comparison across model sizes (a report per size, the
  fitted loss-compute law per variant, the trend of the compute multiplier with size);
- ``markdown``: ``report.md``; ``plots``: every figure; ``wandb_log``: the report to wandb.
"""

from __future__ import annotations

from pathlib import Path

from normlab.report.compare import Report, build_report
from normlab.report.ladder import Ladder, build_ladder, is_ladder
from normlab.report.markdown import EMA_BETA, render_ladder, render_markdown
from normlab.report.plots import write_figures, write_ladder_figures
from normlab.report.runs import (
    INERT_KEYS,
    METRIC_RENAMES,
    ReportError,
    Run,
    load_runs,
    write_atomic,
)
from normlab.report.stats import (
    describe,
    holm,
    paired_difference,
    ratio_interval,
    seeds_needed,
    t_interval,
    tost_power,
)
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
    "write_ladder",
    "write_report",
]


def write_report(rep: Report, out_dir: str | Path) -> Path:
    """Write the figures and ``report.md`` into ``out_dir`` (created); returns ``report.md``'s path.
    Each file is replaced atomically (:func:`~normlab.report.runs.write_atomic`), never written
    through a link.

    Raises:
        OSError: ``out_dir`` cannot be created or written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep.figures = write_figures(rep, out, EMA_BETA)
    return write_atomic(out / "report.md", render_markdown(rep).encode())


def write_ladder(lad: Ladder, out_dir: str | Path) -> Path:
    """Write a ladder's report into ``out_dir`` (created): each size's full report in
    ``<shape>/`` (:func:`write_report`), the ladder's figures and its ``report.md``; returns the
    ladder's ``report.md`` path. Files are replaced as :func:`write_report` replaces them.

    Raises:
        OSError: ``out_dir`` cannot be created or written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for size in lad.sizes:
        write_report(size["report"], out / size["shape"])
    lad.figures = write_ladder_figures(lad, out)
    return write_atomic(out / "report.md", render_ladder(lad).encode())
