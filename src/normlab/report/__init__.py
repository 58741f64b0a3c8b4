"""``normlab-report``: compare the variants of a sweep (or of any run dirs) by final validation
loss and step time, paired by seed, and write ``report.md`` with figures.

A pure reader of run dirs (``.hydra/overrides.yaml``, ``.hydra/config.yaml``, ``metrics.jsonl``,
``summary.json``); it never imports torch, the model, training or Hydra. Modules, each importing
only those above it: ``runs`` (read run dirs, old metric names) <- ``stats`` (CI, TOST, power),
``series`` (curves, step-time checks), ``variants`` (labels, comparability, confounds),
``diagnostics``, ``compare`` (:func:`build_report`) <- ``swept``, ``sections``, ``markdown``,
``diag_plots``, ``plots`` <- this package (:func:`write_report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    "seeds_needed",
    "t_interval",
    "tost_power",
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


def log_report_to_wandb(rep: Report, run: Any = None) -> bool:
    """Log the tables and figures of ``rep`` to a wandb ``run``; False (nothing done) without
    wandb or without a run."""
    if run is None:
        return False
    try:
        import wandb
    except ImportError:
        return False
    cols = ["n", "mean", "std", "min", "max", "step_time_ms", "tokens_per_s"]
    variants = [[v["label"], *(v[k] for k in cols)] for v in rep.variants]
    comparisons = [
        [c["label"], c["n"], c["mean"], *c["ci"], c["p_lower"], c["p_upper"], c["verdict"]]
        for c in rep.comparisons
    ]
    comp_cols = ["variant", "n", "mean_diff", "ci_lo", "ci_hi", "p_lower", "p_upper", "verdict"]
    data = {
        "report/variants": wandb.Table(columns=["variant", *cols], data=variants),
        "report/comparisons": wandb.Table(columns=comp_cols, data=comparisons),
    }
    data.update({f"report/{k}": wandb.Image(str(p)) for k, p in rep.figures.items() if p})
    run.log(data)
    return True
