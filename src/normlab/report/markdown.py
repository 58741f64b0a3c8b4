"""``report.md``: header, compute-equivalent verdict, final loss, verdict and paired table, excluded
runs, figures, and each qualifier's section in its place, each naming its method (``text.method``).

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

from normlab.report import (
    context,
    diagnostics,
    downstream,
    family,
    heldout,
    sequential,
    speed,
    stability,
    swept,
    target,
    tuned,
    unfinished,
)
from normlab.report.compare import DEFAULT_MARGIN, margin_in_compute
from normlab.report.paired import Report
from normlab.report.plots import EMA_BETA
from normlab.report.runs import Run
from normlab.report.stats import POWER, compute_for_nats
from normlab.report.text import ci_name, figure_lines, fmt, fmt_ci, fmt_power, method, table

#: What the header says of the default margin.
SCREEN = (
    " (the default margin: a gross-difference screen, which catches a broken norm; it is no "
    "parity claim: set `--margin` to the effect that matters)"
)


def _header(rep: Report) -> list[str]:
    """The report's title and what it compares: sources, margin, baseline, runs, labels."""
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
        f"- Overrides that do not tell the variants apart (left out of the labels): {shared}. "
        + method("variants-and-the-baseline"),
    ]


def _skipped(rep: Report) -> str:
    """The run dirs that never trained, each with its reason, on one line."""
    return "; ".join(f"`{run.name}` ({why})" for run, why in rep.skipped)


def _slope_text(rep: Report) -> str:
    """The slope a margin is converted at: annealed (within-run beside), or the end slope."""
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
        "within-run reading of one decaying curve, not of annealed budgets)"
    )


def margin_text(rep: Report) -> str:
    """The margin in effective compute and in nats, converted at the baseline's slope."""
    slope = _slope_text(rep)
    if rep.margin_compute is not None:
        text = (
            f"±{rep.margin_compute:.3g} of effective compute (`--margin-compute`), converted to "
            f"±{rep.margin:.4g} nats/token at {slope}; the TOST runs at that nats margin"
        )
    elif not math.isfinite(worth := margin_in_compute(rep)):
        text = "not converted (the baseline's curve has no end slope: < 2 evaluations after step 0)"
    else:
        text = f"±{rep.margin:g} nats/token is worth {worth_text(worth)} at {slope}"
    return f"{text}. " + method("the-margin-in-compute")


#: Above this fraction a margin's worth in compute says only that the baseline's curve is flat.
MAX_WORTH = 10.0


def worth_text(worth: float) -> str:
    """A margin's worth in compute as text; beyond ``MAX_WORTH``, that the curve is nearly flat."""
    if worth > MAX_WORTH:
        return (
            f"more than {MAX_WORTH:.0%} of effective compute (the baseline's curve is nearly "
            "flat: the margin is no question of compute)"
        )
    return f"{worth:.2%} of effective compute"


# --- the compute-equivalent verdict --------------------------------------------------------------


def _k_text(k: dict[str, Any]) -> str:
    """``k`` with its interval, n and parts; ``{base}`` left to fill with what it is of."""
    ci = fmt_ci(k["ci"], ".3f") if k["n"] >= 2 else "(n < 2)"
    parts = f"steps x speed: {k['step_mult']:.3f} x {k['speed']:.3f}"
    return f"{k['k']:.3f}x{{base}} {ci} (n = {k['n']}; {parts})"


def compute_headline(rep: Report, c: dict[str, Any]) -> str:
    """A comparison's compute-equivalent verdict in one sentence: k, its interval, n, its parts."""
    k = c["compute"]
    if k["n"] == 0:
        return (
            f"{c['label']}: no seed with both validation curves (>= 2 evaluations each) and "
            f"step times: no compute-equivalent verdict against {rep.baseline}"
        )
    base = f" the effective compute of {rep.baseline}"
    text = f"{c['label']}: " + _k_text(k).format(base=base)
    if (m := k.get("steps_only")) and m["n"]:  # its speed part fails the step-time checks
        ci = fmt_ci(m["ci"], ".3f") if m["n"] >= 2 else "(n < 2)"
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
        "reading, which overstates how far the steps part is from 1"
    )


def _compute_note(rep: Report, c: dict[str, Any]) -> str:
    """Where the speed part of a compute-equivalent verdict comes from, with its flag."""
    k = c["compute"]
    if k["source"] == "interleaved":
        return "speed from the interleaved step benchmark"
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
        f"k = steps x speed; above 1 favours the variant; geometric mean over seeds with its "
        f"{ci_name(rep.alpha)}. " + method("the-headline-effective-compute"),
    ]


# --- the final loss, the verdict and its table ---------------------------------------------------


def _variants(rep: Report) -> list[str]:
    """``## Final validation loss per variant``, sequential times flagged (``speed.flag``)."""
    head = ["variant", "n", "excluded", "mean", "std", "min", "max", "step time (ms)", "tokens/s"]
    bpb = any(v["bpb"]["n"] for v in rep.variants)
    head += ["mean bpb"] if bpb else []
    rows = [
        [
            f"`{v['label']}`",
            v["n"],
            v["excluded"],
            *(fmt(v[k]) for k in ("mean", "std", "min", "max")),
            fmt(v["step_time_ms"], ".1f") + speed.flag(rep, v["label"]),
            fmt(v["tokens_per_s"], ",.0f") + speed.flag(rep, v["label"]),
            *([fmt(v["bpb"]["mean"])] if bpb else []),
        ]
        for v in rep.variants
    ]
    return [
        "",
        "## Final validation loss per variant",
        "",
        "Loss in nats/token (std: sample std); step time and tokens/s: medians over runs of each "
        "run's median" + ("; bpb: the final validation bpb." if bpb else "."),
        "",
        *table(head, rows),
    ]


def _sentence(rep: Report, c: dict[str, Any]) -> str:
    """One comparison's verdict in words: numbers, verdict, power, Holm verdict in a family."""
    conf, tconf = ci_name(rep.alpha), ci_name(2 * rep.alpha)
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
    rough = f", {c['n'] - 1} degree(s) of freedom: a rough figure" if c["n"] <= 3 else ""
    return family.family_clause(
        rep,
        c,
        f"{who}: over n = {c['n']} seeds paired with the baseline ({seeds}), the final validation "
        f"loss differs by {fmt(c['mean'], '+.4f')} nats/token on average (std {fmt(c['std'])}); "
        f"{conf} {fmt_ci(c['ci'])}, {tconf} {fmt_ci(c['ci_tost'])}. Verdict: **{c['verdict']}** "
        "(a fixed-n TOST: valid for a seed count fixed in advance; `--sequential` for one read "
        "while seeds were added). "
        f"Power: ±{m:g} nats needs {need if need else 'more than 100000'} seeds for "
        f"{POWER:.0%} TOST power at the observed std if the true difference is 0 (n = {c['n']} "
        f"gives {fmt_power(p['at_n'])}; the std is estimated from {c['n']} pairs{rough})."
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


def _verdict(rep: Report) -> list[str]:
    """``## Verdict``: the warnings, then one sentence per comparison."""
    out = ["", "## Verdict", ""]
    out += [f"> **Warning:** {w}.\n" for w in rep.confounds]
    if not rep.comparisons:
        return [*out, "Only one variant: nothing to compare."]
    if note := tuned.untuned_note(rep):
        out += [f"> **Learning rate:** {note}.\n"]
    sentences = [line for c in rep.comparisons for line in (_sentence(rep, c), "")]
    return out + sentences + [method("the-verdict")]


def _paired_table(rep: Report) -> list[str]:
    """``## Paired difference``: each comparison's numbers, TOST, power and seeds needed."""
    if not rep.comparisons:
        return []
    conf, tconf = ci_name(rep.alpha), ci_name(2 * rep.alpha)
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
        f"Equivalent when the {tconf} lies within ±{m:g} nats (TOST); detectable when the "
        f"{conf} excludes 0; seeds: the fewest for {POWER:.0%} TOST power (n/a: none suffices). "
        + method("equivalence-tost"),
        "",
        *table(head, rows),
    ]


# --- outcome, excluded runs, figures -------------------------------------------------------------


def _what_happened(run: Run) -> str:
    """What happened to ``run``: completed, its exclusion, or where and how it diverged."""
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
    """Per variant, baseline first: runs, completed, the others' fates, mean loss, paired diff."""
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
        "What happened to every run, by variant; final validation loss (nats/token): the mean "
        f"over completed runs; vs baseline: the mean per-seed difference to `{rep.baseline}`.",
        "",
        *table(head, outcome_rows(rep)),
    ]


def _excluded(rep: Report) -> list[str]:
    """``## Excluded runs``: each run left out of the statistics, with why."""
    exc = [r for r in rep.runs if r.excluded is not None]
    if not exc:
        return ["", "## Excluded runs", "", "None: every run completed with a finite final loss."]
    rows = [[f"`{r.name}`", f"`{r.label}`", r.seed, r.excluded] for r in exc]
    return ["", "## Excluded runs", "", *table(["run dir", "variant", "seed", "reason"], rows)]


#: The figures every report has, in order: key -> (title, one-line caption).
FIGURES = {
    "val_loss": (
        "Validation loss vs step",
        "Validation loss vs step: mean over seeds, band min–max.",
    ),
    "val_diff": (
        "Paired validation-loss difference vs step",
        "Validation loss, variant − baseline per seed vs step: the mean with its {conf} band "
        "(inner: the TOST's {tconf}), 0 and the ±{margin:g} nats margin.",
    ),
    **target.FIGURE,
    "val_tokens": (
        "Validation loss vs tokens seen",
        "Validation loss vs tokens seen: mean over seeds, band min–max.",
    ),
    "train_loss": (
        "Training loss (EMA) vs step",
        f"Training loss vs step, each run smoothed by an EMA (beta = {EMA_BETA:g}): mean over "
        "seeds, band min–max.",
    ),
    "step_time": (
        "Step-time distribution",
        "Post-warm-up step times per variant, seeds pooled (triangles: steps beyond the y range).",
    ),
    **tuned.FIGURE,
}


def _figures(rep: Report) -> list[str]:
    """The ``FIGURES`` with captions, and a note under each of sequential times not comparable."""
    conf, tconf = ci_name(rep.alpha), ci_name(2 * rep.alpha)
    shown = {k: f for k, f in FIGURES.items() if k != "lr_curve" or rep.tuned}
    bad = speed.not_comparable(rep)
    note = (
        "> **Not comparable:** the sequential step times of "
        + ", ".join(f"`{lab}` vs `{rep.baseline}`" for lab in bad)
        + " fail the step-time checks (see the step-time ratio section); this figure carries "
        f'the mark "{speed.NOT_COMPARABLE_MARK}" and its times are no speed verdict.\n'
    )
    out = ["", "## Figures", "", "Included runs only. " + method("figures"), ""]
    for key, (title, caption) in shown.items():
        caption = caption.format(conf=conf, tconf=tconf, margin=rep.margin)
        out += figure_lines(rep.figures, {key: (title, caption)})
        out += [note] if bad and key in ("val_time", "step_time") and rep.figures.get(key) else []
    return out


def render_markdown(rep: Report) -> str:
    """The report as Markdown (losses in nats/token, times in ms)."""
    lines = [*_header(rep), *unfinished.render_unfinished(rep), *render_compute(rep)]
    lines += [*context.render_context(rep), *_variants(rep), *render_outcome(rep)]
    lines += [*_verdict(rep), *_paired_table(rep), *family.render_family(rep)]
    lines += sequential.render_sequential(rep.comparisons, rep.baseline, rep.margin)
    lines += [*tuned.render_tuned(rep), *heldout.render_bpb(rep), *heldout.render_heldout(rep)]
    lines += [*downstream.render_downstream(rep), *speed.render_speed(rep)]
    lines += [*speed.render_ratio(rep), *target.render_target(rep), *_excluded(rep)]
    lines += [*_figures(rep), *swept.render_swept(rep), *stability.render_stability(rep)]
    lines += diagnostics.render_diagnostics(rep)
    return "\n".join(lines).rstrip("\n") + "\n"
