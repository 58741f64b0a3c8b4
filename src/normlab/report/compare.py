"""The verdict and its qualifiers: build a :class:`Report` by loading runs, labelling and
checking them, then comparing every variant with the baseline, paired by seed (the
compute-equivalent verdict: steps x speed, :func:`compute_equivalent`; final validation loss with
its TOST verdict and power, at a margin in nats or in compute; step-time ratio and its checks),
and qualifying that verdict with everything a reader needs to judge it:

- the context (model and parameters, tokens seen and epochs of the corpus, learning rate and
  schedule, precision, device, evaluation size, the train/validation gap, and the margin in
  compute-equivalent steps of the baseline's own validation curve);
- final validation bits per byte and the held-out corpora (``eval_data``), paired by seed;
- time to a target loss in training seconds, optimizer steps and tokens;
- a tuned comparison (a sweep over ``optim.lr`` x the variants x ``seed``: each variant at its
  own best learning rate, chosen on half the seeds and tested on the others when there are 4 or
  more, the runs at its other rates set aside);
- the speed verdict of the interleaved step benchmark (``normlab-bench step --json
  <sweep>/step_bench.json``): both setups timed in pairs A B, B A, ... in one process, so a machine
  that changes speed slows both alike; the sweep's sequential step times are the secondary figure;
- final validation loss against a swept numeric override (``norm.eps``, ``optim.warmup_steps``);
- the plan of a study from a pilot sweep (:func:`plan_study`: seeds and hours a margin needs).

No files are written here (see :func:`normlab.report.write_report`). Metric keys as
``metrics.jsonl`` writes them: ``val/loss`` (nats/token), ``val/bpb`` (bits/byte),
``val/<name>/loss`` and ``val/<name>/bpb`` for the held-out corpus ``<name>``,
``perf/train_time_s`` (cumulative training wall time, evaluations and checkpoints excluded).
Final values come from ``summary.json`` (``final_val_loss``, ``final_val_bpb``, ``final_eval``),
else from the last finite row of ``metrics.jsonl``; runs written before these keys simply have
none. Losses in nats/token, times in ms (step times) or seconds (time to target).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from normlab.report.runs import (
    NAN,
    ReportError,
    Run,
    check_comparable,
    choose_baseline,
    confounds,
    label_runs,
    load_runs,
    never_trained,
    override_key,
    series_step_bench,
    unfinished_sweep,
)
from normlab.report.series import (
    BETWEEN_LIMIT,
    MIN_STEPS,
    aggregate,
    between_runs_problem,
    num,
    paired_curve,
    series,
    timing_check,
)
from normlab.report.stats import (
    POWER,
    annealed_slope,
    annealed_step_multiplier,
    compute_for_nats,
    compute_multiplier,
    describe,
    end_slope,
    finite_median,
    holm,
    holm_verdicts,
    nats_for_compute,
    p_two_sided,
    paired_difference,
    ratio_interval,
    seeds_needed,
    sign_test,
    std_upper,
    step_multiplier,
    t_interval,
    tost_power,
)

#: The default equivalence margin (nats/token): a gross-difference screen, which catches a broken
#: norm, not a parity claim (a norm's speed at stake is worth far less loss); a study sets its own.
DEFAULT_MARGIN = 0.02
#: The train/validation gap uses the mean of the last GAP_ROWS logged training losses.
GAP_ROWS = 10
#: Cumulative training seconds (evaluations and checkpoints excluded), in ``metrics.jsonl``.
TIME_KEY = "perf/train_time_s"
#: The key a tuned comparison sweeps (each variant at its own best value of it).
LR_KEY = "optim.lr"
#: A tuned comparison with at least SPLIT_SEEDS seeds chooses each variant's lr on half of them
#: and tests on the others (:func:`choose_best_lr`); with fewer its interval is selection-biased.
SPLIT_SEEDS = 4
#: The interleaved step benchmark's result, looked for in every source dir of a report.
BENCH_FILE = "step_bench.json"
#: The machine was quiet for a bench when its 1-minute load average stayed at most the bench's
#: threads plus LOAD_SLACK at both ends (the bench itself keeps its threads busy; the rest is
#: room for the OS and the shell).
LOAD_SLACK = 0.5
#: What the figures of sequential times (``step_time.png``, ``val_time.png``) carry when the
#: report finds those times not comparable (:func:`not_comparable`).
NOT_COMPARABLE_MARK = "NOT COMPARABLE: step times fail the report's checks"
#: A verdict rests on runs far from convergence (:func:`short_run_caveat`) when the baseline's
#: validation loss still fell by the margin within the last STILL_FALLING of its steps, or when
#: the runs saw under FEW_EPOCHS of their training split and under FEW_TOKENS_PER_PARAM training
#: tokens per parameter (the compute-optimal ratio of Hoffmann et al. 2022 is about 20).
STILL_FALLING = 0.1
#: A baseline curve whose end slope is under MIN_SLOPE nats per e-fold of steps has stopped
#: falling (a flat curve fits to rounding noise): a margin in compute cannot be converted on it.
MIN_SLOPE = 1e-6
FEW_EPOCHS = 0.1
FEW_TOKENS_PER_PARAM = 20
#: line label -> [(swept value, final losses of the completed runs)]
Points = dict[str, list[tuple[float, list[float]]]]


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
    #: bpb and held-out corpora (:func:`bpb_and_heldout`)
    heldout: dict[str, Any] = field(default_factory=dict)
    #: time to a target loss (:func:`time_to_target`)
    target: dict[str, Any] = field(default_factory=dict)
    #: a tuned study (:func:`choose_best_lr` and ``at_lr``), else None
    tuned: dict[str, Any] | None = None
    #: the interleaved step benchmark: ``path`` and ``ratios`` per label, else None
    bench: dict[str, Any] | None = None
    #: :func:`build_context`
    context: dict[str, Any] = field(default_factory=dict)
    #: run dirs that never trained (a refused run) with the reason, left out of everything
    skipped: list[tuple[Run, str]] = field(default_factory=list)
    #: -dL/d ln(steps) of the baseline (nats per e-fold of steps) that converts margins: between
    #: its annealed points when every baseline run has them, else its curve's end slope
    slope: float = NAN
    #: the end slope of the baseline's mean validation curve (a within-run reading; nan with
    #: under 2 evaluations after step 0), shown beside an annealed :attr:`slope`
    slope_within: float = NAN
    #: where :attr:`slope` comes from: "annealed" or "within-run"
    slope_source: str = "within-run"
    #: the margin asked in effective compute (``--margin-compute``: a fraction), else None; the
    #: nats margin :attr:`margin` is then converted from it with :attr:`slope`
    margin_compute: float | None = None
    #: loss spikes, largest activations and gradient norms (:func:`stability`), else None
    stability: dict[str, Any] | None = None
    #: downstream tasks paired like held-out corpora (:func:`downstream_comparisons`)
    downstream: dict[str, Any] = field(default_factory=dict)
    #: per source sweep dir whose record lists jobs that never started or did not finish:
    #: :func:`~normlab.report.runs.unfinished_sweep`
    unfinished: list[dict[str, Any]] = field(default_factory=list)

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
    return finite_median([r.summary_float(key) for r in runs])


def _by_seed(rep: Report, label: str) -> dict[Any, Run]:
    inc = rep.included(label)
    seeds = [r.seed for r in inc]
    dup = [s for s in seeds if seeds.count(s) > 1]
    if dup:
        raise ReportError(
            f"variant {label} has two completed runs with seed {dup[0]}; cannot pair by seed"
        )
    return {r.seed: r for r in inc if r.seed is not None}


def _paired(base: dict[Any, float], var: dict[Any, float]) -> tuple[list[Any], list[float]]:
    """The seeds where both ``base`` and ``var`` (seed -> value) have a finite value, sorted, and
    the differences variant − baseline there (units of the values)."""
    seeds = sorted(set(var) & set(base), key=str)
    seeds = [s for s in seeds if math.isfinite(var[s]) and math.isfinite(base[s])]
    return seeds, [var[s] - base[s] for s in seeds]


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


def not_comparable(rep: Report) -> list[str]:
    """The variants whose sequential step times do not compare with the baseline's (the checks of
    :func:`_ratio` failed: a busy or changing machine). When any does, every figure of sequential
    times carries :data:`NOT_COMPARABLE_MARK` and the report's text next to them says so."""
    return [c["label"] for c in rep.comparisons if not c["ratio"]["comparable"]]


def _compare(rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str) -> dict[str, Any]:
    seeds, diffs = _paired(
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
    return {
        "label": label,
        "seeds": seeds,
        "diffs": diffs,
        **pd,
        "power": power,
        "ratio": _ratio(rep, base, var, label),
        "backends": backend_differences(list(base.values()), list(var.values())),
        "curve": curve,
    }


def backend_differences(base: list[Run], var: list[Run]) -> list[str]:
    """The kinds of norm position whose recorded backends (``summary.json``'s ``kernels``, runs
    since 2026-12) differ between the baseline's runs and a variant's, as ``"attn_in `aten` vs
    `quack`"`` (each side's backends over its runs, joined by ``/``). A speed ratio between them
    times different kernels, not the same design; empty when they agree or a side recorded none.
    A position's blocks (``"attn_in (block 3)"``) count as that position."""

    def backends(runs: list[Run]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for r in runs:
            for pos, k in ((r.summary or {}).get("kernels") or {}).items():
                out.setdefault(pos.split(" (")[0], set()).add(str((k or {}).get("backend")))
        return out

    b, v = backends(base), backends(var)
    return [
        f"{pos} `{'/'.join(sorted(b[pos]))}` vs `{'/'.join(sorted(v[pos]))}`"
        for pos in b
        if pos in v and b[pos] != v[pos]
    ]


def build_report(
    paths: str | Path | list[str | Path],
    margin: float = DEFAULT_MARGIN,
    alpha: float = 0.05,
    baseline: str | None = None,
    target: float | None = None,
    margin_compute: float | None = None,
) -> Report:
    """Load, check and compare runs (no files written); ``paths``: a sweep dir, a run dir, or a
    list of either, anywhere; ``margin`` and ``target`` (time to target; None: the worst final
    loss) in nats/token; ``margin_compute``: the margin as a fraction of effective compute
    instead (0.01: within 1%), converted to nats with the baseline's slope (``Report.slope``:
    between its annealed budgets when its runs have them, else its curve's end slope;
    :func:`margin_from_compute`; ``margin`` is then ignored). A sweep over
    ``optim.lr`` and other keys is a tuned comparison: labels leave the lr out, each variant is
    compared at its best lr (:func:`choose_best_lr`). More than one variant against the baseline
    is a family: each comparison gets ``holm`` (:func:`~normlab.report.stats.holm_verdicts`)
    next to its plain per-pair values. Each comparison gets ``compute``, the compute-equivalent
    verdict (:func:`compute_equivalent`). Run dirs that never trained
    (:func:`~normlab.report.runs.never_trained`: a refused run) are left out of everything and
    listed in :attr:`Report.skipped`; the jobs of a source sweep that never started or did not
    finish (from its ``multirun.yaml``), in :attr:`Report.unfinished`.

    Raises:
        ReportError: a refusal (see :func:`~normlab.report.runs.load_runs`,
            :func:`~normlab.report.runs.check_comparable`,
            :func:`~normlab.report.runs.choose_baseline`), no run dir that trained, a variant
            with two completed runs of one seed (pairing would be ambiguous), a compute margin
            that cannot be converted (:func:`margin_from_compute`), or a sweep record
            (``multirun.yaml``) that cannot be read.
    """
    sources = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    runs, skipped = _trained(load_runs(sources), sources)
    tuned = lr_swept(runs)
    common = label_runs(runs, (LR_KEY,) if tuned else ())
    if tuned and len({r.label for r in runs}) < 2:  # only the lr differs: it is the variant
        tuned, common = False, label_runs(runs)
    check_comparable(runs)
    base = choose_baseline(runs, baseline)
    rep = Report(sources, margin, alpha, base, runs, common, skipped=skipped)
    rep.unfinished = unfinished_sweeps(sources, runs + [r for r, _ in skipped])
    labels = [base] + sorted({r.label for r in runs} - {base})
    if tuned:
        rep.tuned = choose_best_lr(runs, labels, alpha)
    rep.slope_within = baseline_slope(rep.included(base))
    annealed = annealed_baseline_slope(rep.included(base))
    rep.slope, rep.slope_source = (
        (annealed, "annealed") if math.isfinite(annealed) else (rep.slope_within, "within-run")
    )
    if margin_compute is not None:
        rep.margin_compute = margin_compute
        rep.margin = margin_from_compute(margin_compute, rep.slope)
    if rep.tuned is not None:
        rep.tuned["at_lr"] = at_each_lr(rep.tuned, base, rep.margin, alpha)
    by_seed: dict[str, dict[Any, Run]] = {}
    for lab in labels:
        by_seed[lab] = _by_seed(rep, lab)
        rep.timing[lab] = _timing(rep.included(lab))
        rep.variants.append(_variant_row(rep, lab))
    done = [r for r in runs if r.excluded is None and r.set_aside is None]
    rep.confounds = confounds(done or runs, rep.labels)
    rep.comparisons = [_compare(rep, by_seed[base], by_seed[lab], lab) for lab in labels[1:]]
    if len(rep.comparisons) > 1:  # variants against one baseline: a family (Holm)
        family = holm_verdicts(rep.comparisons, rep.margin, alpha)
        for c, h in zip(rep.comparisons, family, strict=True):
            c["holm"] = h
    _qualify(rep, target)
    rep.stability = stability(rep)
    rep.downstream = downstream_comparisons({lab: rep.included(lab) for lab in labels}, base, alpha)
    _speed_and_compute(rep, by_seed)
    return rep


def unfinished_sweeps(sources: list[Path], runs: list[Run]) -> list[dict[str, Any]]:
    """:func:`~normlab.report.runs.unfinished_sweep` of each source that is a sweep dir (holds a
    ``multirun.yaml``) whose record lists a job that never started or did not finish; ``runs``:
    every run dir loaded, those that never trained too.

    Raises:
        ReportError: a ``multirun.yaml`` that cannot be read.
    """
    found = [unfinished_sweep(src, runs) for src in sources if (src / "multirun.yaml").is_file()]
    return [u for u in found if u is not None]


def _speed_and_compute(rep: Report, by_seed: dict[str, dict[Any, Run]]) -> None:
    """Set ``rep.bench`` (the interleaved step benchmark of a source dir, if any) and then each
    comparison's ``compute`` (:func:`compute_equivalent`, whose speed part the bench gives)."""
    found = load_step_bench(rep.sources)
    if found is not None:
        ratios = {
            lab: bench_ratio(found[1], rep.baseline, lab, rep.alpha) for lab in rep.labels[1:]
        }
        rep.bench = {"path": found[0], "ratios": ratios, "raw": found[1]}
        rep.bench["load"] = bench_load(found[1])
    base = by_seed[rep.baseline]
    for c in rep.comparisons:
        c["compute"] = compute_equivalent(rep, base, by_seed[c["label"]], c["label"])


# --- the compute-equivalent verdict and margins in compute ---------------------------------------


def _val_curve(run: Run) -> tuple[list[float], list[float]] | None:
    """``(steps, val/loss)`` of ``run`` in step order, one value per step (the last logged), as
    lists; None with fewer than 2 evaluations."""
    by_step = dict(zip(*series(run.metrics, "val/loss"), strict=True))
    steps = sorted(by_step)
    return (steps, [by_step[x] for x in steps]) if len(steps) >= 2 else None


def annealed_curve(run: Run) -> tuple[list[float], list[float]] | None:
    """``(budgets, val/loss)`` of ``run``'s annealed points (``annealed.jsonl``: its cool-down
    branches and, under ``optim.schedule=wsd``, its own end), budgets increasing, finite losses
    only; None with fewer than 2 points."""
    points = {}
    for row in run.annealed:
        budget, loss = num(row.get("budget_steps")), num(row.get("val/loss"))
        if math.isfinite(budget) and budget > 0 and math.isfinite(loss):
            points[budget] = loss
    budgets = sorted(points)
    return (budgets, [points[b] for b in budgets]) if len(budgets) >= 2 else None


def _multipliers(base: dict[Any, Run], var: dict[Any, Run], annealed: bool) -> dict[Any, float]:
    """Seed -> step multiplier of the paired runs, read on their annealed points or within their
    validation curves; seeds without a finite positive one are left out."""
    read, mult = (
        (annealed_curve, annealed_step_multiplier) if annealed else (_val_curve, step_multiplier)
    )
    mults = {}
    for s in sorted(set(base) & set(var), key=str):
        b, v = read(base[s]), read(var[s])
        m = mult(b, v) if b and v else NAN
        if math.isfinite(m) and m > 0:
            mults[s] = m
    return mults


def compute_equivalent(
    rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str
) -> dict[str, Any]:
    """The compute-equivalent verdict of variant ``label`` (``var``: seed -> run) against the
    baseline (``base``): per seed the step multiplier times the step-time ratio t_base / t_var,
    paired across seeds (:func:`~normlab.report.stats.compute_multiplier`). The step multiplier
    is read on annealed points when every paired seed has them (``reading`` "annealed"), else
    within the validation curves (``reading`` "within-run"); with annealed points the within-run
    reading is computed too (``within``: the same keys). The speed part is the interleaved
    bench's ratio when ``rep.bench`` has one for ``label`` (``source`` "interleaved"), else the
    per-seed ratio of the runs' median step times ("sequential"; ``comparable`` False when the
    step-time checks fail, :func:`_ratio`).

    Returns:
        ``compute_multiplier``'s keys and ``seeds``, ``step_mults`` (seed -> m), ``source``,
        ``comparable``, ``reading``, ``within`` (None without annealed points).
    """
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
    """:func:`~normlab.report.stats.compute_multiplier` of the step multipliers ``mults`` times
    the speed part (the bench's, else the runs' sequential step times)."""
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
    """-dL/d ln T over the mean annealed points of ``runs`` (the baseline's included runs) at
    the budgets every run has (:func:`~normlab.report.stats.annealed_slope`, nats per e-fold of
    steps); nan when they share fewer than 2 budgets."""
    curves = [c for r in runs if (c := annealed_curve(r)) is not None]
    if not curves or len(curves) < len(runs):
        return NAN
    common = sorted(set.intersection(*(set(b) for b, _ in curves)))
    if len(common) < 2:
        return NAN
    means = [float(np.mean([dict(zip(*c, strict=True))[b] for c in curves])) for b in common]
    return annealed_slope(common, means)


def baseline_slope(runs: list[Run]) -> float:
    """The end slope (nats per e-fold of steps, :func:`~normlab.report.stats.end_slope`) of the
    mean validation curve of ``runs`` (the baseline's included runs); nan with fewer than 2
    evaluations after step 0."""
    steps, mean, _, _ = aggregate([series(r.metrics, "val/loss") for r in runs])
    try:
        return end_slope(list(steps), list(mean))
    except ValueError:
        return NAN


def margin_from_compute(fraction: float, slope: float) -> float:
    """The nats margin (nats/token) that ``fraction`` of effective compute is worth at the
    baseline's slope ``slope`` (nats per e-fold of steps: annealed, or its curve's end slope;
    :func:`~normlab.report.stats.nats_for_compute`).

    Raises:
        ReportError: ``slope`` is nan or under :data:`MIN_SLOPE` (the baseline's curve has
            under 2 evaluations after step 0, or no longer falls): no conversion exists.
    """
    if not (math.isfinite(slope) and slope >= MIN_SLOPE):
        raise ReportError(
            f"--margin-compute {fraction:g}: cannot convert to nats, the baseline's validation "
            f"curve has slope {slope:.3g} nats per e-fold of steps (need >= {MIN_SLOPE:g}: "
            "at least 2 evaluations after step 0 on a falling curve); give --margin in nats"
        )
    return nats_for_compute(fraction, slope)


def margin_in_compute(rep: Report) -> float:
    """The fraction of effective compute that the report's nats margin is worth at the
    baseline's slope (``Report.slope``: annealed, or its curve's end slope;
    :func:`~normlab.report.stats.compute_for_nats`; nan without a slope)."""
    return compute_for_nats(rep.margin, rep.slope) if math.isfinite(rep.slope) else NAN


def _trained(runs: list[Run], sources: list[Path]) -> tuple[list[Run], list[tuple[Run, str]]]:
    """``runs`` split into those that trained and those that never did, with the reason.

    Raises:
        ReportError: no run trained.
    """
    skipped = [(r, why) for r in runs if (why := never_trained(r)) is not None]
    kept = [r for r in runs if never_trained(r) is None]
    if not kept:
        names = ", ".join(r.name for r, _ in skipped)
        where = ", ".join(map(str, sources))
        raise ReportError(f"no run in {where} trained (refused or never started: {names})")
    return kept, skipped


def _variant_row(rep: Report, label: str) -> dict[str, Any]:
    """The final-loss row of variant ``label``: ``describe`` of its included runs' final
    validation losses, runs excluded, median step time (ms) and tokens/s, final bpb."""
    inc = rep.included(label)
    return {
        "label": label,
        **describe([r.final_val_loss for r in inc]),
        "excluded": sum(r.label == label and r.excluded is not None for r in rep.runs),
        "step_time_ms": _median_of(inc, "step_time_ms_median"),
        "tokens_per_s": _median_of(inc, "tokens_per_s"),
        "bpb": describe([x for r in inc if math.isfinite(x := final_value(r, "val/bpb"))]),
    }


def _qualify(rep: Report, target: float | None) -> None:
    """Set the verdict's qualifiers of ``rep`` (bpb and held-out corpora, time to ``target``, the
    context) and add their warnings to ``rep.confounds``: tokenizers that differ, a verdict on
    runs far from convergence (:func:`short_run_caveat`), runs stopped by the time budget next
    to runs that were not."""
    included = {lab: rep.included(lab) for lab in rep.labels}
    base, margin, alpha = rep.baseline, rep.margin, rep.alpha
    rep.heldout = bpb_and_heldout(included, base, margin, alpha)
    if rep.heldout["tokenizer_differs"]:
        each = "; ".join(f"`{k}`: {'/'.join(v)}" for k, v in rep.heldout["tokenizers"].items())
        rep.confounds.append(
            f"the variants differ in tokenizer (data.tokenizer: {each}): losses in nats/token "
            "do not compare between them; read the verdict in bits per byte"
        )
    rep.target = time_to_target(included, base, target, alpha)
    rep.context = build_context(included, base, margin)
    caveat = short_run_caveat(rep.context, margin) if rep.comparisons else None
    rep.confounds += [caveat] if caveat else []
    if rep.tuned is not None and rep.tuned["selection"] == "biased":
        rep.confounds.append(
            f"each variant's learning rate was chosen on the same {len(rep.tuned['test_seeds'])} "
            "seed(s) the verdict then tests (under "
            f"{SPLIT_SEEDS} seeds: no split): the interval is selection-biased (winner's curse), "
            "a variant's best rate looks better on these seeds than on new ones; with "
            f">= {SPLIT_SEEDS} seeds the report chooses on half and tests on the others"
        )
    done = [r for runs in included.values() for r in runs]
    stops = {str((r.summary or {}).get("stopped_by")) for r in done}
    if "max_time_s" in stops and len(stops) > 1:
        rep.confounds.append(
            "some runs were stopped by the time budget (max_time_s), others were not ("
            + ", ".join(sorted(stops))
            + "): their final losses compare at neither equal steps nor equal training time"
        )


# --- context of the verdict ----------------------------------------------------------------------


def _values(runs: list[Run], key: str) -> list[str]:
    """The distinct resolved values of ``key`` over ``runs``, as text, in first-seen order."""
    return list(dict.fromkeys(str(r.resolved(key)) for r in runs))


def steps_done(run: Run) -> int | None:
    """Optimizer steps the run completed: ``steps_done``, else ``steps_completed``."""
    s = run.summary or {}
    v = s.get("steps_done", s.get("steps_completed"))
    return int(v) if isinstance(v, (int, float)) else None


def tokens_seen(run: Run) -> float:
    """Training tokens consumed: steps done × tokens per step (nan when either is unknown)."""
    n, k = steps_done(run), run.tokens_per_step
    return float(n * k) if n is not None and k else NAN


def epochs(run: Run) -> float:
    """Tokens seen / tokens of the training split (``summary.json`` ``data.tokens.train``)."""
    tokens = ((run.summary or {}).get("data") or {}).get("tokens") or {}
    train = tokens.get("train") if isinstance(tokens, dict) else None
    return tokens_seen(run) / train if isinstance(train, (int, float)) and train > 0 else NAN


def train_val_gap(run: Run) -> float:
    """Final validation loss − the mean of the last :data:`GAP_ROWS` logged training losses
    (nats/token; nan without either). Positive: the model does better on what it trained on."""
    _, train = series(run.metrics, "train/loss")
    if not len(train) or not math.isfinite(run.final_val_loss):
        return NAN
    return run.final_val_loss - float(np.mean(train[-GAP_ROWS:]))


def steps_worth(steps: np.ndarray, mean: np.ndarray, margin: float) -> dict[str, float]:
    """What ``margin`` (nats/token) is worth on a validation curve (``steps``, ``mean``: shape
    ``(k,)``, by step): the step at which the curve was last ``margin`` above its final value,
    linearly interpolated between evaluations, and ``steps`` = final step − that step (the
    training the margin amounts to at the end). ``step`` nan when the curve never was that high
    (the margin is worth more than the whole run) or has fewer than 2 points."""
    out = {"final": NAN, "level": NAN, "step": NAN, "steps": NAN, "last_step": NAN}
    if len(steps) < 2:
        return out
    final = float(mean[-1])
    level = final + margin
    out |= {"final": final, "level": level, "last_step": float(steps[-1])}
    above = np.nonzero(mean[:-1] >= level)[0]
    if not above.size:
        return out
    i = int(above[-1])  # mean[i] >= level > mean[j] for every j > i
    s0, s1, y0, y1 = steps[i], steps[i + 1], mean[i], mean[i + 1]
    at = float(s0 + (y0 - level) / (y0 - y1) * (s1 - s0)) if y0 != y1 else float(s0)
    return {**out, "step": at, "steps": float(steps[-1]) - at}


def build_context(included: dict[str, list[Run]], baseline: str, margin: float) -> dict[str, Any]:
    """The context section's facts: ``setting`` (key -> values over the runs, as text),
    ``params``, ``tokens_seen``, ``epochs`` (medians over runs), ``params_by`` (label -> median
    parameter count: RMSNorm has no bias, so kinds differ), ``eval_tokens`` (tokens scored
    per evaluation: eval_batches × batch_size × context_length), ``gap`` per label (median
    :func:`train_val_gap`), ``per_seed`` (label -> seed -> final loss), ``worth``
    (:func:`steps_worth` of the baseline's mean validation curve) and ``stopped_by`` (label ->
    the runs' ``stopped_by`` values)."""
    runs = [r for rs in included.values() for r in rs]
    keys = (
        "model.name",
        "model.n_layer",
        "model.d_model",
        "model.n_head",
        "model.context_length",
        "data.name",
        "data.tokenizer",
        "data.batch_size",
        "optim.lr",
        "optim.min_lr",
        "optim.warmup_steps",
        "optim.decay",
        "optim.schedule",
        "optim.decay_fraction",
        "optim.decay_shape",
        "optim.anneal_at",
        "optim.weight_decay",
        "optim.norm_weight_decay",
        "max_steps",
        "max_time_s",
        "precision.dtype",
        "norm.impl",
        "compile",
    )
    setting = {k: _values(runs, k) for k in keys}
    versions = [(r.summary or {}).get("versions") or {} for r in runs]
    devices = [str((r.summary or {}).get("device")) for r in runs]
    setting["device"] = list(dict.fromkeys(devices))
    models = (  # the GPU's name on CUDA; on a CPU its model name (cpu_model: runs since 2026-12)
        v.get("device") if d.startswith("cuda") else v.get("cpu_model") or v.get("device")
        for v, d in zip(versions, devices, strict=True)
    )
    setting["device model"] = list(dict.fromkeys(map(str, models)))
    setting["torch"] = list(dict.fromkeys(str(v.get("torch")) for v in versions))
    threads = [((r.summary or {}).get("run_options") or {}).get("threads") for r in runs]
    setting["threads"] = list(dict.fromkeys(map(str, threads)))
    eval_tokens = []
    for r in runs:
        vals = [r.resolved(k) for k in ("eval_batches", "data.batch_size", "model.context_length")]
        eval_tokens.append(math.prod(vals) if all(isinstance(v, int) for v in vals) else NAN)
    base = included.get(baseline, [])
    steps, mean, _, _ = aggregate([series(r.metrics, "val/loss") for r in base])
    return {
        "setting": setting,
        "params": finite_median([(r.summary or {}).get("params") or NAN for r in runs]),
        "params_by": {
            lab: finite_median([(r.summary or {}).get("params") or NAN for r in rs])
            for lab, rs in included.items()
        },
        "tokens_seen": finite_median([tokens_seen(r) for r in runs]),
        "epochs": finite_median([epochs(r) for r in runs]),
        "eval_tokens": finite_median(eval_tokens),
        "gap": {lab: finite_median([train_val_gap(r) for r in rs]) for lab, rs in included.items()},
        "per_seed": {lab: {r.seed: r.final_val_loss for r in rs} for lab, rs in included.items()},
        "worth": steps_worth(steps, mean, margin),
        "stopped_by": {
            lab: sorted({str((r.summary or {}).get("stopped_by")) for r in rs})
            for lab, rs in included.items()
        },
    }


def short_run_caveat(context: dict[str, Any], margin: float) -> str | None:
    """The caveat a verdict needs when it rests on runs far from convergence, or None.

    The rule: (1) the steep end: the baseline's mean validation curve was still ``margin``
    (nats/token) above its final value within the last :data:`STILL_FALLING` (10%) of its steps
    (``context["worth"]``, :func:`steps_worth`): ten percent more training would move the loss
    by more than the margin, so a difference or an equivalence at this step need not hold at
    the end of training; or (2) a short run: the runs saw under :data:`FEW_EPOCHS` (0.1) epochs
    of their training split and under :data:`FEW_TOKENS_PER_PARAM` (20) tokens per parameter
    (medians; a large corpus seen for a fraction of an epoch by a model trained to 20 tokens
    per parameter is no short run). ``context``: :func:`build_context`'s result."""
    w, epochs = context["worth"], context["epochs"]
    per_param = context["tokens_seen"] / context["params"] if context["params"] else NAN
    reasons = []
    if math.isfinite(w["steps"]) and w["steps"] < STILL_FALLING * w["last_step"]:
        reasons.append(
            f"the baseline's validation loss still fell by the margin (±{margin:g} nats) in its "
            f"last {w['steps']:,.1f} steps ({w['steps'] / w['last_step']:.1%} of the run, under "
            f"{STILL_FALLING:.0%}): its curve is steep at the end"
        )
    few = math.isfinite(epochs) and epochs < FEW_EPOCHS
    if few and math.isfinite(per_param) and per_param < FEW_TOKENS_PER_PARAM:
        reasons.append(
            f"the runs saw {epochs:.3g} epochs of the training split and {per_param:.3g} "
            f"training tokens per parameter (under {FEW_EPOCHS:g} and {FEW_TOKENS_PER_PARAM})"
        )
    if not reasons:
        return None
    return (
        "the verdict rests on runs far from convergence: "
        + "; ".join(reasons)
        + ". A difference, or an equivalence, this early in training need not hold at its end, "
        "whatever the power: train longer (max_steps) before reading it as a verdict on the "
        "variants"
    )


# --- bits per byte and held-out corpora ----------------------------------------------------------


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


def heldout_names(runs: list[Run]) -> list[str]:
    """Names of the held-out corpora of ``runs``: ``final_eval``'s keys and ``val/<name>/loss``
    (or ``/bpb``) keys of the metrics, sorted."""
    names: set[str] = set()
    for r in runs:
        final_eval = (r.summary or {}).get("final_eval")
        names |= set(final_eval) if isinstance(final_eval, dict) else set()
        for row in r.metrics:
            for k in row:
                parts = k.split("/")
                if len(parts) == 3 and parts[0] == "val" and parts[2] in ("loss", "bpb"):
                    names.add(parts[1])
    return sorted(names)


def bpb_per_nat(runs: list[Run], loss_key: str = "val/loss", bpb_key: str = "val/bpb") -> float:
    """Median over ``runs`` of final bpb / final loss: 1 / (ln 2 · bytes per token), the factor
    that turns nats/token into bits/byte on that split (nan when no run has both)."""
    r = [final_value(x, bpb_key) / final_value(x, loss_key) for x in runs]
    r = [v for v in r if math.isfinite(v) and v > 0]
    return float(np.median(r)) if r else NAN


def metric_comparison(
    included: dict[str, list[Run]],
    baseline: str,
    key: str,
    margin: float,
    alpha: float,
    unit: str = "nats",
) -> dict[str, Any]:
    """Final ``key`` per variant (``describe`` of the runs that have it) and, per other variant,
    :func:`~normlab.report.stats.paired_difference` of variant − baseline over the seeds where
    both have it, with ``margin`` in the unit of ``key`` (``unit`` names it in the verdict).
    ``included``: label -> runs (baseline among them), each seed at most once per label."""
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
        seeds, diffs = _paired(base, var)
        out["comparisons"][lab] = {"seeds": seeds, **paired_difference(diffs, margin, alpha, unit)}
    return out


def tokenizers(included: dict[str, list[Run]]) -> dict[str, list[str]]:
    """Per label the tokenizers (``data.tokenizer``) of its runs, sorted."""
    return {
        lab: sorted({str(r.resolved("data.tokenizer")) for r in runs})
        for lab, runs in included.items()
    }


def bpb_and_heldout(
    included: dict[str, list[Run]], baseline: str, margin: float, alpha: float
) -> dict[str, Any]:
    """Everything the bpb and held-out sections need.

    Returns ``{"tokenizer_differs": bool, "tokenizers", "bpb": comparison of val/bpb or None,
    "heldout": {name: {"loss": comparison, "bpb": comparison or None}}}``. The bpb margin is
    ``margin`` (nats/token) × :func:`bpb_per_nat` of the baseline's runs on that split: the
    nats margin in bits/byte of the baseline's tokens.
    """
    every = [r for runs in included.values() for r in runs]
    toks = tokenizers(included)
    base = included.get(baseline, [])

    def bpb(loss_key: str, bpb_key: str) -> dict[str, Any] | None:
        if not any(math.isfinite(final_value(r, bpb_key)) for r in every):
            return None
        m = margin * bpb_per_nat(base, loss_key, bpb_key)
        return metric_comparison(included, baseline, bpb_key, m, alpha, "bits/byte")

    heldout = {
        name: {
            "loss": metric_comparison(included, baseline, f"val/{name}/loss", margin, alpha),
            "bpb": bpb(f"val/{name}/loss", f"val/{name}/bpb"),
        }
        for name in heldout_names(every)
    }
    return {
        "tokenizer_differs": len({t for ts in toks.values() for t in ts}) > 1,
        "tokenizers": toks,
        "bpb": bpb("val/loss", "val/bpb"),
        "heldout": heldout,
    }


# --- time to a target loss -----------------------------------------------------------------------


def seconds_at(run: Run, step: float) -> float:
    """Training seconds of ``run`` at ``step``: ``perf/train_time_s`` of a row of that step, else
    of the latest earlier row that has it (an evaluation row written apart from its step's row);
    nan when no row up to ``step`` records it."""
    times = [
        (float(r["step"]), float(r[TIME_KEY]))
        for r in run.metrics
        if "step" in r and r.get(TIME_KEY) is not None and float(r["step"]) <= step
    ]
    return max(times)[1] if times else NAN


def first_reach(run: Run, target: float, key: str = "val/loss") -> dict[str, float] | None:
    """The first evaluation row (by step) of ``run`` whose ``key`` is at or below ``target``:
    ``{"step", "seconds", "tokens"}`` (seconds: :func:`seconds_at`, nan without
    ``perf/train_time_s``; tokens nan without tokens per step; ``last``: whether it is the run's
    last evaluation); None when no evaluation reaches it."""
    rows = sorted((r for r in run.metrics if "step" in r and r.get(key) is not None), key=_step)
    k = run.tokens_per_step
    for row in rows:
        v = float(row[key])
        if math.isfinite(v) and v <= target:
            return {
                "step": float(row["step"]),
                "seconds": seconds_at(run, float(row["step"])),
                "tokens": float(row["step"] * k) if k else NAN,
                "last": row is rows[-1],
            }
    return None


def _step(row: dict[str, Any]) -> float:
    return float(row["step"])


def default_target(included: dict[str, list[Run]]) -> float:
    """The highest final validation loss of any included run (the worst variant's worst seed),
    so that every run reaches it; nan without a finite one."""
    finals = [r.final_val_loss for runs in included.values() for r in runs]
    finals = [x for x in finals if math.isfinite(x)]
    return max(finals) if finals else NAN


def _ratios(base: dict[Any, dict], var: dict[Any, dict], what: str, alpha: float) -> dict:
    seeds = sorted(set(base) & set(var), key=str)
    pairs = {s: var[s][what] / base[s][what] for s in seeds if base[s][what] > 0}
    pairs = {s: x for s, x in pairs.items() if math.isfinite(x) and x > 0}
    return {**ratio_interval(list(pairs.values()), alpha), "seeds": list(pairs)}


def time_to_target(
    included: dict[str, list[Run]], baseline: str, target: float | None, alpha: float
) -> dict[str, Any]:
    """Per variant how many runs reach ``target`` (nats/token; None: :func:`default_target`) and
    ``describe`` of their seconds, steps and tokens; per other variant the paired ratios
    (variant / baseline, geometric mean and its 1−alpha CI on logs, see
    :func:`~normlab.report.stats.ratio_interval`) of seconds, steps and tokens, over the seeds
    where both reached the target at a step > 0. ``only_last``: every run that reached it did so
    at its last evaluation only (the times then say nothing beyond the run lengths)."""
    chosen = default_target(included) if target is None else float(target)
    reach = {
        lab: {r.seed: first_reach(r, chosen) for r in runs if r.seed is not None}
        for lab, runs in included.items()
    }
    got_all = [x for by_seed in reach.values() for x in by_seed.values() if x is not None]
    out: dict[str, Any] = {
        "target": chosen,
        "default": target is None,
        "only_last": bool(got_all) and all(x["last"] for x in got_all),
        "variants": {},
        "comparisons": {},
    }
    for lab, by_seed in reach.items():
        got = [x for x in by_seed.values() if x is not None]
        out["variants"][lab] = {
            "runs": len(by_seed),
            "reached": len(got),
            **{
                w: describe([x[w] for x in got if math.isfinite(x[w])])
                for w in ("seconds", "step", "tokens")
            },
        }
    base = {s: x for s, x in reach.get(baseline, {}).items() if x is not None}
    for lab, by_seed in reach.items():
        if lab == baseline:
            continue
        var = {s: x for s, x in by_seed.items() if x is not None}
        out["comparisons"][lab] = {
            w: _ratios(base, var, w, alpha) for w in ("seconds", "step", "tokens")
        }
    return out


def time_curves(runs: list[Run], key: str = "val/loss") -> list[tuple[np.ndarray, np.ndarray]]:
    """Per run ``(training seconds, key)`` at its evaluations (seconds: :func:`seconds_at`;
    float arrays of shape ``(k,)``; empty for runs written before ``perf/train_time_s``)."""
    out = []
    for r in runs:
        pts = [
            (seconds_at(r, float(row["step"])), float(row[key]))
            for row in sorted(r.metrics, key=lambda x: x.get("step", 0))
            if "step" in row and row.get(key) is not None
        ]
        pts = [p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1])]
        out.append((np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
    return out


# --- tuned comparison: each variant at its best lr -----------------------------------------------


def run_lr(run: Run) -> float | None:
    """The run's peak learning rate (``optim.lr`` as resolved), None when not recorded."""
    v = run.resolved(LR_KEY)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def lr_swept(runs: list[Run]) -> bool:
    """True when every run overrides ``optim.lr`` (as a sweep over it does) and the runs hold at
    least two learning rates: the sweep may be a tuned comparison (it is one when other keys label
    variants too). A lone run at another lr is a variant of its own, not a tuning grid."""
    overridden = bool(runs) and all(
        any(override_key(o) == LR_KEY for o in r.overrides) for r in runs
    )
    return overridden and len({run_lr(r) for r in runs} - {None}) >= 2


def choose_best_lr(runs: list[Run], labels: list[str], alpha: float = 0.05) -> dict[str, Any]:
    """Per variant label, the completed runs grouped by learning rate; the best learning rate (the
    lowest mean final validation loss over the choosing seeds; ties: the smaller lr); the runs at
    the other rates get :attr:`Run.set_aside` (this mutates ``runs``).

    Without selection bias: with at least :data:`SPLIT_SEEDS` seeds in the grid, the first half
    of them (sorted) choose each variant's learning rate and only the others are tested (the
    choosing seeds' runs at the best rate are set aside too), so the verdict's interval is not
    that of a winner picked on the same noise (winner's curse). With fewer, every seed both
    chooses and is tested: ``selection`` is then "biased" and the report says so.

    Returns ``{"lrs": sorted learning rates, "points": {label: {lr: {**describe, "ci",
    "by_seed"}}} (over every seed), "best": {label: lr}, "edge": labels whose best lr is the
    smallest or largest of the grid, "selection": "split" or "biased", "choose_seeds",
    "test_seeds"}``; ``ci`` is the 1−alpha Student t interval of the mean (nats/token).
    """
    lrs = sorted({x for x in map(run_lr, runs) if x is not None})
    seeds = sorted({r.seed for r in runs if r.seed is not None}, key=str)
    split = len(seeds) >= SPLIT_SEEDS
    choose = seeds[: len(seeds) // 2] if split else seeds
    points: dict[str, dict[float, dict[str, Any]]] = {}
    best: dict[str, float] = {}
    for lab in labels:
        done = [r for r in runs if r.label == lab and r.excluded is None and run_lr(r) is not None]
        by_lr: dict[float, list[Run]] = {}
        for r in done:
            by_lr.setdefault(run_lr(r), []).append(r)
        points[lab] = {lr: _lr_point(rs, alpha) for lr, rs in sorted(by_lr.items())}
        chosen = {
            lr: np.mean(v)
            for lr, rs in by_lr.items()
            if (v := [r.final_val_loss for r in rs if r.seed in choose])
        }
        if not chosen:
            continue
        best[lab] = min(chosen, key=lambda lr, c=chosen: (c[lr], lr))
        for r in done:
            if run_lr(r) != best[lab]:
                r.set_aside = (
                    f"{LR_KEY}={run_lr(r):g} is not the best learning rate of `{lab}` "
                    f"({best[lab]:g})"
                )
            elif split and r.seed in choose:
                r.set_aside = (
                    f"seed {r.seed} chose the learning rate (not tested: no selection bias)"
                )
    edge = [lab for lab, lr in best.items() if len(lrs) > 2 and lr in (lrs[0], lrs[-1])]
    test = [s for s in seeds if s not in choose] if split else seeds
    return {
        "lrs": lrs,
        "points": points,
        "best": best,
        "edge": edge,
        "selection": "split" if split else "biased",
        "choose_seeds": choose,
        "test_seeds": test,
    }


def _lr_point(runs: list[Run], alpha: float) -> dict[str, Any]:
    """One cell of the tuned grid: ``describe`` of the runs' final losses, its 1−alpha t
    interval ``ci`` and ``by_seed`` (seed -> final loss, nats/token)."""
    finals = [r.final_val_loss for r in runs]
    return {
        **describe(finals),
        "ci": t_interval(finals, 1 - alpha),
        "by_seed": {r.seed: r.final_val_loss for r in runs},
    }


def at_each_lr(
    tuned: dict[str, Any], baseline: str, margin: float, alpha: float
) -> dict[str, dict[float, dict[str, Any]]]:
    """Per non-baseline label and learning rate both ran: the paired difference (variant −
    baseline, nats/token, by seed) of :func:`~normlab.report.stats.paired_difference`."""
    base = tuned["points"].get(baseline, {})
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for lab, pts in tuned["points"].items():
        if lab == baseline:
            continue
        out[lab] = {}
        for lr, p in pts.items():
            if lr not in base:
                continue
            _, diffs = _paired(base[lr]["by_seed"], p["by_seed"])
            out[lab][lr] = paired_difference(diffs, margin, alpha)
    return out


def lr_curves(tuned: dict[str, Any]) -> dict[str, tuple[np.ndarray, ...]]:
    """Per label ``(lrs, mean, lo, hi, n)`` arrays of shape ``(k,)`` for the loss-vs-lr figure."""
    out = {}
    for lab, pts in tuned["points"].items():
        lrs = sorted(pts)
        cols = [
            np.array([pts[x]["mean"] for x in lrs], float),
            np.array([pts[x]["ci"][0] for x in lrs], float),
            np.array([pts[x]["ci"][1] for x in lrs], float),
            np.array([pts[x]["n"] for x in lrs], int),
        ]
        out[lab] = (np.array(lrs, float), *cols)
    return out


# --- speed verdict: the interleaved step benchmark -----------------------------------------------


def load_step_bench(sources: list[Path]) -> tuple[Path, dict[str, Any]] | None:
    """The first ``step_bench.json`` found in a source dir of the report, with its path; None
    when there is none.

    Raises:
        ReportError: the file is not JSON, or not a ``normlab-bench step`` result (``mode`` "step"
            with ``a``, ``b`` and ``ratio.per_pair``).
    """
    for src in sources:
        path, stored = Path(src) / BENCH_FILE, series_step_bench(Path(src))
        if stored is not None:
            path, bench = stored
        elif not path.is_file():
            continue
        else:
            try:
                bench = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ReportError(f"cannot read {path}: {e.msg} (line {e.lineno})") from None
        ok = isinstance(bench, dict) and bench.get("mode") == "step"
        ok = ok and all(isinstance(bench.get(k), dict) for k in ("a", "b", "ratio"))
        if not ok or not bench["ratio"].get("per_pair"):
            raise ReportError(
                f"cannot read {path}: not a `normlab-bench step` result (mode 'step' with a, b "
                "and ratio.per_pair)"
            )
        return path, bench
    return None


def _matches(setup: dict[str, Any], common: list[str], label: str) -> bool:
    """True when every override of the variant ``label`` is among the setup's overrides."""
    given = {*setup.get("overrides", []), *common}
    return set(label.split(",")) <= given


def bench_ratio(bench: dict[str, Any], baseline: str, label: str, alpha: float) -> dict | None:
    """The interleaved ratio variant / baseline step time: ``median`` of the per-pair ratios and
    their geometric mean with the 1−alpha Student t CI on logs, ``se_log`` and ``df``
    (:func:`ratio_interval`), the sign test's ``below``, ``above`` and ``sign_p``
    (:func:`sign_test`), the ``call`` ("faster", "slower" or None) and ``verdict`` of
    :func:`speed_verdict`, ``pairs``, both medians (ms), device and threads. The setups are
    matched to the labels by overrides (B/A when A is the baseline, A/B inverted when B is); None
    when neither way matches."""
    common = bench.get("common", [])
    a, b = bench["a"], bench["b"]
    per = np.asarray(bench["ratio"]["per_pair"], float)
    if _matches(a, common, baseline) and _matches(b, common, label):
        base, var = a, b
    elif _matches(b, common, baseline) and _matches(a, common, label):
        base, var, per = b, a, 1 / per
    else:
        return None
    per = per[np.isfinite(per) & (per > 0)]
    p25, med, p75 = (float(v) for v in np.percentile(per, [25, 50, 75]))
    sign = sign_test(list(per))
    r = {
        **ratio_interval(list(per), alpha),
        "median": med,
        "iqr": (p25, p75),
        "below": sign["below"],
        "above": sign["above"],
        "sign_p": sign["p"],
        "pairs": int(per.size),
        "baseline_ms": base.get("median_ms"),
        "variant_ms": var.get("median_ms"),
        "device": bench.get("device"),
        "threads": bench.get("threads"),
    }
    return r | speed_verdict(r, alpha)


def speed_verdict(r: dict[str, Any], alpha: float) -> dict[str, Any]:
    """The speed verdict of a :func:`bench_ratio` result ``r`` (ratio variant / baseline step
    time): ``call`` "faster" (or "slower") only when the median ratio is below (above) 1, the
    geometric mean's 1−alpha CI excludes 1 on that side, and the sign test's p < alpha; else None.
    ``verdict``: the call with its three figures, or "not shown faster or slower" with what
    failed, in one sentence."""
    med, (lo, hi), p = r["median"], r["ci"], r["sign_p"]
    side = "faster" if med < 1 else "slower" if med > 1 else None
    ci = f"{r['gmean']:.3f} [{lo:.3f}, {hi:.3f}]"
    counts = f"{r['below']} of {r['below'] + r['above']} untied pairs faster"
    why = []
    if side is None:
        why.append(f"the median ratio is {med:.3f}")
    elif math.isnan(lo):
        why.append("the geometric mean has no CI (fewer than 2 pairs)")
    elif lo <= 1 <= hi:
        why.append(f"the geometric mean's CI {ci} includes 1")
    elif (hi < 1) != (side == "faster"):
        why.append(f"the geometric mean's CI {ci} lies on the other side of 1 from the median")
    if not p < alpha:
        why.append(f"the sign test gives p = {p:.3g} >= {alpha:g} ({counts})")
    if why:
        return {"call": None, "verdict": "not shown faster or slower: " + "; ".join(why)}
    figures = f"median ratio {med:.3f}, geometric mean {ci}, sign test p = {p:.3g} ({counts})"
    return {"call": side, "verdict": f"{side}: {figures}"}


def bench_load(bench: dict[str, Any]) -> dict[str, Any] | None:
    """The machine's 1-minute load average at both ends of a bench (``loadavg_before`` and
    ``loadavg_after``: ``os.getloadavg()`` triples, or one number each) with ``threads`` and
    ``quiet`` (both at most threads + :data:`LOAD_SLACK`); None when the bench recorded no load
    (benches written before these keys) or it is not a finite number."""
    ends = [bench.get(k) for k in ("loadavg_before", "loadavg_after")]
    ends = [e[0] if isinstance(e, list) and e else e for e in ends]
    if not all(isinstance(e, int | float) and math.isfinite(e) for e in ends):
        return None
    threads = bench.get("threads")
    limit = (threads if isinstance(threads, int) else 1) + LOAD_SLACK
    quiet = max(ends) <= limit
    return {"before": ends[0], "after": ends[1], "threads": threads, "limit": limit, "quiet": quiet}


# --- final loss against a swept numeric override -------------------------------------------------


def _number(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def swept_numeric(labels: list[str]) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """The numeric override that varies most across variant labels, and per label its value and the
    label of the other overrides (the line it belongs to; ``"all"`` when none). None when no
    override with at least two numeric values is set in every label (``norm=layer`` vs
    ``norm=rms``)."""
    parsed = {}
    for lab in labels:
        parts = [o.split("=", 1) for o in lab.split(",")]
        if not parts or any(len(p) != 2 for p in parts):
            return None
        parsed[lab] = dict(parts)
    if not parsed:
        return None
    keys = sorted(set.intersection(*(set(p) for p in parsed.values())))
    numeric = [k for k in keys if all(_number(p[k]) is not None for p in parsed.values())]
    numeric = [k for k in numeric if len({_number(p[k]) for p in parsed.values()}) >= 2]
    if not numeric:
        return None

    def spread(k: str) -> tuple[int, int]:
        return len({_number(p[k]) for p in parsed.values()}), -keys.index(k)

    key = max(numeric, key=spread)
    return key, {
        lab: (
            _number(p[key]),
            ",".join(f"{k}={v}" for k, v in sorted(p.items()) if k != key) or "all",
        )
        for lab, p in parsed.items()
    }


def swept_points(rep: Report) -> tuple[str, Points] | None:
    """``(key, line label -> [(value, final losses of the completed runs)])`` for
    :func:`swept_numeric` of the report's variants; None when nothing numeric is swept."""
    found = swept_numeric(rep.labels)
    if found is None:
        return None
    key, where = found
    points: Points = {}
    for lab, (x, line) in where.items():
        points.setdefault(line, []).append((x, [r.final_val_loss for r in rep.included(lab)]))
    return key, points


# --- planning a study from a pilot sweep ---------------------------------------------------------


def steps_to_time(warmup: int, diag_interval: int | None, timed: int = MIN_STEPS) -> int | None:
    """The fewest ``max_steps`` whose step time a run measures on ``timed`` steps: the trainer
    times neither its first ``warmup`` timed steps (``timing_warmup_steps``) nor a step with
    diagnostics (every ``diag_interval``-th); None when every step has them (1)."""
    if diag_interval == 1:
        return None
    n = counted = 0
    while counted < warmup + timed:
        n += 1
        counted += not (diag_interval and n % diag_interval == 0)
    return n


def untimed(runs: list[Run], steps: float) -> dict[str, Any]:
    """Why a pilot ``runs`` of ``steps`` steps (median) with no median step time has none, from
    its configs: ``warmup`` (the largest ``timing_warmup_steps``), ``diag_interval`` (the
    smallest, None when off), ``max_steps`` (the largest :func:`steps_to_time` over the runs;
    None when none records its warm-up or one has diagnostics at every step) and ``short``:
    True unless the runs did ``max_steps`` steps or more (then they recorded no step time)."""
    need, warmups, diags = [], [], []
    for r in runs:
        w, d = r.resolved("timing_warmup_steps"), r.resolved("diag_interval")
        d = d if isinstance(d, int) and d > 0 else None
        diags += [d] if d else []
        if isinstance(w, int):
            warmups.append(w)
            need.append(steps_to_time(w, d))
    max_steps = max(need) if need and None not in need else None
    return {
        "warmup": max(warmups, default=None),
        "diag_interval": min(diags, default=None),
        "max_steps": max_steps,
        "short": max_steps is None or not steps >= max_steps,
    }


def plan_study(rep: Report) -> dict[str, Any]:
    """What a TOST at ``rep.margin`` (nats/token) needs, planned from a pilot sweep ``rep``: per
    variant the paired std of its final losses, the std's one-sided 1−alpha upper confidence
    bound, the seeds for :data:`~normlab.report.stats.POWER` power at each
    (:func:`~normlab.report.stats.seeds_needed`, true difference 0; None: more than the search
    allows, or n < 2 in the pilot), and the hours the whole study takes on the pilot's machine
    at each: seeds × variants × (steps × the pilot's median step time + the median seconds a
    run spent outside training: evaluations, checkpoints and start-up, ``wall_time_s −
    train_time_s``, 0 when the pilot did not record them).

    Returns:
        ``{"margin", "alpha", "variants" (count, baseline included), "steps" (median steps
        done), "step_s" (median of the runs' median step time, seconds), "overhead_s" (per run,
        seconds, nan when not recorded), "run_s" (one run, seconds), "untimed" (None, or for a
        pilot too short to time, :func:`untimed`), "rows": [{"label", "n", "std",
        "std_upper", "seeds", "seeds_upper", "hours", "hours_upper"}]}``; hours nan untimed.
    """
    runs = [r for lab in rep.labels for r in rep.included(lab)]
    steps = finite_median([float(x) for r in runs if (x := steps_done(r)) is not None])
    step_s = _median_of(runs, "step_time_ms_median") / 1000
    overhead = finite_median(
        [r.summary_float("wall_time_s") - r.summary_float("train_time_s") for r in runs]
    )
    run_s = steps * step_s + (overhead if math.isfinite(overhead) else 0.0)
    n_var = len(rep.labels)

    def hours(seeds: int | None) -> float:
        return seeds * n_var * run_s / 3600 if seeds else NAN

    rows = []
    for c in rep.comparisons:
        p = c["power"]
        need = p["seeds_needed"] if c["n"] >= 2 else None
        upper = p["seeds_needed_upper"] if c["n"] >= 2 else None
        rows.append(
            {
                "label": c["label"],
                "n": c["n"],
                "std": c["std"],
                "std_upper": p["std_upper"],
                "seeds": need,
                "seeds_upper": upper,
                "hours": hours(need),
                "hours_upper": hours(upper),
            }
        )
    return {
        "margin": rep.margin,
        "alpha": rep.alpha,
        "variants": n_var,
        "steps": steps,
        "step_s": step_s,
        "overhead_s": overhead,
        "run_s": run_s,
        "untimed": None if math.isfinite(step_s) else untimed(runs, steps),
        "rows": rows,
    }


# --- stability: loss spikes, largest activations, gradient norms ---------------------------------

#: ``summary.json`` keys of the run's stability record (``normlab.training.record``).
SPIKES_KEY, MAX_GRAD_KEY = "loss_spikes", "max_grad_norm"
#: Suffixes of the ``diag/`` outlier statistics (``normlab.training.diagnostics.tail_stats``).
ABSMAX_SUFFIX, KURTOSIS_SUFFIX = "_absmax", "_kurtosis"


def largest_diag(run: Run, suffix: str) -> tuple[float, str | None]:
    """The largest finite value of the ``diag/...<suffix>`` keys over every diagnosed row of
    ``run`` and the sublayer that had it (``block1/mlp``); ``(nan, None)`` when none."""
    best, where = NAN, None
    for row in run.metrics:
        for k, v in row.items():
            if k.startswith("diag/") and k.endswith(suffix) and math.isfinite(x := num(v)):
                if not best >= x:  # nan compares False: the first value wins
                    best, where = x, k.removeprefix("diag/").removesuffix(suffix)
    return best, where


def _largest(runs: list[Run], suffix: str) -> dict[str, Any]:
    found = [largest_diag(r, suffix) for r in runs]
    found = [f for f in found if f[1] is not None]
    if not found:
        return {"value": NAN, "where": None, "runs": 0}
    value, where = max(found, key=lambda f: f[0])
    return {"value": value, "where": where, "runs": len(found)}


def _spike_counts(rep: Report, label: str) -> dict[Any, float]:
    """Seed -> the loss-spike count of each included run of ``label`` that recorded one."""
    out = {}
    for r in rep.included(label):
        v = (r.summary or {}).get(SPIKES_KEY)
        if r.seed is not None and isinstance(v, (int, float)):
            out[r.seed] = float(v)
    return out


def stability(rep: Report) -> dict[str, Any] | None:
    """The stability comparison of the included runs, or None when no run recorded any of it.

    Per variant: ``spikes`` (``describe`` of the runs' loss-spike counts, their ``total`` and the
    runs with at least one, ``spiky``), ``absmax`` / ``kurtosis`` (the largest ``diag/`` abs-max
    and kurtosis over its runs' diagnosed steps, with the sublayer, :func:`largest_diag`) and
    ``grad_norm`` (the largest pre-clip global gradient norm over its runs). Per other variant,
    ``diff``: the paired spike-count difference variant − baseline by seed with its 1−alpha
    Student t interval (``paired_difference``'s ``n``, ``mean``, ``ci``). ``all_zero``: no run
    counted a spike (the report then shows counts, no interval). ``rules``: the distinct spike
    rules (``summary.json``'s ``loss_spike_rule``: ``{"window", "k"}``) of the runs.
    """
    counts = {lab: _spike_counts(rep, lab) for lab in rep.labels}
    absmax = {lab: _largest(rep.included(lab), ABSMAX_SUFFIX) for lab in rep.labels}
    if not any(counts.values()) and not any(a["runs"] for a in absmax.values()):
        return None
    variants, diffs = {}, {}
    for lab in rep.labels:
        runs, c = rep.included(lab), list(counts[lab].values())
        grads = [g for r in runs if math.isfinite(g := r.summary_float(MAX_GRAD_KEY))]
        variants[lab] = {
            "spikes": {**describe(c), "total": sum(c), "spiky": sum(x > 0 for x in c)},
            "absmax": absmax[lab],
            "kurtosis": _largest(runs, KURTOSIS_SUFFIX),
            "grad_norm": max(grads) if grads else NAN,
        }
        if lab != rep.baseline:
            seeds, d = _paired(counts[rep.baseline], counts[lab])
            pd = paired_difference(d, 0.5, rep.alpha, "spikes")
            diffs[lab] = {"seeds": seeds, "n": pd["n"], "mean": pd["mean"], "ci": pd["ci"]}
    every = [x for c in counts.values() for x in c.values()]
    rules = {
        json.dumps(rule, sort_keys=True)
        for lab in rep.labels
        for r in rep.included(lab)
        if (rule := (r.summary or {}).get("loss_spike_rule"))
    }
    return {
        "variants": variants,
        "diff": diffs,
        "all_zero": bool(every) and not any(every),
        "rules": [json.loads(x) for x in sorted(rules)],
    }


# --- downstream tasks (eval_tasks, normlab.evals) -------------------------------------------------

#: The equivalence margin of a downstream accuracy (a fraction: one accuracy point) and of a
#: downstream bits per byte (bits/byte), for the paired TOST of :func:`downstream_comparisons`.
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
    """``{key: metric_comparison}`` of each downstream key (:func:`downstream_keys`): the final
    value per variant and the paired difference variant − baseline by seed, TOST at
    :data:`DOWNSTREAM_MARGIN` (accuracy: a positive difference is the variant right more often;
    bpb: a positive one is the variant worse), exactly as a held-out corpus's loss is paired."""
    every = [r for runs in included.values() for r in runs]
    out = {}
    for key in downstream_keys(every):
        unit = "bits/byte" if key.endswith("/bpb") else "accuracy"
        out[key] = metric_comparison(included, baseline, key, DOWNSTREAM_MARGIN, alpha, unit)
    return out


# --- a best design: a tested lead beyond the margin, over a baseline that has runs --------------


def best_design(rep: Report) -> dict[str, Any] | None:
    """Whether one design of a family (more than one variant against the baseline) is shown
    best. The two with the lowest mean final validation loss, the baseline among the candidates,
    are the leader and the runner-up; the leader is shown best only if the paired difference
    runner-up − leader (nats/token, over the seeds both completed) is detectable: its two-sided
    paired t-test p-value (two-sided, since the leader was picked by the same data), Holm-adjusted
    together with the family's tests of each variant against the baseline, is below alpha; and
    only if nothing withholds it (:func:`best_withheld`: a baseline with no completed run, a lead
    inside the study's margin). Seeds of the two that did not complete are named
    (:func:`not_completed`): the claim is over the seeds that did.

    Returns:
        None for a single comparison; else ``leader``, ``runner_up``, the paired difference's
        ``n``, ``mean``, ``ci`` (1−alpha), ``equivalent`` (its TOST at the margin), ``p`` and
        ``p_holm`` (over ``family`` tests), ``detectable`` (``p_holm`` < alpha), ``withheld``
        (why no best design is named whatever the test says, or None), ``exclusions`` (the
        two's seeds that did not complete, as text) and ``shown`` (True: the leader is the best
        design).
    """
    if len(rep.comparisons) < 2:
        return None
    ranked = sorted(
        (v for v in rep.variants if math.isfinite(v["mean"])), key=lambda v: (v["mean"], v["label"])
    )
    if len(ranked) < 2:
        return None
    leader, runner = ranked[0]["label"], ranked[1]["label"]
    _, diffs = _paired(
        {s: r.final_val_loss for s, r in _by_seed(rep, leader).items()},
        {s: r.final_val_loss for s, r in _by_seed(rep, runner).items()},
    )
    pd = paired_difference(diffs, rep.margin, rep.alpha)
    p = p_two_sided(pd)
    family = [c["holm"]["p_diff"] for c in rep.comparisons if c.get("holm")] + [p]
    p_holm = holm(family)[-1]
    detectable = bool(math.isfinite(p_holm) and p_holm < rep.alpha)
    withheld = best_withheld(rep, leader, runner, pd, detectable)
    return {
        "leader": leader,
        "runner_up": runner,
        "n": pd["n"],
        "mean": pd["mean"],
        "ci": pd["ci"],
        "equivalent": pd["equivalent"],
        "p": p,
        "p_holm": p_holm,
        "family": sum(math.isfinite(x) for x in family),
        "detectable": detectable,
        "withheld": withheld,
        "exclusions": not_completed(rep, leader) + not_completed(rep, runner),
        "shown": detectable and withheld is None,
    }


def best_withheld(
    rep: Report, leader: str, runner: str, lead: dict[str, Any], detectable: bool
) -> str | None:
    """Why no best design is named whatever the leader's test says (a phrase), or None: the
    baseline has no completed run (every variant is then measured against nothing), or a
    detectable lead (``lead``: runner-up − leader, :func:`paired_difference`, nats/token) whose
    mean is not beyond the study's margin (a lead the report would call equivalent)."""
    if not rep.included(rep.baseline):
        n = sum(r.label == rep.baseline for r in rep.runs)
        return (
            f"the baseline `{rep.baseline}` has no completed run ({n} excluded, see Excluded "
            "runs): no variant is measured against it"
        )
    if detectable and not lead["mean"] > rep.margin:
        tost = " (TOST: equivalent)" if lead["equivalent"] else ""
        return (
            f"the lead of `{leader}` over `{runner}`, {lead['mean']:+.4f} nats/token, is inside "
            f"the study's margin ±{rep.margin:g}{tost}, within which the report calls variants "
            "equivalent"
        )
    return None


def not_completed(rep: Report, label: str) -> list[str]:
    """The seeds of the study (those of every run) that variant ``label`` did not complete, as
    ``"`label` seed S: reason"``: its run's exclusion reason, or ``no run`` (a seed it has no
    run of that trained). In a tuned study only its runs at its own best learning rate count."""
    runs = [r for r in rep.runs if r.label == label]
    if rep.tuned is not None:
        runs = [r for r in runs if run_lr(r) == rep.tuned["best"].get(label)]
    out = [f"`{label}` seed {r.seed}: {r.excluded}" for r in runs if r.excluded is not None]
    missing = {r.seed for r in rep.runs if r.seed is not None} - {r.seed for r in runs}
    return out + [f"`{label}` seed {s}: no run" for s in sorted(missing, key=str)]
