"""``report.md``: the tables, the verdict with its warnings, the step-time ratio with its checks,
the excluded runs and the figures. Losses in nats/token, times in ms."""

from __future__ import annotations

from typing import Any

from normlab.report.compare import Report
from normlab.report.sections import render_diagnostics, render_outcome, render_swept
from normlab.report.sections_context import render_bpb, render_context, render_heldout
from normlab.report.sections_fair import render_speed, render_target, render_tuned
from normlab.report.series import BETWEEN_LIMIT, DRIFT_LIMIT, MIN_STEPS, SPREAD_LIMIT
from normlab.report.stats import POWER
from normlab.report.text import figure_lines, fmt, fmt_ci, fmt_power, table
from normlab.report.variants import INERT_KEYS

EMA_BETA = 0.95  # training-loss smoothing in the figure, per logged step


def _confs(rep: Report) -> tuple[str, str]:
    return f"{100 * (1 - rep.alpha):g}% CI", f"{100 * (1 - 2 * rep.alpha):g}% CI"


def _header(rep: Report) -> list[str]:
    n_exc = sum(r.excluded is not None for r in rep.runs)
    shared = ", ".join(f"`{o}`" for o in rep.common_overrides) or "none"
    sources = ", ".join(f"`{p}`" for p in rep.sources)
    return [
        "# normlab sweep report",
        "",
        f"- Runs from: {sources}",
        f"- Equivalence margin: ±{rep.margin:g} nats/token; alpha = {rep.alpha:g}",
        f"- Baseline: `{rep.baseline}`",
        f"- Runs: {len(rep.runs)} found, {len(rep.runs) - n_exc} included, {n_exc} excluded",
        f"- Overrides that do not tell the variants apart (left out of the labels): {shared}",
        "- Keys that change no compared number, never in a label nor a refusal: "
        + ", ".join(f"`{k}`" for k in INERT_KEYS),
    ]


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
    return (
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
        "true difference is at or beyond the margin).",
        "",
        *table(head, rows),
    ]


def _comparable(ratio: dict[str, Any]) -> str:
    if not ratio["comparable"]:
        return "**no**"
    if ratio["unchecked"]:
        return f"not checked ({len(ratio['unchecked'])} runs under {MIN_STEPS} measured steps)"
    return "yes"


def _ratio(rep: Report) -> list[str]:
    if not rep.comparisons:
        return []
    conf, _ = _confs(rep)
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
    return out


def _excluded(rep: Report) -> list[str]:
    exc = [r for r in rep.runs if r.excluded is not None]
    if not exc:
        return ["", "## Excluded runs", "", "None: every run completed with a finite final loss."]
    rows = [[f"`{r.name}`", f"`{r.label}`", r.seed, r.excluded] for r in exc]
    return ["", "## Excluded runs", "", *table(["run dir", "variant", "seed", "reason"], rows)]


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


def render_markdown(rep: Report) -> str:
    """The report as Markdown (losses in nats/token, times in ms)."""
    lines = [*_header(rep), *render_context(rep), *_variants(rep), *render_outcome(rep)]
    lines += [*_verdict(rep), *_paired_table(rep), *render_tuned(rep), *render_bpb(rep)]
    lines += [*render_heldout(rep), *render_speed(rep), *_ratio(rep), *render_target(rep)]
    lines += _excluded(rep)
    lines += [
        "",
        "## Figures",
        "",
        "Curves and step times use included runs only. Training loss is smoothed per run by a "
        f"bias-corrected EMA (beta = {EMA_BETA:g}, per logged step), then averaged over seeds. "
        f"The paired difference is variant − baseline per seed, with its {_confs(rep)[0]} over "
        f"seeds at each step and the ±{rep.margin:g} nats margin. "
        + FIGURE_TEXT.format(conf=_confs(rep)[0], margin=rep.margin),
        "",
        *figure_lines(
            rep.figures, {k: t for k, t in FIGURES.items() if k != "lr_curve" or rep.tuned}
        ),
    ]
    lines += render_swept(rep) + render_diagnostics(rep)
    return "\n".join(lines).rstrip("\n") + "\n"
