"""``report.md``, rendered section by section: the header, the compute-equivalent verdict (the
headline: steps x speed), the context the verdict holds in, the
final losses per variant and what happened to each run, the verdict with its warnings, the paired
table, the tuned comparison, bits per byte and the held-out corpora, the speed verdict and the
sequential step-time ratio with its checks, the time to a target loss, the excluded runs, the
figures, final loss against a swept value, and the per-block diagnostics. Each section returns
Markdown lines ([] when it has nothing to say). Losses in nats/token, bpb in bits/byte, times in
seconds or ms as named. Also the lines ``normlab-report --plan`` prints (:func:`render_plan`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.compare import (
    BENCH_FILE,
    DEFAULT_MARGIN,
    GAP_ROWS,
    LOAD_SLACK,
    NOT_COMPARABLE_MARK,
    SPLIT_SEEDS,
    Report,
    best_design,
    margin_in_compute,
    not_comparable,
    swept_points,
)
from normlab.report.ladder import Ladder, comparison_at
from normlab.report.runs import INERT_KEYS, Run
from normlab.report.series import (
    BETWEEN_LIMIT,
    DRIFT_LIMIT,
    MIN_STEPS,
    SPREAD_LIMIT,
    diag_entries,
    diag_summary,
)
from normlab.report.stats import POWER, compute_for_nats

#: What the header says of the default margin.
SCREEN = (
    " (the default margin: a gross-difference screen, which catches a broken norm; it is no "
    "parity claim: set `--margin` to the effect that matters)"
)
EMA_BETA = 0.95  # training-loss smoothing in the figure, per logged step


# --- text helpers ---------------------------------------------------------------------------------

#: Where the report's methods are explained (a report links there instead of re-explaining).
METHODS = "`docs/reports.md`"
ANNEALED_SECTION = '"Annealed budgets"'


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt(x: Any, spec: str = ".4f") -> str:
    """``x`` formatted by ``spec``; ``"n/a"`` for None and non-finite floats."""
    return "n/a" if _missing(x) else format(x, spec)


def fmt_power(p: Any) -> str:
    """A power (probability) as a percentage, ``">99%"`` above 0.99 and ``"<1%"`` below 0.01:
    a power computed from an estimated std is not known to the last percent."""
    if _missing(p):
        return "n/a"
    return ">99%" if p > 0.99 else "<1%" if p < 0.01 else format(p, ".0%")


def fmt_ci(ci: tuple[float, float], spec: str = "+.4f") -> str:
    """An interval as ``[lo, hi]``."""
    return f"[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table: a header line, the rule, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def figure_lines(figures: dict[str, Any], titles: dict[str, str]) -> list[str]:
    """An image link per figure written, ``- <title>: no data`` for one skipped."""
    return [
        f"![{t}]({figures[k].name})\n" if figures.get(k) else f"- {t}: no data\n"
        for k, t in titles.items()
    ]


# --- the verdict and its tables ------------------------------------------------------------------


def _conf(rep: Report) -> str:
    """The name of the 1−alpha interval (``95% CI``)."""
    return f"{100 * (1 - rep.alpha):g}% CI"


def _confs(rep: Report) -> tuple[str, str]:
    """The names of the 1−alpha and the 1−2·alpha (TOST) intervals."""
    return _conf(rep), f"{100 * (1 - 2 * rep.alpha):g}% CI"


def _header(rep: Report) -> list[str]:
    n_exc = sum(r.excluded is not None for r in rep.runs)
    shared = ", ".join(f"`{o}`" for o in rep.common_overrides) or "none"
    sources = ", ".join(f"`{p}`" for p in rep.sources)
    return [
        "# normlab sweep report",
        "",
        f"- Runs from: {sources}",
        f"- Equivalence margin: ±{rep.margin:.4g} nats/token; alpha = {rep.alpha:g}"
        + (SCREEN if rep.margin == DEFAULT_MARGIN and rep.margin_compute is None else ""),
        f"- Margin in effective compute: {margin_text(rep)}",
        f"- Baseline: `{rep.baseline}`",
        f"- Runs: {len(rep.runs)} found, {len(rep.runs) - n_exc} included, {n_exc} excluded",
        *([f"- Skipped (never trained, in no table): {_skipped(rep)}"] if rep.skipped else []),
        f"- Overrides that do not tell the variants apart (left out of the labels): {shared}",
        "- Keys that change no compared number, never in a label nor a refusal: "
        + ", ".join(f"`{k}`" for k in INERT_KEYS),
    ]


def _slope_text(rep: Report) -> str:
    if rep.slope_source == "annealed":
        return (
            f"the baseline's annealed slope, {fmt(rep.slope, '.3g')} nats per e-fold of steps "
            f"between its annealed budgets (its curve's within-run end slope, "
            f"{fmt(rep.slope_within, '.3g')}, would be worth "
            f"{compute_for_nats(rep.margin, rep.slope_within):.2%})"
            if math.isfinite(rep.slope_within) and rep.slope_within > 0
            else f"the baseline's annealed slope, {fmt(rep.slope, '.3g')} nats per e-fold of steps"
        )
    return (
        f"the baseline's end slope, {fmt(rep.slope, '.3g')} nats per e-fold of steps (a "
        "within-run reading of one decaying curve, not of annealed budgets: see "
        f"{METHODS}, {ANNEALED_SECTION})"
    )


def margin_text(rep: Report) -> str:
    """The margin in effective compute and in nats, converted with the baseline's slope."""
    slope = _slope_text(rep)
    if rep.margin_compute is not None:
        return (
            f"±{rep.margin_compute:.3g} of effective compute (`--margin-compute`), converted to "
            f"±{rep.margin:.4g} nats/token at {slope}; the TOST runs at that nats margin"
        )
    worth = margin_in_compute(rep)
    if not math.isfinite(worth):
        return "not converted (the baseline's curve has no end slope: < 2 evaluations after step 0)"
    return f"±{rep.margin:g} nats/token is worth {worth_text(worth)} at {slope}"


#: Above this fraction a margin's worth in compute says only that the baseline's curve is flat.
MAX_WORTH = 10.0


def worth_text(worth: float) -> str:
    """A margin's worth in effective compute (a fraction) as text; beyond :data:`MAX_WORTH`
    (1000%) the number is no measure, only a sign that the baseline's curve is nearly flat."""
    if worth > MAX_WORTH:
        return (
            f"more than {MAX_WORTH:.0%} of effective compute (the baseline's curve is nearly "
            "flat: the margin is no question of compute)"
        )
    return f"{worth:.2%} of effective compute"


def _k_text(k: dict[str, Any]) -> str:
    ci = f"[{fmt(k['ci'][0], '.3f')}, {fmt(k['ci'][1], '.3f')}]" if k["n"] >= 2 else "(n < 2)"
    parts = f"steps x speed: {k['step_mult']:.3f} x {k['speed']:.3f}"
    return f"{k['k']:.3f}x{{base}} {ci} (n = {k['n']}; {parts})"


def compute_headline(rep: Report, c: dict[str, Any]) -> str:
    """One comparison's compute-equivalent verdict in one sentence: "norm=rms: 1.013x the
    effective compute of norm=layer [0.991, 1.036] (n = 3; steps x speed: 0.995 x 1.018)"."""
    k = c["compute"]
    if k["n"] == 0:
        return (
            f"{c['label']}: no seed with both validation curves (>= 2 evaluations each) and "
            f"step times: no compute-equivalent verdict against {rep.baseline}"
        )
    base = f" the effective compute of {rep.baseline}"
    text = f"{c['label']}: " + _k_text(k).format(base=base)
    if (m := k.get("steps_only")) and m["n"]:  # its speed part fails the step-time checks
        ci = f"[{fmt(m['ci'][0], '.3f')}, {fmt(m['ci'][1], '.3f')}]" if m["n"] >= 2 else "(n < 2)"
        text += (
            f"; its speed part is NOT COMPARABLE (sequential step times that fail the report's "
            f"checks): the steps part alone is {m['k']:.3f}x {ci} (n = {m['n']})"
        )
    return text


def _reading_note(c: dict[str, Any]) -> str:
    """Which curve the steps part was read on, and the other reading when there is one."""
    k = c["compute"]
    if k.get("reading") == "annealed":
        w = k.get("within")
        other = (
            f"; read within the runs' own curves instead: {_k_text(w).format(base='')}"
            if w and w["n"]
            else ""
        )
        return f"steps read on annealed budgets{other}"
    return (
        "steps read within one decaying curve per run (no annealed points): a within-run "
        f"reading, which leans as {METHODS}, {ANNEALED_SECTION}, says"
    )


def _compute_note(rep: Report, c: dict[str, Any]) -> str:
    """Where the speed part of a compute-equivalent verdict comes from, with its flag."""
    k = c["compute"]
    if k["source"] == "interleaved":
        return "speed from the interleaved step benchmark (its interval widens k's)"
    if not k["comparable"]:
        return (
            "speed from the runs' sequential step times, **NOT COMPARABLE**: they fail the "
            "report's step-time checks, so k's speed part is unreliable"
        )
    return "speed from the runs' sequential step times, per seed (no interleaved bench)"


def render_compute(rep: Report) -> list[str]:
    """``## Compute-equivalent verdict``: the headline of each comparison, first in the report."""
    if not rep.comparisons:
        return []
    out = ["", "## Compute-equivalent verdict", ""]
    for c in rep.comparisons:
        out += [f"- **{compute_headline(rep, c)}**; {_reading_note(c)}; {_compute_note(rep, c)}"]
    return out + [
        "",
        "k = (steps the baseline needs to reach the variant's final validation loss, per step "
        "of the variant) × (baseline / variant step time); above 1 the variant gives more "
        f"effective compute; geometric mean over seeds with the {_conf(rep)} on log k (Student "
        f't, Welch-Satterthwaite df with a bench); method: {METHODS}, "The headline: effective '
        'compute".',
    ]


def _untimed_text(plan: dict[str, Any]) -> str:
    """Why the pilot of ``plan`` (:func:`~normlab.report.compare.plan_study`) has no step time,
    and the ``max_steps`` that would time it (:func:`~normlab.report.compare.untimed`)."""
    u = plan["untimed"]
    warmup, diag, need = u["warmup"], u["diag_interval"], u["max_steps"]
    if not u["short"]:
        return (
            f"its runs did {fmt(plan['steps'], '.0f')} steps, enough to time, but record no "
            "step time (`step_time_ms_median` in summary.json), so no hours follow"
        )
    why = f"the pilot is too short to time: its runs did {fmt(plan['steps'], '.0f')} steps"
    if warmup is not None:
        why += f" and the first {warmup} (the timing warm-up, `timing_warmup_steps`) are not timed"
    if diag is not None:
        why += f", nor is a step with diagnostics (every {diag}: `diag_interval`)"
    why += ", so no run has a step time and no hours follow"
    if need is not None:
        return why + (
            f"; rerun it with max_steps={need} (so that {MIN_STEPS} steps are timed after the "
            "warm-up) to time it"
        )
    if diag == 1:
        return why + "; rerun it with diag_interval=null (every step had diagnostics) to time it"
    return why + "; rerun it with more steps than its timing warm-up (not recorded) to time it"


def _plan_row(plan: dict[str, Any], r: dict[str, Any], baseline: str) -> str:
    """One variant's line of :func:`render_plan`: seeds (and hours, when the pilot was timed)
    at the paired std and at its upper bound."""
    if r["n"] < 2:
        return f"  {r['label']} vs {baseline}: n = {r['n']} paired seeds, need >= 2"
    timed = plan["untimed"] is None
    seeds = r["seeds"] or "more than 100000"
    upper = r["seeds_upper"] or "more than 100000"
    hours, hours_upper = (
        f", {fmt(h, '.2f')} h" if timed else "" for h in (r["hours"], r["hours_upper"])
    )
    tail = f" (seeds x {plan['variants']} variants x one run)" if timed else " (hours: not timed)"
    return (
        f"  {r['label']} vs {baseline}: paired std {fmt(r['std'])} (n = {r['n']}): "
        f"{seeds} seeds{hours}; at the std's {1 - plan['alpha']:.0%} upper bound "
        f"{fmt(r['std_upper'])}: {upper} seeds{hours_upper}{tail}"
    )


def render_plan(plan: dict[str, Any], baseline: str) -> list[str]:
    """The lines ``normlab-report --plan`` prints (:func:`~normlab.report.compare.plan_study`):
    the seeds per variant, and the hours when the pilot was timed, else why it was not."""
    over = plan["overhead_s"]
    outside = f" + {over:.1f} s outside training" if math.isfinite(over) else ""
    one_run = (
        f"{plan['steps']:g} steps x {plan['step_s'] * 1000:.1f} ms (the pilot's median step)"
        f"{outside} = {plan['run_s']:.1f} s"
        if plan["untimed"] is None
        else f"not timed: {_untimed_text(plan)}"
    )
    head = (
        f"plan for a TOST at ±{plan['margin']:g} nats/token, {POWER:.0%} power, alpha = "
        f"{plan['alpha']:g}, {plan['variants']} variants, {plan['steps']:g} steps per run; "
        f"one run here: {one_run}"
    )
    return [head, *(_plan_row(plan, r, baseline) for r in plan["rows"])]


# --- the ladder report (one comparison across model sizes) ---------------------------------------


def si(x: float) -> str:
    """``826112`` -> ``"826k"``, ``1.24e8`` -> ``"124M"``, ``9.5e12`` -> ``"9.5T"``."""
    if _missing(x):
        return "n/a"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def one_margin(lad: Ladder) -> float | None:
    """The margin (nats/token) every size used, or None when each size has its own:
    ``--margin-compute`` converts its fraction at each size's own baseline slope."""
    if any(s["report"].margin_compute is not None for s in lad.sizes):
        return None
    margins = {s["report"].margin for s in lad.sizes}
    return margins.pop() if len(margins) == 1 else None


def _ladder_margin(lad: Ladder) -> str:
    """The header's margin: the one every size used, or that each size has its own (Sizes)."""
    one = one_margin(lad)
    if one is not None:
        return f"±{one:.4g} nats/token at each size"
    low, high = (f(s["report"].margin for s in lad.sizes) for f in (min, max))
    span = f"±{low:.4g} to ±{high:.4g} nats/token: see Sizes"
    fractions = {s["report"].margin_compute for s in lad.sizes}
    if len(fractions) == 1 and None not in fractions:
        return (
            f"per size: ±{fractions.pop():.3g} of effective compute (`--margin-compute`), "
            f"converted to nats at each size's own baseline slope, so no one margin in nats "
            f"holds for every size ({span})"
        )
    return f"per size ({span})"


def _ladder_header(lad: Ladder) -> list[str]:
    links = ", ".join(f"[{s['shape']}]({s['shape']}/report.md)" for s in lad.sizes)
    variants = ", ".join(f"`{lab}`" for lab in lad.labels[1:])
    k = len(lad.law_sizes)
    return [
        "# normlab ladder report",
        "",
        f"- Sources: {', '.join(f'`{s}`' for s in lad.sources)}",
        "- The question: quality across model sizes (of the four: equal steps, equal wall-clock, "
        f"each kind at its own best learning rate, model size). `{lad.baseline}` against "
        f"{variants} at {len(lad.sizes)} sizes, paired by seed within each size; each size's "
        f"full report: {links}.",
        f"- Margin: {_ladder_margin(lad)}; alpha = {lad.alpha:g}.",
        "- N: `summary.json`'s `params` (`model.num_params`: every weight but the position "
        "embedding; the token embedding, tied with the head, counted once). Training compute C "
        "= (6 N + 12 L d T) FLOPs per token (`GPT.flops_per_token`: Kaplan et al. 2020) x the "
        "tokens trained on.",
        f"- Across sizes, one point per size: laws are fitted to the {k} size means, so their "
        f"degrees of freedom are sizes − parameters ({k - 3} for E + A (C/C0)^-alpha, {k - 2} for "
        "A (C/C0)^-alpha), and every interval across sizes comes from the size means; seeds "
        "measure the noise the lack-of-fit test compares against. Why: `docs/reports.md`, "
        "*The ladder report*.",
    ]


def _ladder_sizes(lad: Ladder) -> list[str]:
    """Per size: N, tokens, compute, runs, its own margin and the baseline slope that converted
    it (when the sizes have no one margin: :func:`one_margin`), and whether the laws use it."""
    one = one_margin(lad)
    rows = []
    for s in lad.sizes:
        rep = s["report"]
        done = sum(r.excluded is None for r in rep.runs)
        why = lad.left_out.get(s["shape"])
        row = [s["shape"], si(s["params"]), si(s["tokens"]), fmt(s["tokens"] / s["params"], ".3g")]
        row += [fmt(s["compute"], ".3g"), f"{done}/{len(rep.runs)}"]
        if one is None:
            row += [f"±{rep.margin:.4g}", f"{fmt(rep.slope, '.3g')} ({rep.slope_source})"]
        rows.append([*row, "yes" if why is None else f"**no**: {why}"])
    head = ["size (layers x width)", "N", "tokens", "tokens / N", "C (FLOPs)", "runs completed"]
    head += [] if one is not None else ["margin (nats/token)", "baseline slope (nats/e-fold)"]
    return ["", "## Sizes", "", *table([*head, "in the laws"], rows)]


def _pair_row(lad: Ladder, size: dict[str, Any], label: str) -> list[Any]:
    """One size's row of :func:`_ladder_pairs`: loss difference, step multiplier, speed, k."""
    c = comparison_at(size, label)
    if c is None:
        return [size["shape"], 0, "—", "—", f"no run of `{label}`", "—", "—", "—", "—", "—", "—"]
    k = c["compute"]
    m = next(r for r in lad.trends[label]["sizes"] if r["shape"] == size["shape"])
    speed = k["source"] + ("" if k["comparable"] else " (**not comparable**)")
    row = [size["shape"], c["n"], fmt(c["mean"], "+.4f"), fmt_ci(c["ci"]), c["verdict"]]
    row += [fmt(m["m"], ".3f"), fmt_ci(m["ci"], ".3f"), fmt(k["speed"], ".3f"), speed]
    return [*row, fmt(k["k"], ".3f"), fmt_ci(k["ci"], ".3f")]


def _ladder_pairs(lad: Ladder, label: str) -> list[str]:
    """Per size: the paired loss difference of ``label``, its step multiplier m, the speed part
    apart, and the compute-equivalent multiplier k = m x speed."""
    conf = f"{100 * (1 - lad.alpha):g}% CI"
    head = ["size", "n", "loss diff", conf, "verdict", "step mult. m", f"m {conf}", "speed"]
    head += ["speed from", "k = m x speed", f"k {conf}"]
    return [
        "",
        f"## `{label}` vs `{lad.baseline}` at each size",
        "",
        "Loss diff: final validation loss, variant − baseline (nats/token), paired by seed, with "
        "its Student t interval and the size's TOST verdict. m: the step multiplier (steps of "
        "the baseline one step of the variant is worth, read on the paired validation curves), "
        "geometric mean over seeds with its interval on log m. Speed: the step-time ratio "
        "baseline / variant, a property of the machine, `interleaved` from a step benchmark or "
        "`sequential` from the runs' own step times (noisy on a loaded machine). k: the "
        "compute-equivalent multiplier, m x speed; above 1 the variant gives more compute.",
        "",
        *table(head, [_pair_row(lad, s, label) for s in lad.sizes]),
    ]


def _trend_word(t: dict[str, Any]) -> str:
    """What a multiplier trend's slope interval shows."""
    lo, hi = t["slope_ci"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval with fewer than 3 sizes."
    if lo <= 0 <= hi:
        return "**no trend shown**: the interval holds 0."
    return f"**m {'grows' if lo > 0 else 'shrinks'} with size**."


def _ladder_trend(lad: Ladder, label: str) -> list[str]:
    """The slope of ln m on ln N, and the value at 124M parameters, an extrapolation shown only
    when the laws' leave-largest-out check passed."""
    t = lad.trends[label]
    conf = f"{100 * (1 - lad.alpha):g}%"
    if t["n"] < 2 or _missing(t["slope"]):
        return ["", f"- `{label}`: fewer than 2 sizes with a step multiplier: no trend."]
    how = "weighted by 1/se² of each size's ln m" if t["weighted"] else "unweighted"
    at = t["at_target"]
    where = f"{si(at['params'])} parameters (GPT-2 small, {fmt(at['beyond'], '.3g')}x beyond)"
    line = (
        f"- `{label}`: m ∝ N^b with b = {t['slope']:+.4f}, {conf} CI {fmt_ci(t['slope_ci'])} "
        f"(least squares of ln m on ln N over {t['n']} sizes, {how}; Student t with "
        f"{fmt(t['slope_df'], '.3g')} degrees of freedom): {_trend_word(t)}"
    )
    if at["refused"] is not None:
        return ["", line, f"- `{label}` at {where}: **no value**: {at['refused']}."]
    return [
        "",
        line,
        f"- `{label}` at {where}: m = {fmt(at['k'], '.3f')}, {conf} interval "
        f"{fmt_ci(at['ci'], '.3f')}. **An extrapolation**, shown because both laws predicted "
        "the left-out largest size within its margin; it holds only if ln m stays a straight "
        "line in ln N that far. The interval is the line's, not a new run's seed noise.",
    ]


def _law_row(lab: str, law: dict[str, Any]) -> list[Any]:
    """One variant's row of the laws table (:func:`~normlab.report.ladder.ladder_law`)."""
    if law["form"] is None:
        return [f"`{lab}`", "none", "—", "—", "—", "—", law["n"], law["runs"], "—", law["why"]]
    se = law["se"]
    ci = "n/a: 0 df" if law["dof"] == 0 else fmt_ci(law["alpha_ci"], ".4f")
    e = f"{fmt(law['E'])} ± {fmt(se['E'])}" if not _missing(law["E"]) else "—"
    row = [f"`{lab}`", law["form"], e, f"{fmt(law['A'])} ± {fmt(se['A'])}"]
    row += [f"{fmt(law['alpha'])} ± {fmt(se['alpha'])}", ci, law["n"], law["runs"], law["dof"]]
    return [*row, law["why"] or "3 parameters, a degree of freedom left, E inside its bounds"]


def _check_row(lad: Ladder, lab: str, law: dict[str, Any]) -> list[Any]:
    """One variant's lack-of-fit test and leave-largest-out prediction."""
    lof, loo = law["lof"], law["loo"]
    if lof is None:
        return [f"`{lab}`", "—", "—", "—", "—", "—", "—", "—"]
    f = f"{lof['F']:.3g} on ({lof['df_lof']}, {lof['df_pe']})"
    f = f if not _missing(lof["F"]) else f"n/a: df ({lof['df_lof']}, {lof['df_pe']})"
    row = [f"`{lab}`", f, fmt(lof["p"], ".3g"), loo["shape"]]
    if loo["why"] is not None:
        return [*row, f"n/a: {loo['why']}", fmt(loo["measured"]), "—", "—"]
    margin = next(s["report"].margin for s in lad.sizes if s["shape"] == loo["shape"])
    within = "yes" if abs(loo["error"]) <= margin else "**no**"
    row += [fmt(loo["predicted"]), fmt(loo["measured"]), fmt(loo["error"], "+.4f")]
    return [*row, f"{within} (±{margin:.4g})"]


def _ladder_laws(lad: Ladder) -> list[str]:
    """The loss-compute laws over the size means and, per law, its two checks."""
    c0 = ", ".join(f"`{lab}` {fmt(law['c0'], '.3g')}" for lab, law in lad.laws.items())
    head = ["variant", "law", "E (fitted)", "A", "alpha", f"alpha {100 * (1 - lad.alpha):g}% CI"]
    head += ["sizes", "runs", "dof", "why this form"]
    left = "; ".join(f"{shape} ({why})" for shape, why in lad.left_out.items())
    checks = ["variant", "lack of fit F (df)", "p", "left out", "predicted", "measured"]
    checks += ["error (nats)", "within margin"]
    laws = [_law_row(lab, law) for lab, law in lad.laws.items()]
    tests = [_check_row(lad, lab, law) for lab, law in lad.laws.items()]
    return [
        "",
        "## Final validation loss against training compute",
        "",
        "One point per size: the mean final validation loss (nats/token) of its completed seeds "
        f"at its training compute C (FLOPs); C0 the geometric mean of the sizes' C ({c0}), so A "
        "is the reducible loss there. **E is fitted**: the floor these sizes fit, not an "
        "irreducible loss, which a bigger model can go below. Least squares on the means "
        "(`scipy.optimize.curve_fit`, E in [0, lowest mean)); ± one standard error, alpha's "
        "interval Student t on sizes − parameters degrees of freedom. E + A (C/C0)^-alpha from "
        "4 sizes with E identified, else A (C/C0)^-alpha, with the reason.",
        *([] if not left else ["", f"Left out of every law, so all span the same sizes: {left}."]),
        "",
        *table(head, laws),
        "",
        "Lack of fit: the size means' scatter about the law against the seeds' scatter about "
        "their size's mean (an F test; a small p: the law misses by more than seed noise). "
        "Leave-largest-out: the law refitted without the largest size, read at its compute; a "
        "trend gets a 124M value only when both its laws land within that size's margin.",
        "",
        *table(checks, tests),
    ]


LADDER_FIGURES = {
    "ladder_loss": "Final validation loss vs training compute (log-log): size means, fitted laws",
    "ladder_multiplier": "Step multiplier vs parameters, its trend (to 124M when allowed)",
}


def render_ladder(lad: Ladder) -> str:
    """The ladder report (``report.md`` of a sweep over model sizes) as Markdown."""
    lines = [*_ladder_header(lad), *_ladder_sizes(lad)]
    for lab in lad.labels[1:]:
        lines += _ladder_pairs(lad, lab)
    if lad.trends:
        lines += [
            "",
            "## Trend of the step multiplier with size",
            "",
            "Of m alone: the speed part of k is the machine's, read per size above, with no law "
            "in N to extrapolate.",
        ]
        for lab in lad.labels[1:]:
            lines += _ladder_trend(lad, lab)
    lines += [*_ladder_laws(lad), "", "## Figures", ""]
    lines += figure_lines(lad.figures, LADDER_FIGURES)
    return "\n".join(lines).rstrip("\n") + "\n"


def _skipped(rep: Report) -> str:
    """The run dirs that never trained, each with its reason, on one line."""
    return "; ".join(f"`{run.name}` ({why})" for run, why in rep.skipped)


# --- an unfinished sweep -------------------------------------------------------------------------

#: At most this many jobs of an unfinished sweep are named in each list; the rest are counted.
JOBS_NAMED = 20


def _jobs(rows: list[tuple[int, str, str]], why: bool, code: bool) -> str:
    """``job N (overrides: why)`` for each of ``rows`` (at most :data:`JOBS_NAMED`)."""
    q = "`" if code else ""
    named = []
    for num, swept, reason in rows[:JOBS_NAMED]:
        shown = [f"{q}{swept}{q}"] if swept else []
        inner = ": ".join(shown + ([reason] if why else []))
        named.append(f"job {num} ({inner})" if inner else f"job {num}")
    more = f" and {len(rows) - JOBS_NAMED} more" if len(rows) > JOBS_NAMED else ""
    return ", ".join(named) + more


def unfinished_text(u: dict[str, Any], code: bool = True) -> str:
    """One unfinished sweep (:func:`~normlab.report.runs.unfinished_sweep`) in one line: how many
    jobs its record lists and how many ended, which did not finish (and why) and which never
    started, by Hydra's job numbers with their swept overrides (as code when ``code``)."""
    never, unfinished = u["never_started"], u["unfinished"]
    q = "`" if code else ""
    parts = [
        f"its {q}multirun.yaml{q} lists {u['jobs']} jobs (numbered from 0, as its job dirs), "
        f"{u['jobs'] - len(never) - len(unfinished)} ended"
    ]
    if unfinished:
        parts.append(f"{len(unfinished)} did not finish: {_jobs(unfinished, True, code)}")
    if never:
        parts.append(f"{len(never)} never started: {_jobs(never, False, code)}")
    return "; ".join(parts)


def unfinished_notes(rep: Report) -> list[str]:
    """What ``normlab-report`` prints of each unfinished sweep: one line with its jobs and the
    command that continues it."""
    return [
        f"warning: unfinished sweep {u['dir']}: {unfinished_text(u, code=False)}; "
        f"continue it with: {u['command']}"
        for u in rep.unfinished
    ]


def render_unfinished(rep: Report) -> list[str]:
    """``## Unfinished sweep`` for each source sweep whose record lists jobs that never started
    or did not finish: which (:func:`unfinished_text`), that the report holds only the runs that
    ended, and the command that continues the sweep."""
    out = []
    for u in rep.unfinished:
        text = unfinished_text(u)
        left = (
            " Left out of the command (they name code to import, or hold control characters): "
            + ", ".join(f"`{o!r}`" for o in u["left_out"])
            + "."
            if u["left_out"]
            else ""
        )
        out += [
            "",
            f"## Unfinished sweep: `{u['dir']}`",
            "",
            f"{text[0].upper()}{text[1:]}. This report holds only the runs that ended. Continue "
            "the sweep with the command below (`resume=auto`: a job that completed does nothing, "
            f"one that was stopped continues from its checkpoint, the others start).{left}",
            "",
            "```",
            u["command"],
            "```",
        ]
    return out


def _variants(rep: Report) -> list[str]:
    head = ["variant", "n", "excluded", "mean", "std", "min", "max", "step time (ms)", "tokens/s"]
    bpb = any(v["bpb"]["n"] for v in rep.variants)
    head += ["mean bpb"] if bpb else []
    rows = [
        [
            f"`{v['label']}`",
            v["n"],
            v["excluded"],
            *(fmt(v[k]) for k in ("mean", "std", "min", "max")),
            fmt(v["step_time_ms"], ".1f"),
            fmt(v["tokens_per_s"], ",.0f"),
            *([fmt(v["bpb"]["mean"])] if bpb else []),
        ]
        for v in rep.variants
    ]
    return [
        "",
        "## Final validation loss per variant",
        "",
        "Loss in nats/token; std is the sample std (ddof=1); step time and tokens/s are medians "
        "over runs of each run's median; bpb (bits per byte, where recorded) is the final "
        "validation bpb.",
        "",
        *table(head, rows),
    ]


def _sentence(rep: Report, c: dict[str, Any]) -> str:
    conf, tconf = _confs(rep)
    m, seeds = rep.margin, ", ".join(map(str, c["seeds"])) or "none"
    who = f"**`{c['label']}` − `{rep.baseline}`**"
    if c["n"] < 2:
        what = (
            f"one seed paired with the baseline ({seeds}): difference "
            f"{fmt(c['mean'], '+.4f')} nats/token"
            if c["n"]
            else "no seed where both completed: nothing to pair"
        )
        return (
            f"{who}: {what}; an interval and a verdict need at least 2 paired seeds. "
            f"Verdict: **{c['verdict']}**."
        )
    p = c["power"]
    need = p["seeds_needed"]
    return _family_clause(
        rep,
        c,
        f"{who}: over n = {c['n']} seeds paired with the baseline ({seeds}), the final validation "
        f"loss differs by {fmt(c['mean'], '+.4f')} nats/token on average (std {fmt(c['std'])}); "
        f"{conf} {fmt_ci(c['ci'])}, {tconf} {fmt_ci(c['ci_tost'])}; TOST at ±{m:g} nats: one-sided "
        f"p = {fmt(c['p_lower'], '.3g')} for H0 difference ≤ −{m:g} and "
        f"p = {fmt(c['p_upper'], '.3g')} for H0 difference ≥ +{m:g}. Verdict: **{c['verdict']}**. "
        f"Power: with the observed std, ±{m:g} nats needs {need if need else 'more than 100000'} "
        f"seeds for {POWER:.0%} TOST power if the true difference is 0 (n = {c['n']} here gives "
        f"{fmt_power(p['at_n'])}; the std itself is estimated from {c['n']} pairs"
        + (
            f", {c['n'] - 1} degree(s) of freedom: a rough figure, which more seeds can overturn)."
            if c["n"] <= 3
            else ")."
        )
        + _upper_clause(rep, c),
    )


def _upper_clause(rep: Report, c: dict[str, Any]) -> str:
    """The seeds the margin needs at the std's one-sided 1−alpha upper confidence bound."""
    p = c["power"]
    need = p["seeds_needed_upper"]
    times = f"{p['std_upper'] / c['std']:.3g}x the estimate" if c["std"] > 0 else "a zero std"
    return (
        f" Planned at the std's {1 - rep.alpha:.0%} upper confidence bound "
        f"({fmt(p['std_upper'])}, {times}), "
        f"±{rep.margin:g} nats needs {need if need else 'more than 100000'} seeds."
    )


def _family_clause(rep: Report, c: dict[str, Any], sentence: str) -> str:
    """``sentence`` followed, for a comparison of a family (``c["holm"]``), by its Holm verdict."""
    h = c.get("holm")
    if not h:
        return sentence
    return (
        f"{sentence} Over the family of {len(rep.comparisons)} comparisons with "
        f"`{rep.baseline}` (Holm-adjusted p = {fmt(h['p_tost_holm'], '.3g')} for equivalence, "
        f"{fmt(h['p_diff_holm'], '.3g')} for a difference): **{h['verdict']}**."
    )


def _verdict(rep: Report) -> list[str]:
    out = ["", "## Verdict", ""]
    out += [f"> **Warning:** {w}.\n" for w in rep.confounds]
    if not rep.comparisons:
        return [*out, "Only one variant: nothing to compare."]
    return out + [line for c in rep.comparisons for line in (_sentence(rep, c), "")][:-1]


def _paired_table(rep: Report) -> list[str]:
    if not rep.comparisons:
        return []
    conf, tconf = _confs(rep)
    m = rep.margin
    head = ["variant", "n", "mean diff", "std", conf, tconf, "p (H0: ≤ −margin)"]
    head += ["p (H0: ≥ +margin)", "verdict", "TOST power at n", f"seeds for {POWER:.0%} power"]
    head += [f"seeds for {POWER:.0%} power if true diff = mean"]
    head += [f"seeds for {POWER:.0%} power at the std's {1 - rep.alpha:.0%} upper bound"]
    rows = [
        [
            f"`{c['label']}`",
            c["n"],
            fmt(c["mean"], "+.4f"),
            fmt(c["std"]),
            fmt_ci(c["ci"]),
            fmt_ci(c["ci_tost"]),
            fmt(c["p_lower"], ".3g"),
            fmt(c["p_upper"], ".3g"),
            c["verdict"],
            fmt_power(c["power"]["at_n"]),
            c["power"]["seeds_needed"] or "n/a",
            c["power"]["seeds_needed_observed"] or "n/a",
            c["power"]["seeds_needed_upper"] or "n/a",
        ]
        for c in rep.comparisons
    ]
    return [
        "",
        f"## Paired difference vs `{rep.baseline}` (variant − baseline, paired by seed)",
        "",
        f"Student t intervals; equivalence by TOST (Schuirmann 1987): equivalent iff the {tconf} "
        f"lies within ±{m:g} nats, i.e. both one-sided t-tests reject at alpha = {rep.alpha:g}; "
        f"the difference is detectable iff the {conf} excludes 0 (both can hold). Power: the "
        "probability that the TOST shows equivalence, for normal differences with the observed "
        "std (Phillips 1990); seeds needed: the smallest n reaching it (n/a: never, as when the "
        "true difference is at or beyond the margin); at the std's upper bound: the same for the "
        f"one-sided {1 - rep.alpha:.0%} upper confidence bound of the std (chi-square), which the "
        "true std of a few seeds can well reach.",
        "",
        *table(head, rows),
    ]


def _family(rep: Report) -> list[str]:
    """``## Family of comparisons (Holm)``: the plain and Holm-adjusted p-values and verdicts of
    each variant against the baseline; nothing for a single comparison."""
    comps = [c for c in rep.comparisons if c.get("holm")]
    if not comps:
        return []
    rows = [
        [
            f"`{c['label']}`",
            c["n"],
            fmt(c["holm"]["p_tost"], ".3g"),
            fmt(c["holm"]["p_tost_holm"], ".3g"),
            fmt(c["holm"]["p_diff"], ".3g"),
            fmt(c["holm"]["p_diff_holm"], ".3g"),
            c["verdict"],
            f"**{c['holm']['verdict']}**",
        ]
        for c in comps
    ]
    head = ["variant", "n", "p TOST", "Holm p TOST", "p difference", "Holm p difference"]
    head += ["verdict (one comparison alone)", "verdict (family, Holm)"]
    return [
        "",
        f"## Family of comparisons (Holm): {len(comps)} variants against `{rep.baseline}`",
        "",
        f"Read together, {len(comps)} comparisons with one baseline give {len(comps)} chances of "
        "a false claim; Holm's step-down adjustment (Holm 1979) keeps the chance of any false "
        f"claim in the family at alpha = {rep.alpha:g}. p TOST: the larger of the two one-sided "
        "p-values (equivalence iff it is below alpha); p difference: the two-sided paired t-test "
        "of a zero difference. Each is adjusted over the family; the family's verdict uses the "
        "adjusted values, the plain ones hold for one comparison read alone.",
        "",
        *table(head, rows),
        "",
        best_text(rep),
    ]


def best_text(rep: Report) -> str:
    """Whether the family shows a best design (:func:`~normlab.report.compare.best_design`), in
    one sentence: the leader named best only when its lead over the runner-up is tested, with
    the two's seeds that did not complete named in the same sentence; "no best design" with the
    reason that withholds it (a baseline with no completed run, a lead inside the margin); else
    "no variant is shown best". Empty for a single comparison."""
    b = best_design(rep)
    if b is None:
        return ""
    conf = f"{100 * (1 - rep.alpha):g}% CI"
    test = (
        f"`{b['runner_up']}` − `{b['leader']}` = {fmt(b['mean'], '+.4f')} nats/token over "
        f"n = {b['n']} paired seeds, {conf} {fmt_ci(b['ci'])}, two-sided paired t-test "
        f"p = {fmt(b['p'], '.3g')}, Holm-adjusted over the family's {b['family']} tests "
        f"p = {fmt(b['p_holm'], '.3g')}"
    )
    if b["withheld"]:
        return f"**No best design:** {b['withheld']} ({test})."
    over = (
        f", over the seeds that completed (left out: {'; '.join(b['exclusions'])})"
        if b["exclusions"]
        else ""
    )
    if b["shown"]:
        return (
            f"**Best design: `{b['leader']}`**, ahead of the runner-up ({test} < {rep.alpha:g})"
            f"{over}."
        )
    return (
        f"**No variant is shown best:** the lowest mean final loss, `{b['leader']}`, is not "
        f"shown ahead of the runner-up `{b['runner_up']}` ({test}; needs < {rep.alpha:g}){over}."
    )


def _comparable(ratio: dict[str, Any]) -> str:
    if not ratio["comparable"]:
        return "**no**"
    if ratio["unchecked"]:
        return f"not checked ({len(ratio['unchecked'])} runs under {MIN_STEPS} measured steps)"
    return "yes"


def _ratio(rep: Report) -> list[str]:
    if not rep.comparisons:
        return []
    conf = _conf(rep)
    rows = [
        [
            f"`{c['label']}`",
            c["ratio"]["n"],
            fmt(c["ratio"]["gmean"], ".3f"),
            fmt_ci(c["ratio"]["ci"], ".3f"),
            _comparable(c["ratio"]),
        ]
        for c in rep.comparisons
    ]
    out = [
        "",
        "## Step-time ratio (variant / baseline median step time, paired by seed)"
        + (": secondary, see the speed verdict" if rep.bench else ""),
        "",
        f"Geometric mean of the per-seed ratios; the {conf} (Student t) is computed on the "
        "log-ratios and exponentiated. Runs of a sweep run one after another, so their step times "
        "compare only if the machine stayed the same. They are flagged as not comparable when a "
        f"run's p90/median exceeds {SPREAD_LIMIT:g}, when its median moves by more than "
        f"{DRIFT_LIMIT:.0%} between its first and second half, or when the medians of one "
        f"variant's runs, or the per-seed ratios, span more than {BETWEEN_LIMIT:g}x (runs with "
        f"fewer than {MIN_STEPS} "
        "measured steps are not checked). For a speed verdict, time the variants interleaved in "
        "one process: `normlab-bench step`.",
        "",
        *table(["variant", "n", "geometric mean ratio", conf, "comparable"], rows),
    ]
    for c in rep.comparisons:
        if c["ratio"]["problems"]:
            out += ["", f"`{c['label']}` vs `{rep.baseline}` not comparable:"]
            out += [f"- {p}" for p in c["ratio"]["problems"]]
    return out + _backend_notes(rep)


def _backend_notes(rep: Report) -> list[str]:
    """One line per variant whose runs recorded other norm backends than the baseline's
    (``compare.backend_differences``): its speed ratio is no same-design ratio."""
    return [
        line
        for c in rep.comparisons
        if c["backends"]
        for line in (
            "",
            f"`{c['label']}` vs `{rep.baseline}`: not the same design: backends differ: "
            + "; ".join(c["backends"])
            + " (the ratio times different kernels, not the norms' design alone).",
        )
    ]


def _excluded(rep: Report) -> list[str]:
    exc = [r for r in rep.runs if r.excluded is not None]
    if not exc:
        return ["", "## Excluded runs", "", "None: every run completed with a finite final loss."]
    rows = [[f"`{r.name}`", f"`{r.label}`", r.seed, r.excluded] for r in exc]
    return ["", "## Excluded runs", "", *table(["run dir", "variant", "seed", "reason"], rows)]


# --- context, bits per byte, held-out corpora ----------------------------------------------------


def _joined(values: list[str], unset: str = "not recorded") -> str:
    """The distinct values as code, joined by `` / ``; ``unset`` when none is set (a null key,
    or a key that older runs did not record)."""
    shown = [v for v in values if v not in ("None", "")]
    return " / ".join(f"`{v}`" for v in shown) if shown else unset


def _schedule_text(st: dict[str, list[str]]) -> str:
    """The lr schedule after warm-up as the runs set it: ``cosine`` (runs before 2026-12-03
    recorded no ``optim.schedule``: theirs was cosine), or ``wsd`` with its decay's fraction and
    shape and the cool-down branches (``optim.anneal_at``); whether it decays at all."""
    kinds = [v for v in st["optim.schedule"] if v not in ("None", "")] or ["cosine"]
    text = f"schedule {' / '.join(f'`{k}`' for k in kinds)}"
    if "wsd" in kinds:
        text += (
            f" (decay over the last {_joined(st['optim.decay_fraction'])} of each budget, shape "
            f"{_joined(st['optim.decay_shape'])}; cool-down branches at "
            f"{_joined(st['optim.anneal_at'], 'none')} of the run)"
        )
    return f"{text}, decay {_joined(st['optim.decay'])}"


def _params(c: dict[str, Any]) -> str:
    """``N parameters`` when every variant has N; else each variant's count (no median of two
    counts that no run has)."""
    by = c.get("params_by") or {}
    if len({v for v in by.values() if math.isfinite(v)}) <= 1:
        return f"{fmt(c['params'], ',.0f')} parameters"
    return "parameters: " + ", ".join(f"{fmt(v, ',.0f')} (`{lab}`)" for lab, v in by.items())


def _worth(rep: Report) -> str:
    w = rep.context["worth"]
    m = rep.margin
    if not math.isfinite(w["final"]):
        return (
            f"- The margin ±{m:g} nats: no validation curve of `{rep.baseline}` to measure it on."
        )
    where = (
        f"the baseline's mean validation curve was {m:g} nats above its final value "
        f"({fmt(w['final'])}) last at about step {fmt(w['step'], ',.0f')}, so the margin is worth "
        f"about {fmt(w['steps'], ',.0f')} of its last training steps "
        f"({fmt(w['steps'] / w['last_step'], '.0%')} of the run)"
        if math.isfinite(w["step"])
        else f"the baseline's mean validation curve never was {m:g} nats above its final value "
        f"({fmt(w['final'])}) at an evaluation after its first, so the margin is worth more than "
        "the whole run: it is loose"
    )
    return f"- What ±{m:g} nats means in compute: {where} (linear between evaluations)."


def _budget_note(stopped_by: dict[str, list[str]]) -> str:
    every = {v for vals in stopped_by.values() for v in vals}
    if every == {"max_time_s"}:
        return " (every run: the final losses compare at equal training time, not equal steps)"
    return ""


def render_context(rep: Report) -> list[str]:
    """``## Context``: the setting the verdict holds in."""
    c = rep.context
    if not c:
        return []
    st = c["setting"]
    eval_data = ", ".join(f"`{n}`" for n in rep.heldout.get("heldout", {})) or "none"
    lines = [
        "",
        "## Context",
        "",
        f"- Model: {_joined(st['model.name'])} ({_joined(st['model.n_layer'])} layers, d_model "
        f"{_joined(st['model.d_model'])}, {_joined(st['model.n_head'])} heads, context "
        f"{_joined(st['model.context_length'])}); {_params(c)}",
        f"- Data: {_joined(st['data.name'])}, tokenizer {_joined(st['data.tokenizer'])}, batch "
        f"{_joined(st['data.batch_size'])}; tokens seen {fmt(c['tokens_seen'], ',.0f')} per run "
        f"(median), {fmt(c['epochs'], '.3g')} epochs of the training split",
        f"- Schedule: peak lr {_joined(st['optim.lr'])}, min lr {_joined(st['optim.min_lr'])}, "
        f"warm-up {_joined(st['optim.warmup_steps'])} steps, {_schedule_text(st)}, "
        f"weight decay {_joined(st['optim.weight_decay'])} "
        f"(norm gains: {_joined(st['optim.norm_weight_decay'], '`none`')}); "
        f"max_steps {_joined(st['max_steps'])}, "
        f"max_time_s {_joined(st['max_time_s'], 'none (no time budget)')}",
        "- Stopped by: "
        + "; ".join(f"`{lab}`: {_joined(v)}" for lab, v in c["stopped_by"].items())
        + _budget_note(c["stopped_by"]),
        f"- Precision {_joined(st['precision.dtype'])}, norm implementation "
        f"{_joined(st['norm.impl'])}, compile {_joined(st['compile'])}",
        f"- Device {_joined(st['device'])} ({_joined(st['device model'])}), torch "
        f"{_joined(st['torch'])}, threads {_joined(st['threads'])}",
        f"- Evaluation: {fmt(c['eval_tokens'], ',.0f')} validation tokens scored per evaluation "
        f"(eval_batches × batch_size × context_length); held-out corpora: {eval_data}",
        _worth(rep),
        "",
        f"Train/validation gap: final validation loss − mean of the last {GAP_ROWS} logged "
        "training losses (median over runs, nats/token); per-seed final validation losses:",
        "",
    ]
    labels = list(c["per_seed"])
    seeds = sorted({s for v in c["per_seed"].values() for s in v}, key=str)
    rows = [[s, *(fmt(c["per_seed"][lab].get(s)) for lab in labels)] for s in seeds]
    rows.append(["gap", *(fmt(c["gap"][lab], "+.4f") for lab in labels)])
    return lines + table(["seed", *(f"`{lab}`" for lab in labels)], rows)


def _comparison_rows(comp: dict[str, Any], spec: str = "+.4f") -> list[list[Any]]:
    return [
        [f"`{lab}`", c["n"], fmt(c["mean"], spec), fmt_ci(c["ci"], spec), c["verdict"]]
        for lab, c in comp["comparisons"].items()
    ]


def _variant_rows(comp: dict[str, Any]) -> list[list[Any]]:
    return [
        [f"`{lab}`", v["n"], fmt(v["mean"]), fmt(v["std"])] for lab, v in comp["variants"].items()
    ]


def render_bpb(rep: Report) -> list[str]:
    """``## Bits per byte``: final validation bpb per variant and the paired verdict in bpb;
    nothing when no run has ``val/bpb``."""
    h = rep.heldout
    b = h.get("bpb")
    if not b:
        return []
    conf = _conf(rep)
    lead = (
        "**The variants use different tokenizers: this is the verdict to read** (nats/token "
        "count different tokens). "
        if h["tokenizer_differs"]
        else ""
    )
    return [
        "",
        "## Bits per byte (validation split)",
        "",
        f"{lead}bpb = loss / ln 2 / (UTF-8 bytes per token of the split): independent of the "
        f"tokenizer. The margin ±{rep.margin:g} nats is ±{fmt(b['margin'], '.4g')} bits/byte on "
        f"the baseline's tokens. Paired by seed, variant − `{rep.baseline}`, TOST as above.",
        "",
        *table(["variant", "n", "mean bpb", "std"], _variant_rows(b)),
        "",
        *table(["variant", "n", "mean diff (bits/byte)", conf, "verdict"], _comparison_rows(b)),
    ]


def render_heldout(rep: Report) -> list[str]:
    """One ``## Held-out corpus`` section per ``val/<name>``: final loss and bpb per variant,
    the paired differences with their CI and verdicts."""
    out: list[str] = []
    conf = _conf(rep)
    for name, h in rep.heldout.get("heldout", {}).items():
        loss, bpb = h["loss"], h["bpb"]
        rows = [
            [*row, fmt(bpb["variants"][row[0].strip("`")]["mean"]) if bpb else "n/a"]
            for row in _variant_rows(loss)
        ]
        out += [
            "",
            f"## Held-out corpus `{name}` (`val/{name}/loss`, `val/{name}/bpb`)",
            "",
            "Evaluated on the same fixed batches at every evaluation, never trained on. Final "
            "values; paired by seed, variant − baseline, margin as for the validation split.",
            "",
            *table(["variant", "n", "mean loss", "std", "mean bpb"], rows),
            "",
            *table(["variant", "n", "loss diff", conf, "verdict"], _comparison_rows(loss)),
        ]
        if bpb:
            out += [
                "",
                *table(["variant", "n", "bpb diff", conf, "verdict"], _comparison_rows(bpb)),
            ]
        title = f"Held-out corpus {name}: validation loss vs step"
        out += ["", *figure_lines(rep.figures, {f"val_{name}": title})]
    return out


# --- speed, time to target, tuned comparison -----------------------------------------------------


def _speed_row(lab: str, r: dict[str, Any] | None) -> list[Any]:
    if r is None:
        return [f"`{lab}`", "-", "not in the benchmark", "-", "-", "-", "-", "-"]
    return [
        f"`{lab}`",
        r["pairs"],
        fmt(r["median"], ".3f"),
        f"{fmt(r['iqr'][0], '.3f')}–{fmt(r['iqr'][1], '.3f')}",
        f"{fmt(r['gmean'], '.3f')} {fmt_ci(r['ci'], '.3f')}",
        fmt(r["baseline_ms"], ".1f"),
        fmt(r["variant_ms"], ".1f"),
        f"**{r['verdict']}**" if r["call"] else r["verdict"],
    ]


def _load_note(load: dict[str, Any] | None) -> str:
    """One sentence on the machine's load at both ends of the bench."""
    if load is None:
        return "Load not recorded (a bench written before `loadavg_before` / `loadavg_after`)."
    ends = f"1-minute load average {load['before']:.2f} before, {load['after']:.2f} after"
    if load["quiet"]:
        return f"The machine was quiet: {ends} (at most {load['limit']:g})."
    return (
        f"**The machine was not quiet:** {ends}, above the bench's {load['threads']} thread(s) + "
        f"{LOAD_SLACK:g}; the pairs share any slowdown, but time it again on a quiet machine."
    )


def render_speed(rep: Report) -> list[str]:
    """``## Speed verdict``: the interleaved benchmark's ratio and verdict per variant, and the
    machine's load, or where to get one."""
    if not rep.comparisons:
        return []
    out = ["", "## Speed verdict (interleaved step benchmark)", ""]
    if rep.bench is None:
        return out + [
            f"No `{BENCH_FILE}` in the sweep dir: the sequential step-time ratio below is the only "
            "speed figure, and sequential jobs see whatever else the machine did. For a speed "
            "verdict time the variants interleaved in one process: `normlab-bench step <common "
            "overrides> --a <baseline overrides> --b <variant overrides> --json "
            f"<sweep>/{BENCH_FILE}` (scripts/loss_parity_cpu.sh does)."
        ]
    raw = rep.bench["raw"]
    rows = [_speed_row(lab, r) for lab, r in rep.bench["ratios"].items()]
    head = ["variant", "pairs", "median ratio", "IQR", f"geometric mean, {_conf(rep)}"]
    head += [f"`{rep.baseline}` ms/step", "variant ms/step", "verdict"]
    return out + [
        f"From `{rep.bench['path']}` (`normlab-bench step`, {raw.get('device')}, "
        f"{raw.get('threads')} thread(s), {raw.get('warmup')} warm-up step(s) each, common "
        f"overrides `{' '.join(raw.get('common', [])) or '-'}`): both setups in one process, "
        "optimizer steps timed in pairs A B, B A, ..., so a change of machine speed slows both "
        "alike. Ratio = "
        f"variant / `{rep.baseline}` step time per pair; the CI is Student t on the log-ratios "
        "of the pairs. A variant is called faster (slower) only when three figures agree: the "
        "median ratio is below (above) 1, the CI excludes 1 on that side, and the two-sided "
        f"exact sign test of the pairs gives p < {rep.alpha:g}, so that a few outlier pairs "
        "cannot make the call. **This is the speed verdict**; the sequential ratio of the "
        "sweep's own runs (next section) is secondary.",
        "",
        _load_note(rep.bench.get("load")),
        "",
        *table(head, rows),
        *_backend_notes(rep),
    ]


def render_target(rep: Report) -> list[str]:
    """``## Time to target loss``: reach per variant and the paired ratios."""
    t = rep.target
    if not t or not rep.variants or t["target"] != t["target"]:
        return []
    how = (
        "the highest final validation loss of any included run (the worst variant's worst seed), "
        "so every run reaches it"
        if t["default"]
        else "set by --target"
    )
    rows = [
        [
            f"`{lab}`",
            f"{v['reached']}/{v['runs']}",
            fmt(v["seconds"]["mean"], ".1f"),
            fmt(v["step"]["mean"], ".0f"),
            fmt(v["tokens"]["mean"], ",.0f"),
        ]
        for lab, v in t["variants"].items()
    ]
    conf = _conf(rep)

    def cell(r: dict) -> str:
        return f"{fmt(r['gmean'], '.3f')} {fmt_ci(r['ci'], '.3f')} (n = {r['n']})"

    paired = [
        [f"`{lab}`", cell(c["seconds"]), cell(c["step"]), cell(c["tokens"])]
        for lab, c in t["comparisons"].items()
    ]
    out = [
        "",
        f"## Time to target loss ({fmt(t['target'])} nats/token)",
        "",
        f"Target: {how}. Time to target = the first evaluation at or below it, in training "
        "seconds (`perf/train_time_s`: training wall time without evaluations and checkpoints; "
        "n/a for runs that do not record it), optimizer steps and tokens. Ratios are variant / "
        f"baseline per seed (geometric mean, {conf} on logs), over the seeds where both reached "
        "it; below 1: the variant gets there sooner. Seconds come from sequential jobs: read them "
        "with the step-time checks above.",
        "",
        *table(["variant", "reached", "mean seconds", "mean steps", "mean tokens"], rows),
    ]
    if t.get("only_last"):
        return out + [
            "",
            "Every run reaches the target only at its last evaluation: the times above are the "
            "runs' lengths, and a paired ratio would say nothing about which variant learns "
            "faster. Set a higher `--target`, or evaluate more often (`eval_interval`).",
        ]
    if paired:
        head = ["variant", "seconds ratio", "steps ratio", "tokens ratio"]
        out += ["", *table(head, paired)]
    return out


def render_tuned(rep: Report) -> list[str]:
    """``## Tuned comparison``: final loss per learning rate and variant, the best of each, and
    the paired difference at each common learning rate."""
    t = rep.tuned
    if not t:
        return []
    labels = list(t["points"])
    conf = _conf(rep)

    def cell(lab: str, lr: float) -> str:
        p = t["points"][lab].get(lr)
        if p is None:
            return "-"
        text = f"{fmt(p['mean'])} {fmt_ci(p['ci'], '.4f')} (n = {p['n']})"
        return f"**{text}**" if t["best"].get(lab) == lr else text

    others = [lab for lab in labels if lab != rep.baseline]
    rows = []
    for lr in t["lrs"]:
        diffs = [t["at_lr"].get(lab, {}).get(lr) for lab in others]
        rows.append(
            [f"{lr:g}", *(cell(lab, lr) for lab in labels)]
            + [f"{fmt(d['mean'], '+.4f')} {fmt_ci(d['ci'])}" if d else "-" for d in diffs]
        )
    head = ["`optim.lr`", *(f"`{lab}`" for lab in labels)]
    head += [f"`{lab}` − `{rep.baseline}`" for lab in others]
    best = ", ".join(f"`{lab}` at {lr:g}" for lab, lr in t["best"].items())
    out = [
        "",
        "## Tuned comparison (each variant at its own best `optim.lr`)",
        "",
        f"Mean final validation loss (nats/token) with its {conf} over every seed, per learning "
        "rate; bold: the variant's best (lowest mean over the choosing seeds). The verdict, the "
        "paired table and every section above compare each variant at its own best learning "
        f"rate: {best}. {_selection(t)} The last columns: the paired difference at each common "
        "learning rate, over every seed, for reference.",
        "",
        *table(head, rows),
    ]
    if t["edge"]:
        edge = ", ".join(f"`{lab}`" for lab in t["edge"])
        out += [
            "",
            f"> **Warning:** the best learning rate of {edge} is at the edge of the grid: a better "
            "one may lie outside it; widen the grid before trusting the tuned verdict.",
        ]
    return out


def _selection(t: dict[str, Any]) -> str:
    """How the tuned study chose its learning rates: on held-out seeds, or on the tested ones."""
    seeds = ", ".join(map(str, t["choose_seeds"])) or "none"
    if t["selection"] == "split":
        tested = ", ".join(map(str, t["test_seeds"]))
        return (
            f"Without selection bias: the learning rates were chosen on seeds {seeds} and the "
            f"verdict tests the other seeds only ({tested})."
        )
    return (
        f"**Selection-biased:** the learning rates were chosen on the same seeds the verdict "
        f"tests ({seeds}; a split needs >= {SPLIT_SEEDS} seeds), so its interval is that of a "
        "winner picked on the same noise (winner's curse)."
    )


# --- outcome per variant, diagnostics, swept value -----------------------------------------------


def _what_happened(run: Run) -> str:
    s = run.summary or {}
    if run.excluded is None:
        return "completed"
    if s.get("status") != "diverged":
        return run.excluded
    last = s.get("last_finite_loss")
    parts = [
        s.get("diverged_reason"),
        f"last finite train loss {fmt(last, '.3f')}" if last is not None else None,
    ]
    extra = "; ".join(p for p in parts if p)
    return f"diverged at step {s.get('diverged_at_step', '?')}" + (f" ({extra})" if extra else "")


def outcome_rows(rep: Report) -> list[list[Any]]:
    """One row per variant (baseline first): runs, completed, what happened to the others (per
    seed), mean final validation loss, and the paired mean difference to the baseline with its n."""
    comp = {c["label"]: c for c in rep.comparisons}
    rows = []
    for v in rep.variants:
        runs = [r for r in rep.runs if r.label == v["label"]]
        others = [f"seed {r.seed}: {_what_happened(r)}" for r in runs if r.excluded is not None]
        c = comp.get(v["label"])
        if v["label"] == rep.baseline:
            vs = "baseline"
        elif c and c["n"]:
            vs = f"{fmt(c['mean'], '+.4f')} (n = {c['n']})"
        else:
            vs = "n/a (no seed completed in both)"
        rows.append(
            [f"`{v['label']}`", len(runs), v["n"], "; ".join(others) or "-", fmt(v["mean"]), vs]
        )
    return rows


def render_outcome(rep: Report) -> list[str]:
    """``## Outcome per variant``, shown when there are more than two variants or excluded runs."""
    if len(rep.variants) <= 2 and all(r.excluded is None for r in rep.runs):
        return []
    head = ["variant", "runs", "completed", "not completed", "final val loss", "vs baseline"]
    return [
        "",
        "## Outcome per variant",
        "",
        "What happened to every run, by variant. Final validation loss (nats/token) is the mean "
        f"over completed runs; the difference to `{rep.baseline}` is the mean of the per-seed "
        "differences (variant − baseline).",
        "",
        *table(head, outcome_rows(rep)),
    ]


DIAG_HEADER = [
    "variant",
    "runs",
    "diag steps",
    "RMS into final norm (first step)",
    "RMS into block 0 (last)",
    "RMS into final norm (last)",
    "growth (last)",
    "gain min–max (last)",
    "max abs logit (last)",
]


def render_diagnostics(rep: Report) -> list[str]:
    """``## Diagnostics`` with the figures and :func:`diag_summary`; nothing without ``diag/``."""
    summary = diag_summary(diag_entries(rep.labels, rep.runs))
    if not summary:
        return []
    rows = [
        [
            f"`{s['label']}`",
            s["runs"],
            f"{s['first_step']}–{s['last_step']}",
            fmt(s["final_first"], ".3g"),
            fmt(s["block0_last"], ".3g"),
            fmt(s["final_last"], ".3g"),
            fmt(s["growth_last"], ".2f"),
            f"{fmt(s['gain_min'], '.3f')}–{fmt(s['gain_max'], '.3f')}",
            fmt(s["max_logit"], ".3g"),
        ]
        for s in summary
    ]
    titles = {
        "resid_depth": "Residual-stream RMS vs depth (first, middle, last diagnosed step)",
        "gains": "Norm gains over training (mean per norm, band min–max)",
    }
    return [
        "",
        "## Diagnostics (per-block statistics, `diag/` keys)",
        "",
        "Every `diag_interval` steps the trainer records the RMS of the residual stream entering "
        "each block and the final norm, and each norm's gain (see `normlab.training.diagnostics`). "
        "Excluded runs are shown apart, as `(excluded)`: for a diverged run these are the last "
        "statistics before it stopped. Values below are means over runs; growth = RMS entering the "
        "final norm / RMS entering block 0.",
        "",
        *table(DIAG_HEADER, rows),
        "",
        *figure_lines(rep.figures, titles),
    ]


def _cell(v: list[float] | None) -> str:
    if v is None:
        return "-"
    return f"{np.mean(v):.4f} (n = {len(v)})" if v else "no completed run"


def render_swept(rep: Report) -> list[str]:
    """``## Final validation loss vs <key>``: a value x group table and the figure, or nothing."""
    found = swept_points(rep)
    if found is None:
        return []
    key, points = found
    lines = list(points)
    values = sorted({x for pts in points.values() for x, _ in pts})
    cell = {(line, x): v for line, pts in points.items() for x, v in pts}
    fig = rep.figures.get("swept")
    return [
        "",
        f"## Final validation loss vs `{key}`",
        "",
        f"Mean final validation loss (nats/token) of the completed runs, by `{key}` (rows) and the "
        "other overrides (columns).",
        "",
        *table(
            [f"`{key}`", *(f"`{ln}`" for ln in lines)],
            [[f"{x:g}", *(_cell(cell.get((ln, x))) for ln in lines)] for x in values],
        ),
        "",
        f"![Final validation loss vs {key}]({fig.name})"
        if fig
        else f"- Final validation loss vs {key}: no data",
    ]


# --- the whole report ----------------------------------------------------------------------------

FIGURES = {
    "val_loss": "Validation loss vs step",
    "val_diff": "Paired validation-loss difference vs step",
    "val_time": "Validation loss vs training seconds",
    "val_tokens": "Validation loss vs tokens seen",
    "train_loss": "Training loss (EMA) vs step",
    "step_time": "Step-time distribution",
    "lr_curve": "Final validation loss vs learning rate (tuned comparison)",
}
FIGURE_TEXT = (
    "val_loss: mean over seeds per variant with a min–max band; val_diff: variant − baseline per "
    "seed, mean with its {conf} band, 0 and the ±{margin:g} nats margin (tokens on the top axis "
    "when every run has one tokens-per-step); val_time: each run's validation loss against its "
    "cumulative training seconds (`perf/train_time_s`; thin lines per run, one colour per "
    "variant), the target loss dotted; val_tokens: mean over seeds against tokens seen, min–max "
    "band; train_loss: smoothed training loss; step_time: box plot of post-warm-up step times; "
    "lr_curve (tuned sweeps): mean final loss per learning rate with its {conf}, log-scale lr, "
    "each variant's best circled."
)


def _figures(rep: Report) -> list[str]:
    """The figure links of :data:`FIGURES`; when sequential step times do not compare
    (:func:`~normlab.report.compare.not_comparable`), a note under each figure of sequential
    times, which carries the same mark."""
    titles = {k: t for k, t in FIGURES.items() if k != "lr_curve" or rep.tuned}
    bad = not_comparable(rep)
    note = (
        "> **Not comparable:** the sequential step times of "
        + ", ".join(f"`{lab}` vs `{rep.baseline}`" for lab in bad)
        + " fail the step-time checks (see the step-time ratio section); this figure carries "
        f'the mark "{NOT_COMPARABLE_MARK}" and its times are no speed verdict.\n'
    )
    out = []
    for key, title in titles.items():
        out += figure_lines(rep.figures, {key: title})
        out += [note] if bad and key in ("val_time", "step_time") and rep.figures.get(key) else []
    return out


def render_markdown(rep: Report) -> str:
    """The report as Markdown (losses in nats/token, times in ms)."""
    lines = [*_header(rep), *render_unfinished(rep), *render_compute(rep), *render_context(rep)]
    lines += _variants(rep)
    lines += render_outcome(rep)
    lines += [*_verdict(rep), *_paired_table(rep), *_family(rep), *render_tuned(rep)]
    lines += render_bpb(rep)
    lines += [*render_heldout(rep), *render_downstream(rep)]
    lines += [*render_speed(rep), *_ratio(rep), *render_target(rep)]
    lines += _excluded(rep)
    lines += [
        "",
        "## Figures",
        "",
        "Curves and step times use included runs only. Training loss is smoothed per run by a "
        f"bias-corrected EMA (beta = {EMA_BETA:g}, per logged step), then averaged over seeds. "
        f"The paired difference is variant − baseline per seed, with its {_conf(rep)} over "
        f"seeds at each step and the ±{rep.margin:g} nats margin. "
        + FIGURE_TEXT.format(conf=_conf(rep), margin=rep.margin),
        "",
        *_figures(rep),
    ]
    lines += render_swept(rep) + render_stability(rep) + render_diagnostics(rep)
    return "\n".join(lines).rstrip("\n") + "\n"


# --- stability and downstream tasks --------------------------------------------------------------


def _spike_rule(rules: list[dict[str, Any]]) -> str:
    """The spike rule in words, with the parameters the runs recorded."""
    if not rules:
        return "the runs recorded no spike rule"
    each = "; ".join(f"window {r.get('window')} steps, k = {r.get('k')}" for r in rules)
    return (
        "a training loss above the median of the window of losses before it plus k × 1.4826 × "
        f"their median absolute deviation, counted once per excursion, the first window not "
        f"judged ({each}{': the runs differ in rule' if len(rules) > 1 else ''})"
    )


def _stability_rows(st: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for lab, v in st["variants"].items():
        sp, am, ku = v["spikes"], v["absmax"], v["kurtosis"]
        rows.append(
            [
                f"`{lab}`",
                sp["n"],
                fmt(sp["mean"], ".2f") if sp["n"] else "n/a",
                f"{sp['spiky']} of {sp['n']}",
                fmt(am["value"], ".4g") + (f" (`{am['where']}`)" if am["where"] else ""),
                fmt(ku["value"], ".4g") + (f" (`{ku['where']}`)" if ku["where"] else ""),
                fmt(v["grad_norm"], ".4g"),
            ]
        )
    return rows


def render_stability(rep: Report) -> list[str]:
    """``## Stability``: loss spikes per variant (and the paired difference of the counts), the
    largest activation and kurtosis, the largest pre-clip gradient norm; nothing without data."""
    st = rep.stability
    if not st:
        return []
    header = [
        "variant",
        "runs",
        "spikes per run",
        "runs with a spike",
        "largest abs-max (where)",
        "largest kurtosis (where)",
        "largest grad norm",
    ]
    out = [
        "",
        "## Stability (loss spikes, largest activations, gradient norms)",
        "",
        f"Loss spike: {_spike_rule(st['rules'])}. Largest abs-max and kurtosis: over every "
        "diagnosed step (`diag_interval`) and sublayer (attention and MLP outputs, the residual "
        "stream entering each block and the final norm) of the variant's included runs; n/a "
        "without diagnostics. Gradient norm: the largest global norm before clipping.",
        "",
        *table(header, _stability_rows(st)),
    ]
    if st["all_zero"]:
        return out + ["", "No run counted a spike: there is no difference to estimate."]
    rows = [
        [f"`{lab}`", d["n"], fmt(d["mean"], "+.2f"), fmt_ci(d["ci"], "+.2f")]
        for lab, d in st["diff"].items()
        if d["n"]
    ]
    if rows:
        head = ["variant", "n", f"spikes − `{rep.baseline}` (per run)", _conf(rep)]
        out += ["", "Paired by seed:", "", *table(head, rows)]
    return out


def render_downstream(rep: Report) -> list[str]:
    """``## Downstream tasks``: per ``downstream/<task>/<metric>`` the final value per variant and
    the paired difference with its CI and TOST verdict; nothing without ``eval_tasks`` runs."""
    if not rep.downstream:
        return []
    conf = _conf(rep)
    out = [
        "",
        "## Downstream tasks (`eval_tasks`)",
        "",
        "Scored at every evaluation on the first `eval_task_items` items of each task (the same "
        "items for every run; `normlab.evals`); final values. Accuracy is a fraction (higher "
        "is better: a positive difference is the variant right more often); bpb in bits per byte "
        f"(lower is better). Paired by seed, variant − `{rep.baseline}`, TOST at "
        f"±{next(iter(rep.downstream.values()))['margin']:g}.",
    ]
    for key, comp in rep.downstream.items():
        out += [
            "",
            f"### `{key}`",
            "",
            *table(["variant", "n", "mean", "std"], _variant_rows(comp)),
            "",
            *table(["variant", "n", "mean diff", conf, "verdict"], _comparison_rows(comp)),
        ]
    return out
