"""What a report holds (``Report``) and how its runs pair: by seed, variant − baseline, over seeds
where both have a finite value; one metric compared across variants and its two tables.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.report.runs import ReportError, Run
from normlab.report.series import series
from normlab.report.stats import NAN, describe, finite_median, paired_difference
from normlab.report.text import fmt, fmt_ci


@dataclass
class Report:
    """Everything ``report.md`` says: ``variants``, ``comparisons`` (baseline first), ``confounds``,
    ``timing``, and each qualifier's part."""

    sources: list[Path]
    margin: float
    alpha: float
    baseline: str
    runs: list[Run]
    common_overrides: list[str]
    variants: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    confounds: list[str] = field(default_factory=list)
    timing: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: dict[str, Path | None] = field(default_factory=dict)
    #: bpb and held-out corpora (``heldout.bpb_and_heldout``)
    heldout: dict[str, Any] = field(default_factory=dict)
    #: time to a target loss (``target.time_to_target``)
    target: dict[str, Any] = field(default_factory=dict)
    #: a tuned study (``tuned.choose_best_lr`` and ``at_lr``), else None
    tuned: dict[str, Any] | None = None
    #: the interleaved step benchmark: ``path`` and ``ratios`` per label, else None
    bench: dict[str, Any] | None = None
    #: ``context.build_context``
    context: dict[str, Any] = field(default_factory=dict)
    #: run dirs that never trained (a refused run) with the reason, left out of everything
    skipped: list[tuple[Run, str]] = field(default_factory=list)
    #: -dL/d ln(steps) of the baseline (nats per e-fold of steps) that converts margins: between
    #: its annealed points when every baseline run has them, else its curve's end slope
    slope: float = NAN
    #: the end slope of the baseline's mean validation curve (a within-run reading; nan with
    #: under 2 evaluations after step 0), shown beside an annealed ``slope``
    slope_within: float = NAN
    #: where ``slope`` comes from: "annealed" or "within-run"
    slope_source: str = "within-run"
    #: the margin asked in effective compute (``--margin-compute``: a fraction), else None; the
    #: nats margin ``margin`` is then converted from it with ``slope``
    margin_compute: float | None = None
    #: add the anytime-valid verdict (``sequential.sequential_verdict``) to each comparison
    sequential: bool = False
    #: loss spikes, largest activations and gradient norms (``stability.stability``), else None
    stability: dict[str, Any] | None = None
    #: downstream tasks paired like held-out corpora (``downstream.downstream_comparisons``)
    downstream: dict[str, Any] = field(default_factory=dict)
    #: per source sweep dir whose record lists jobs that never started or did not finish:
    #: ``unfinished.unfinished_sweep``
    unfinished: list[dict[str, Any]] = field(default_factory=list)

    def included(self, label: str) -> list[Run]:
        """The runs of ``label`` that count (completed, not set aside)."""
        return [
            r for r in self.runs if r.label == label and r.excluded is None and r.set_aside is None
        ]

    @property
    def labels(self) -> list[str]:
        """Variant labels, baseline first."""
        return [v["label"] for v in self.variants]


def median_of(runs: list[Run], key: str) -> float:
    """Median over runs of a summary field (each run's median step time, tokens/s); nan if none."""
    return finite_median([r.summary_float(key) for r in runs])


def by_seed(rep: Report, label: str) -> dict[Any, Run]:
    """Seed -> included run of ``label``. Raises ReportError: two completed runs of one seed."""
    inc = rep.included(label)
    seeds = [r.seed for r in inc]
    dup = [s for s in seeds if seeds.count(s) > 1]
    if dup:
        raise ReportError(
            f"variant {label} has two completed runs with seed {dup[0]}; cannot pair by seed"
        )
    return {r.seed: r for r in inc if r.seed is not None}


def common_seeds(base: dict[Any, Any], var: dict[Any, Any]) -> list[Any]:
    """Seeds of both ``base`` and ``var``, sorted by text: every pairing's order."""
    return sorted(set(base) & set(var), key=str)


def paired_diffs(base: dict[Any, float], var: dict[Any, float]) -> tuple[list[Any], list[float]]:
    """Seeds where both have a finite value, and the differences variant − baseline there."""
    seeds = common_seeds(base, var)
    seeds = [s for s in seeds if math.isfinite(var[s]) and math.isfinite(base[s])]
    return seeds, [var[s] - base[s] for s in seeds]


def final_value(run: Run, key: str) -> float:
    """The run's final value of ``key`` (units of the key; nan when the run has none)."""
    s = run.summary or {}
    if key == "val/loss":
        return run.final_val_loss
    v = None
    if key == "val/bpb":
        v = s.get("final_val_bpb")
    elif key.count("/") == 2 and key.startswith("val/"):
        _, name, what = key.split("/")
        entry = (s.get("final_eval") or {}).get(name)
        v = entry.get(what) if isinstance(entry, dict) else None
    if v is not None:
        return float(v)
    _, vals = series(run.metrics, key)
    return float(vals[-1]) if len(vals) else NAN


def metric_comparison(
    included: dict[str, list[Run]],
    baseline: str,
    key: str,
    margin: float,
    alpha: float,
    unit: str = "nats",
) -> dict[str, Any]:
    """Final ``key`` per variant and, per other variant, its paired difference at ``margin`` (unit
    of ``key``); ``included``: label -> runs."""
    out: dict[str, Any] = {"key": key, "margin": margin, "variants": {}, "comparisons": {}}
    finals = {
        lab: {r.seed: final_value(r, key) for r in runs if r.seed is not None}
        for lab, runs in included.items()
    }
    for lab, runs in included.items():
        vals = [final_value(r, key) for r in runs]
        out["variants"][lab] = describe([v for v in vals if math.isfinite(v)])
    base = finals.get(baseline, {})
    for lab, var in finals.items():
        if lab == baseline:
            continue
        seeds, diffs = paired_diffs(base, var)
        out["comparisons"][lab] = {"seeds": seeds, **paired_difference(diffs, margin, alpha, unit)}
    return out


def comparison_rows(comp: dict[str, Any], spec: str = "+.4f") -> list[list[Any]]:
    """Rows ``variant, n, mean diff, CI, verdict`` of a ``metric_comparison``."""
    return [
        [f"`{lab}`", c["n"], fmt(c["mean"], spec), fmt_ci(c["ci"], spec), c["verdict"]]
        for lab, c in comp["comparisons"].items()
    ]


def variant_rows(comp: dict[str, Any]) -> list[list[Any]]:
    """Rows ``variant, n, mean, std`` of a ``metric_comparison``'s final values."""
    return [
        [f"`{lab}`", v["n"], fmt(v["mean"]), fmt(v["std"])] for lab, v in comp["variants"].items()
    ]
