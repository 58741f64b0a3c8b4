"""Build a :class:`Report`: load runs, label and check them, then compare every variant with the
baseline, paired by seed (final validation loss, TOST power, step-time ratio and its checks).

No files are written here (see :func:`normlab.report.write_report`). Losses in nats/token, times
in ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from normlab.report.context import build_context
from normlab.report.heldout import bpb_and_heldout, final_value
from normlab.report.runs import ReportError, Run, load_runs
from normlab.report.series import BETWEEN_LIMIT, between_runs_problem, paired_curve, timing_check
from normlab.report.speed import bench_ratio, load_step_bench
from normlab.report.stats import (
    POWER,
    describe,
    paired_difference,
    ratio_interval,
    seeds_needed,
    tost_power,
)
from normlab.report.totarget import time_to_target
from normlab.report.tuned import LR_KEY, at_each_lr, choose_best_lr, lr_swept
from normlab.report.variants import check_comparable, choose_baseline, confounds, label_runs

NAN = float("nan")


@dataclass
class Report:
    """Everything ``report.md`` says; ``variants`` and ``comparisons`` are lists of row dicts,
    ``confounds`` warnings (text), ``timing`` per variant label the step-time checks of its runs."""

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
    #: bpb and held-out corpora (:func:`~normlab.report.heldout.bpb_and_heldout`)
    heldout: dict[str, Any] = field(default_factory=dict)
    #: time to a target loss (:func:`~normlab.report.totarget.time_to_target`)
    target: dict[str, Any] = field(default_factory=dict)
    #: a tuned study (:func:`~normlab.report.tuned.choose_best_lr` and ``at_lr``), else None
    tuned: dict[str, Any] | None = None
    #: the interleaved step benchmark: ``path`` and ``ratios`` per label, else None
    bench: dict[str, Any] | None = None
    #: :func:`~normlab.report.context.build_context`
    context: dict[str, Any] = field(default_factory=dict)

    def included(self, label: str) -> list[Run]:
        """The runs of variant ``label`` that count in the statistics (completed, not set aside)."""
        return [
            r for r in self.runs if r.label == label and r.excluded is None and r.set_aside is None
        ]

    @property
    def labels(self) -> list[str]:
        """Variant labels, baseline first."""
        return [v["label"] for v in self.variants]


def _median_of(runs: list[Run], key: str) -> float:
    """Median over runs of a summary field (each run's median step time, tokens/s); nan if none."""
    vals = [x for x in (r.summary_float(key) for r in runs) if math.isfinite(x)]
    return float(np.median(vals)) if vals else NAN


def _by_seed(rep: Report, label: str) -> dict[Any, Run]:
    inc = rep.included(label)
    seeds = [r.seed for r in inc]
    dup = [s for s in seeds if seeds.count(s) > 1]
    if dup:
        raise ReportError(
            f"variant {label} has two completed runs with seed {dup[0]}; cannot pair by seed"
        )
    return {r.seed: r for r in inc if r.seed is not None}


def _timing(runs: list[Run]) -> dict[str, Any]:
    """The step-time checks (:func:`timing_check`) of ``runs`` and the between-runs rule."""
    checks = {r.name: timing_check((r.summary or {}).get("step_times_ms") or []) for r in runs}
    between = between_runs_problem([r.summary_float("step_time_ms_median") for r in runs])
    return {"runs": checks, "between": between}


def _ratio(rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str) -> dict[str, Any]:
    seeds = sorted(set(var) & set(base), key=str)
    key = "step_time_ms_median"
    ratios = {s: var[s].summary_float(key) / base[s].summary_float(key) for s in seeds}
    ratios = {s: x for s, x in ratios.items() if math.isfinite(x) and x > 0}
    problems = []
    for lab in (rep.baseline, label):
        t = rep.timing[lab]
        problems += [
            f"{name}: {'; '.join(c['problems'])}" for name, c in t["runs"].items() if c["problems"]
        ]
        problems += [f"`{lab}`: {t['between']}"] if t["between"] else []
    if len(ratios) >= 2 and max(ratios.values()) / min(ratios.values()) > BETWEEN_LIMIT:
        span = max(ratios.values()) / min(ratios.values())
        problems.append(f"per-seed ratios span {span:.2f}x > {BETWEEN_LIMIT:g}x")
    unchecked = [
        n
        for lab in (rep.baseline, label)
        for n, c in rep.timing[lab]["runs"].items()
        if not c["checked"]
    ]
    return {
        **ratio_interval(list(ratios.values()), rep.alpha),
        "seeds": list(ratios),
        "comparable": not problems,
        "problems": problems,
        "unchecked": unchecked,
    }


def _compare(rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str) -> dict[str, Any]:
    seeds = sorted(set(var) & set(base), key=str)
    diffs = [var[s].final_val_loss - base[s].final_val_loss for s in seeds]
    pd = paired_difference(diffs, rep.margin, rep.alpha)
    power = {
        "at_n": tost_power(pd["n"], pd["std"], rep.margin, rep.alpha),
        "seeds_needed": seeds_needed(pd["std"], rep.margin, rep.alpha, POWER),
        "seeds_needed_observed": seeds_needed(pd["std"], rep.margin, rep.alpha, POWER, pd["mean"]),
    }
    curve = paired_curve(
        {s: r.metrics for s, r in base.items()},
        {s: r.metrics for s, r in var.items()},
        alpha=rep.alpha,
    )
    return {
        "label": label,
        "seeds": seeds,
        "diffs": diffs,
        **pd,
        "power": power,
        "ratio": _ratio(rep, base, var, label),
        "curve": curve,
    }


def build_report(
    paths: str | Path | list[str | Path],
    margin: float = 0.02,
    alpha: float = 0.05,
    baseline: str | None = None,
    target: float | None = None,
) -> Report:
    """Load, check and compare runs (no files written); ``paths``: a sweep dir, a run dir, or a
    list of either, anywhere; ``margin`` and ``target`` (time to target; None: the worst final
    loss) in nats/token. A sweep over ``optim.lr`` and other keys is a tuned comparison: labels
    leave the lr out, each variant is compared at its best lr (:mod:`normlab.report.tuned`).

    Raises:
        ReportError: a refusal (see :func:`~normlab.report.runs.load_runs`,
            :func:`~normlab.report.variants.check_comparable`,
            :func:`~normlab.report.variants.choose_baseline`) or a variant with two completed runs
            of one seed (pairing would be ambiguous).
    """
    sources = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    runs = load_runs(sources)
    tuned = lr_swept(runs)
    common = label_runs(runs, (LR_KEY,) if tuned else ())
    if tuned and len({r.label for r in runs}) < 2:  # only the lr differs: it is the variant
        tuned, common = False, label_runs(runs)
    check_comparable(runs)
    base = choose_baseline(runs, baseline)
    rep = Report(sources, margin, alpha, base, runs, common)
    if tuned:
        labels = [base] + sorted({r.label for r in runs} - {base})
        rep.tuned = choose_best_lr(runs, labels, alpha)
        rep.tuned["at_lr"] = at_each_lr(rep.tuned, base, margin, alpha)
    by_seed: dict[str, dict[Any, Run]] = {}
    for lab in [base] + sorted({r.label for r in runs} - {base}):
        inc = rep.included(lab)
        by_seed[lab] = _by_seed(rep, lab)
        rep.timing[lab] = _timing(inc)
        rep.variants.append(
            {
                "label": lab,
                **describe([r.final_val_loss for r in inc]),
                "excluded": sum(r.label == lab and r.excluded is not None for r in runs),
                "step_time_ms": _median_of(inc, "step_time_ms_median"),
                "tokens_per_s": _median_of(inc, "tokens_per_s"),
                "bpb": describe([x for r in inc if math.isfinite(x := final_value(r, "val/bpb"))]),
            }
        )
    done = [r for r in runs if r.excluded is None and r.set_aside is None]
    rep.confounds = confounds(done or runs, rep.labels)
    rep.comparisons = [_compare(rep, by_seed[base], v, lab) for lab, v in list(by_seed.items())[1:]]
    included = {lab: rep.included(lab) for lab in rep.labels}
    rep.heldout = bpb_and_heldout(included, base, margin, alpha)
    if rep.heldout["tokenizer_differs"]:
        each = "; ".join(f"`{k}`: {'/'.join(v)}" for k, v in rep.heldout["tokenizers"].items())
        rep.confounds.append(
            f"the variants differ in tokenizer (data.tokenizer: {each}): losses in nats/token "
            "do not compare between them; read the verdict in bits per byte"
        )
    rep.target = time_to_target(included, base, target, alpha)
    rep.context = build_context(included, base, margin)
    stops = {str((r.summary or {}).get("stopped_by")) for r in done}
    if "max_time_s" in stops and len(stops) > 1:
        rep.confounds.append(
            "some runs were stopped by the time budget (max_time_s), others were not ("
            + ", ".join(sorted(stops))
            + "): their final losses compare at neither equal steps nor equal training time"
        )
    found = load_step_bench(sources)
    if found is not None:
        ratios = {lab: bench_ratio(found[1], base, lab, alpha) for lab in rep.labels[1:]}
        rep.bench = {"path": found[0], "ratios": ratios, "raw": found[1]}
    return rep
