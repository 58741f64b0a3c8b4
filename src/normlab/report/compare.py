"""The verdict and the compute-equivalent multiplier k: ``build_report`` loads, labels and checks
the runs, compares each variant with the baseline paired by seed, converts the margin between nats
and compute, and has each qualifier add its part. No file is written here.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from normlab.report.context import budget_warning, build_context, short_run_caveat
from normlab.report.downstream import downstream_comparisons
from normlab.report.family import family_verdicts
from normlab.report.heldout import bpb_and_heldout, tokenizer_warning
from normlab.report.paired import (
    Report,
    by_seed,
    common_seeds,
    final_value,
    median_of,
    paired_diffs,
)
from normlab.report.runs import ReportError, Run, load_runs, never_trained
from normlab.report.sequential import in_run_order, sequential_verdict
from normlab.report.series import aggregate, num, paired_curve, series
from normlab.report.speed import backend_differences, interleaved, sequential_ratio, timing
from normlab.report.stability import stability
from normlab.report.stats import (
    NAN,
    POWER,
    annealed_slope,
    annealed_step_multiplier,
    compute_for_nats,
    compute_multiplier,
    describe,
    end_slope,
    nats_for_compute,
    paired_difference,
    seeds_needed,
    std_upper,
    step_multiplier,
    tost_power,
)
from normlab.report.target import time_to_target
from normlab.report.tuned import LR_KEY, at_each_lr, choose_best_lr, lr_swept, selection_warning
from normlab.report.unfinished import unfinished_sweeps
from normlab.report.variants import check_comparable, choose_baseline, confounds, label_runs

#: The default equivalence margin (nats/token): a gross-difference screen, which catches a broken
#: norm, not a parity claim (a norm's speed at stake is worth far less loss); a study sets its own.
DEFAULT_MARGIN = 0.02
#: A baseline curve whose end slope is under MIN_SLOPE nats per e-fold of steps has stopped
#: falling (a flat curve fits to rounding noise): a margin in compute cannot be converted on it.
MIN_SLOPE = 1e-6


def build_report(
    paths: str | Path | list[str | Path],
    margin: float = DEFAULT_MARGIN,
    alpha: float = 0.05,
    baseline: str | None = None,
    target: float | None = None,
    margin_compute: float | None = None,
    sequential: bool = False,
) -> Report:
    """Compare the runs of ``paths`` (dirs or series files) with every qualifier; ``margin``,
    ``target`` in nats/token, or ``margin_compute`` a compute fraction; ``sequential`` adds the
    anytime-valid verdict to each comparison. Raises ReportError: a
    refusal, no run trained, a seed twice in a variant, no conversion, a bad ``multirun.yaml``."""
    sources = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    runs, skipped = _trained(load_runs(sources), sources)
    lr_study = lr_swept(runs)
    common = label_runs(runs, (LR_KEY,) if lr_study else ())
    if lr_study and len({r.label for r in runs}) < 2:  # only the lr differs: it is the variant
        lr_study, common = False, label_runs(runs)
    check_comparable(runs)
    base = choose_baseline(runs, baseline)
    rep = Report(sources, margin, alpha, base, runs, common, skipped=skipped, sequential=sequential)
    rep.unfinished = unfinished_sweeps(sources, runs + [r for r, _ in skipped])
    labels = [base] + sorted({r.label for r in runs} - {base})
    if lr_study:
        rep.tuned = choose_best_lr(runs, labels, alpha)
    _set_slope(rep, margin_compute)
    if rep.tuned is not None:
        rep.tuned["at_lr"] = at_each_lr(rep.tuned, base, rep.margin, alpha)
    paired_runs: dict[str, dict[Any, Run]] = {}
    for lab in labels:
        paired_runs[lab] = by_seed(rep, lab)
        rep.timing[lab] = timing(rep.included(lab))
        rep.variants.append(_variant_row(rep, lab))
    done = [r for r in runs if r.excluded is None and r.set_aside is None]
    rep.confounds = confounds(done or runs, rep.labels)
    rep.comparisons = [
        _compare(rep, paired_runs[base], paired_runs[lab], lab) for lab in labels[1:]
    ]
    family_verdicts(rep)
    _qualify(rep, target)
    rep.stability = stability(rep)
    rep.downstream = downstream_comparisons({lab: rep.included(lab) for lab in labels}, base, alpha)
    rep.bench = interleaved(rep)
    for c in rep.comparisons:
        c["compute"] = compute_equivalent(
            rep, paired_runs[base], paired_runs[c["label"]], c["label"]
        )
    return rep


def _set_slope(rep: Report, margin_compute: float | None) -> None:
    """Set the baseline's slope of ``rep`` (annealed, else end slope) and the nats margin of
    ``margin_compute``. Raises ReportError: the margin cannot be converted."""
    base = rep.included(rep.baseline)
    rep.slope_within = baseline_slope(base)
    annealed = annealed_baseline_slope(base)
    rep.slope, rep.slope_source = (
        (annealed, "annealed") if math.isfinite(annealed) else (rep.slope_within, "within-run")
    )
    if margin_compute is not None:
        rep.margin_compute = margin_compute
        rep.margin = margin_from_compute(margin_compute, rep.slope)


def _trained(runs: list[Run], sources: list[Path]) -> tuple[list[Run], list[tuple[Run, str]]]:
    """``runs`` split: trained, and ``(run, why)`` of the rest. Raises ReportError: none trained."""
    skipped = [(r, why) for r in runs if (why := never_trained(r)) is not None]
    kept = [r for r in runs if never_trained(r) is None]
    if not kept:
        names = ", ".join(r.name for r, _ in skipped)
        where = ", ".join(map(str, sources))
        raise ReportError(f"no run in {where} trained (refused or never started: {names})")
    return kept, skipped


def _variant_row(rep: Report, label: str) -> dict[str, Any]:
    """Final-loss row of ``label``: ``describe`` of final losses, exclusions, ms, tokens/s, bpb."""
    inc = rep.included(label)
    return {
        "label": label,
        **describe([r.final_val_loss for r in inc]),
        "excluded": sum(r.label == label and r.excluded is not None for r in rep.runs),
        "step_time_ms": median_of(inc, "step_time_ms_median"),
        "tokens_per_s": median_of(inc, "tokens_per_s"),
        "bpb": describe([x for r in inc if math.isfinite(x := final_value(r, "val/bpb"))]),
    }


def _compare(rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str) -> dict[str, Any]:
    """Variant ``label`` against the baseline (seed -> run each): the final-loss
    ``paired_difference`` with power and seeds needed, the sequential speed ratio, differing
    backends, the paired curve."""
    seeds, diffs = paired_diffs(
        {s: r.final_val_loss for s, r in base.items()},
        {s: r.final_val_loss for s, r in var.items()},
    )
    pd = paired_difference(diffs, rep.margin, rep.alpha)
    power = {
        "at_n": tost_power(pd["n"], pd["std"], rep.margin, rep.alpha),
        "seeds_needed": seeds_needed(pd["std"], rep.margin, rep.alpha, POWER),
        "seeds_needed_observed": seeds_needed(pd["std"], rep.margin, rep.alpha, POWER, pd["mean"]),
        "std_upper": (upper := std_upper(pd["std"], pd["n"], rep.alpha)),
        "seeds_needed_upper": seeds_needed(upper, rep.margin, rep.alpha, POWER),
    }
    curve = paired_curve(
        {s: r.metrics for s, r in base.items()},
        {s: r.metrics for s, r in var.items()},
        alpha=rep.alpha,
    )
    seq = None
    if rep.sequential:  # over seed 0, 1, ...: the order a driver runs them
        seq = sequential_verdict(in_run_order(seeds, diffs), rep.margin, rep.alpha)
    return {
        "label": label,
        "seeds": seeds,
        "diffs": diffs,
        "sequential": seq,
        **pd,
        "power": power,
        "ratio": sequential_ratio(rep, base, var, label),
        "backends": backend_differences(list(base.values()), list(var.values())),
        "curve": curve,
    }


def _qualify(rep: Report, target: float | None) -> None:
    """Set the qualifiers of ``rep`` (bpb, held-out corpora, time to ``target``, context) and add
    their warnings to ``rep.confounds``."""
    included = {lab: rep.included(lab) for lab in rep.labels}
    rep.heldout = bpb_and_heldout(included, rep.baseline, rep.margin, rep.alpha)
    rep.target = time_to_target(included, rep.baseline, target, rep.alpha)
    rep.context = build_context(included)
    caveat = short_run_caveat(rep.margin, rep.slope, rep.slope_source) if rep.comparisons else None
    warnings = [
        tokenizer_warning(rep.heldout),
        caveat,
        selection_warning(rep.tuned) if rep.tuned is not None else None,
        budget_warning(included),
    ]
    rep.confounds += [w for w in warnings if w]


# --- the compute-equivalent verdict and margins in compute ---------------------------------------


def _val_curve(run: Run) -> tuple[list[float], list[float]] | None:
    """``(steps, val/loss)`` lists of ``run``, the last value per step; None under 2 evaluations."""
    by_step = dict(zip(*series(run.metrics, "val/loss"), strict=True))
    steps = sorted(by_step)
    return (steps, [by_step[x] for x in steps]) if len(steps) >= 2 else None


def annealed_curve(run: Run) -> tuple[list[float], list[float]] | None:
    """``(budgets, val/loss)`` of ``run``'s annealed points, increasing, finite; None under 2."""
    points = {}
    for row in run.annealed:
        budget, loss = num(row.get("budget_steps")), num(row.get("val/loss"))
        if math.isfinite(budget) and budget > 0 and math.isfinite(loss):
            points[budget] = loss
    budgets = sorted(points)
    return (budgets, [points[b] for b in budgets]) if len(budgets) >= 2 else None


def _multipliers(base: dict[Any, Run], var: dict[Any, Run], annealed: bool) -> dict[Any, float]:
    """Seed -> finite positive step multiplier of the paired runs, annealed or within the curves."""
    read, mult = (
        (annealed_curve, annealed_step_multiplier) if annealed else (_val_curve, step_multiplier)
    )
    mults = {}
    for s in common_seeds(base, var):
        b, v = read(base[s]), read(var[s])
        m = mult(b, v) if b and v else NAN
        if math.isfinite(m) and m > 0:
            mults[s] = m
    return mults


def compute_equivalent(
    rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str
) -> dict[str, Any]:
    """``compute_multiplier``'s keys plus ``seeds``, ``step_mults``, ``source``, ``comparable``,
    ``reading``, ``within``: variant ``label`` against the baseline (seed -> run each)."""
    within = _multipliers(base, var, annealed=False)
    annealed = _multipliers(base, var, annealed=True)
    paired = set(base) & set(var)
    use_annealed = bool(annealed) and all(
        annealed_curve(base[s]) and annealed_curve(var[s]) for s in paired
    )
    out = _with_speed(rep, base, var, label, annealed if use_annealed else within)
    out["reading"] = "annealed" if use_annealed else "within-run"
    out["within"] = _with_speed(rep, base, var, label, within) if use_annealed else None
    return out


def _with_speed(
    rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str, mults: dict[Any, float]
) -> dict[str, Any]:
    """``compute_multiplier`` of ``mults`` x the bench's speed, else the runs' (+``steps_only``)."""
    bench = (rep.bench or {}).get("ratios", {}).get(label)
    comparable, speed_se = True, None
    if bench is not None and math.isfinite(bench["gmean"]) and bench["gmean"] > 0:
        seeds, source = list(mults), "interleaved"
        speed: list[float] | float = 1 / bench["gmean"]
        speed_se = (bench["se_log"], bench["df"])  # ln(1/r) has the se of ln r
    else:
        key, source = "step_time_ms_median", "sequential"
        seq = {s: base[s].summary_float(key) / var[s].summary_float(key) for s in mults}
        seeds = [s for s, x in seq.items() if math.isfinite(x) and x > 0]
        speed = [seq[s] for s in seeds]
        comparable = next(c for c in rep.comparisons if c["label"] == label)["ratio"]["comparable"]
    r = compute_multiplier([mults[s] for s in seeds], speed, speed_se, rep.alpha)
    out = {**r, "seeds": seeds, "step_mults": mults, "source": source, "comparable": comparable}
    if not comparable:  # the steps part alone, with its own interval: the part that holds
        out["steps_only"] = compute_multiplier(list(mults.values()), 1.0, alpha=rep.alpha)
    return out


def annealed_baseline_slope(runs: list[Run]) -> float:
    """``annealed_slope`` of the mean annealed points at budgets every run has; nan under 2."""
    curves = [c for r in runs if (c := annealed_curve(r)) is not None]
    if not curves or len(curves) < len(runs):
        return NAN
    common = sorted(set.intersection(*(set(b) for b, _ in curves)))
    if len(common) < 2:
        return NAN
    means = [float(np.mean([dict(zip(*c, strict=True))[b] for c in curves])) for b in common]
    return annealed_slope(common, means)


def baseline_slope(runs: list[Run]) -> float:
    """``end_slope`` of the mean validation curve of ``runs``; nan under 2 evaluations."""
    steps, mean, _, _ = aggregate([series(r.metrics, "val/loss") for r in runs])
    try:
        return end_slope(list(steps), list(mean))
    except ValueError:
        return NAN


def margin_from_compute(fraction: float, slope: float) -> float:
    """Nats/token margin ``fraction`` of compute is worth at ``slope``. Raises ReportError:
    ``slope`` is nan or under ``MIN_SLOPE`` (no conversion exists)."""
    if not (math.isfinite(slope) and slope >= MIN_SLOPE):
        raise ReportError(
            f"--margin-compute {fraction:g}: cannot convert to nats, the baseline's validation "
            f"curve has slope {slope:.3g} nats per e-fold of steps (need >= {MIN_SLOPE:g}: "
            "at least 2 evaluations after step 0 on a falling curve); give --margin in nats"
        )
    return nats_for_compute(fraction, slope)


def margin_in_compute(rep: Report) -> float:
    """Compute fraction the report's nats margin is worth at the baseline's slope, or nan."""
    return compute_for_nats(rep.margin, rep.slope) if math.isfinite(rep.slope) else NAN
