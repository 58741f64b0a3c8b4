"""The model-size ladder: one comparison at several sizes, each with its full report, read across
sizes as each variant's loss-compute law and step-multiplier trend (``laws``); its ``report.md`` and
two figures.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter

from normlab.report import tuned
from normlab.report.compare import DEFAULT_MARGIN, build_report
from normlab.report.context import tokens_seen
from normlab.report.laws import ladder_law, law_sizes, law_value, multiplier_trend, trend_value
from normlab.report.paired import Report
from normlab.report.plots import axes, finish
from normlab.report.runs import ReportError, Run, load_runs, never_trained, override_key
from normlab.report.speed import NOT_COMPARABLE_FLAG
from normlab.report.stats import NAN, finite_median, ratio_interval
from normlab.report.text import ci_name, figure_lines, fmt, fmt_ci, method, missing, table
from normlab.report.variants import design_tag

#: The config keys whose values make a model size.
SIZE_KEYS = ("model.n_layer", "model.d_model", "model.n_head")
#: Runs of one size sharing every override but these are one variant's seeds (or one rung's).
NOT_A_VARIANT = ("seed",)


@dataclass
class Ladder:
    """What the ladder report says: ``sizes`` smallest first (``shape``, ``params``, ``tokens``,
    ``compute``, ``report``, ``names``); per label ``points``, ``laws``, ``trends``."""

    sources: list[Path]
    alpha: float
    baseline: str
    labels: list[str]
    sizes: list[dict[str, Any]]
    law_sizes: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    points: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    laws: dict[str, dict[str, Any]] = field(default_factory=dict)
    trends: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: dict[str, Path | None] = field(default_factory=dict)


def size_of(run: Run) -> tuple[int, ...] | None:
    """``(n_layer, d_model, n_head)`` of the run's resolved model; None when a key is missing."""
    vals = [run.resolved(k) for k in SIZE_KEYS]
    return tuple(int(v) for v in vals) if all(isinstance(v, int) for v in vals) else None


def shape_name(size: tuple[int, ...]) -> str:
    """``(4, 128, 4)`` -> ``"4x128"`` (layers x width)."""
    return f"{size[0]}x{size[1]}"


def _variant_key(run: Run) -> frozenset[str]:
    return frozenset(o for o in run.overrides if override_key(o) not in NOT_A_VARIANT)


def group_by_size(runs: list[Run]) -> dict[tuple[int, ...], list[Run]]:
    """Trained runs by ``size_of``, smallest (params, then shape) first; unsized runs left out."""
    groups: dict[tuple[int, ...], list[Run]] = {}
    for r in runs:
        size = size_of(r)
        if size is not None and never_trained(r) is None:
            groups.setdefault(size, []).append(r)

    def order(item: tuple[tuple[int, ...], list[Run]]) -> tuple[float, tuple[int, ...]]:
        return (finite_median([r.summary_float("params") for r in item[1]]), item[0])

    return dict(sorted(groups.items(), key=order))


def is_ladder(runs: list[Run]) -> bool:
    """True when ``runs`` span 2+ sizes and some size holds 2+ variants (sizes alone: no ladder)."""
    groups = group_by_size(runs)
    return len(groups) >= 2 and any(len({_variant_key(r) for r in g}) >= 2 for g in groups.values())


def training_flops(run: Run) -> float:
    """Training FLOPs of ``run``: (6 N + 12 L d T) per token x ``tokens_seen``; nan when unknown."""
    n = run.summary_float("params")
    dims = [run.resolved(k) for k in ("model.n_layer", "model.d_model", "model.context_length")]
    if not all(isinstance(v, int) for v in dims):
        return NAN
    layers, width, ctx = dims
    return (6.0 * n + 12.0 * layers * width * ctx) * tokens_seen(run)


def _size_row(size: tuple[int, ...], rep: Report) -> dict[str, Any]:
    done = [r for r in rep.runs if r.excluded is None and r.set_aside is None]
    return {
        "shape": shape_name(size),
        "params": finite_median([r.summary_float("params") for r in rep.runs]),
        "tokens": finite_median([tokens_seen(r) for r in done]),
        "compute": finite_median([training_flops(r) for r in done]),
        "report": rep,
    }


def _single_name(size: dict[str, Any], labels: list[str]) -> dict[str, str]:
    """Ladder label whose overrides a one-variant size's runs all carry -> its label. Raises
    ReportError: no label, or several, fit."""
    rep = size["report"]
    own = rep.labels[0]
    fits = [
        lab
        for lab in labels
        if all(lab == design_tag(r) or set(lab.split(",")) <= set(r.overrides) for r in rep.runs)
    ]
    if len(fits) != 1:
        raise ReportError(
            f"model size {size['shape']}: its one variant ({own}) is "
            f"{'none' if not fits else 'more than one'} of the other sizes' ({', '.join(labels)})"
        )
    return {fits[0]: own}


def _labels(sizes: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, str]]]:
    """Ladder labels (baseline first) and per size ladder label -> its report's label. Raises
    ReportError: sizes with other baselines, or a one-variant size that matches no label."""
    multi = [s for s in sizes if len(s["report"].labels) > 1] or sizes
    base = multi[0]["report"].baseline
    for s in multi[1:]:
        if s["report"].baseline != base:
            raise ReportError(
                f"model size {s['shape']} has baseline {s['report'].baseline} but "
                f"{multi[0]['shape']} has {base}: a ladder compares against one baseline at "
                "every size (--baseline)"
            )
    labels = [base, *sorted({lab for s in multi for lab in s["report"].labels} - {base})]
    names = [
        {lab: lab for lab in s["report"].labels} if s in multi else _single_name(s, labels)
        for s in sizes
    ]
    return labels, names


def included(size: dict[str, Any], label: str) -> list[Run]:
    """The completed runs of ladder variant ``label`` at one size (none if it lacks it)."""
    own = size["names"].get(label)
    return size["report"].included(own) if own is not None else []


def comparison_at(size: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The comparison of variant ``label`` in one size's report, or None."""
    own = size["names"].get(label)
    return next((c for c in size["report"].comparisons if c["label"] == own), None)


def _step_row(size: dict[str, Any], comp: dict[str, Any], alpha: float) -> dict[str, Any]:
    """One size's step multiplier m: ``ratio_interval`` of its per-seed values."""
    m = ratio_interval(list(comp["compute"]["step_mults"].values()), alpha)
    row = {"shape": size["shape"], "params": size["params"], "m": m["gmean"], "ci": m["ci"]}
    return {**row, "n": m["n"], "se": m["se_log"], "df": m["df"]}


def _refusal(lad: Ladder, label: str) -> str | None:
    """Why ``label``'s trend has no value at ``TARGET_PARAMS`` (a law failed its check), or None."""
    for lab in dict.fromkeys((lad.baseline, label)):
        law = lad.laws[lab]
        loo = law["loo"]
        if loo is None or loo["why"] is not None:
            return f"{lab}'s law has no leave-largest-out check ({(loo or law)['why']})"
        margin = next(s["report"].margin for s in lad.sizes if s["shape"] == loo["shape"])
        if not abs(loo["error"]) <= margin:
            return (
                f"{lab}'s law, fitted without {loo['shape']}, predicts it at "
                f"{loo['predicted']:.3f} against a measured {loo['measured']:.3f} nats/token "
                f"({loo['error']:+.3f}), beyond that size's ±{margin:.4g} margin"
            )
    return None


def _trend(lad: Ladder, label: str) -> dict[str, Any]:
    """``multiplier_trend`` of ``label``'s step multiplier over its sizes, with their rows."""
    rows = [
        _step_row(s, c, lad.alpha) for s in lad.sizes if (c := comparison_at(s, label)) is not None
    ]
    trend = multiplier_trend(
        [r["params"] for r in rows],
        [r["m"] for r in rows],
        [r["se"] for r in rows],
        lad.alpha,
        df=[r["df"] for r in rows],
    )
    why = _refusal(lad, label)
    if why is not None:
        trend["at_target"] |= {"k": NAN, "ci": (NAN, NAN)}
    trend["at_target"]["refused"] = why
    return {**trend, "sizes": rows}


def _points(sizes: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """Every completed run of ``label`` at every size, as ``Ladder.points``."""
    return [
        {
            "params": r.summary_float("params"),
            "compute": training_flops(r),
            "seed": r.seed,
            "loss": r.final_val_loss,
            "shape": s["shape"],
        }
        for s in sizes
        for r in included(s, label)
    ]


def build_ladder(
    paths: str | Path | list[str | Path],
    margin: float = DEFAULT_MARGIN,
    alpha: float = 0.05,
    baseline: str | None = None,
    margin_compute: float | None = None,
) -> Ladder:
    """Each size's report of the runs of ``paths``, each variant's law and trend. Raises
    ReportError: under 2 sizes, a size's report refused (named), or sizes with other baselines."""
    sources = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    groups = group_by_size(load_runs(sources))
    if len(groups) < 2:
        keys = ", ".join(SIZE_KEYS)
        raise ReportError(f"a ladder needs runs of >= 2 model sizes ({keys}); found {len(groups)}")
    sizes = []
    for size, runs in groups.items():
        try:
            rep = build_report(
                [r.path for r in runs], margin, alpha, baseline, None, margin_compute
            )
        except ReportError as e:
            raise ReportError(f"model size {shape_name(size)}: {e}") from None
        sizes.append(_size_row(size, rep))
    labels, names = _labels(sizes)
    sizes = [{**s, "names": n} for s, n in zip(sizes, names, strict=True)]
    lad = Ladder(sources, alpha, labels[0], labels, sizes)
    lad.points = {lab: _points(sizes, lab) for lab in labels}
    lad.law_sizes, lad.left_out = law_sizes([s["shape"] for s in sizes], lad.points)
    for lab in labels:
        lad.laws[lab] = ladder_law(lad.points[lab], lad.law_sizes, alpha)
    for lab in labels[1:]:
        lad.trends[lab] = _trend(lad, lab)
    return lad


# --- the ladder's report.md ----------------------------------------------------------------------


def si(x: float) -> str:
    """``826112`` -> ``"826k"``, ``1.24e8`` -> ``"124M"``, ``9.5e12`` -> ``"9.5T"``."""
    if missing(x):
        return "n/a"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def one_margin(lad: Ladder) -> float | None:
    """The nats margin every size used, or None when each has its own (``--margin-compute``)."""
    if any(s["report"].margin_compute is not None for s in lad.sizes):
        return None
    margins = {s["report"].margin for s in lad.sizes}
    return margins.pop() if len(margins) == 1 else None


def _ladder_margin(lad: Ladder) -> str:
    """The header's margin: the shared one, or a pointer to each size's own."""
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
    """The ladder's title: sources, variants, sizes, margin, the laws' degrees of freedom."""
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
        *([f"- **Learning rate:** {note}."] if (note := ladder_untuned_note(lad)) else []),
        f"- One point per size: laws are fitted to the {k} size means, with sizes − parameters "
        f"degrees of freedom ({k - 3} for E + A (C/C0)^-alpha, {k - 2} for A (C/C0)^-alpha). "
        + method("the-ladder-report"),
    ]


def ladder_untuned_note(lad: Ladder) -> str | None:
    """The note when, at every size, every variant trained at one lr; None when a size tuned."""
    lrs = [tuned.one_lr(s["report"]) for s in lad.sizes]
    if not lrs or None in lrs:
        return None
    at = ", ".join(f"{s['shape']}: {lr:g}" for s, lr in zip(lad.sizes, lrs, strict=True))
    return (
        f"every variant trained at one learning rate at every size ({tuned.LR_KEY} {at}), "
        f"{tuned.OFF_OPTIMUM} (each size's report says how to tune)"
    )


def _ladder_sizes(lad: Ladder) -> list[str]:
    """Per size: N, tokens, compute, runs, its own margin and slope, whether the laws use it."""
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
    """One size's row of ``_ladder_pairs``: loss difference, step multiplier, speed, k."""
    c = comparison_at(size, label)
    if c is None:
        return [size["shape"], 0, "—", "—", f"no run of `{label}`", "—", "—", "—", "—", "—", "—"]
    k = c["compute"]
    m = next(r for r in lad.trends[label]["sizes"] if r["shape"] == size["shape"])
    flag = "" if k["comparable"] else NOT_COMPARABLE_FLAG
    row = [size["shape"], c["n"], fmt(c["mean"], "+.4f"), fmt_ci(c["ci"]), c["verdict"]]
    row += [fmt(m["m"], ".3f"), fmt_ci(m["ci"], ".3f"), fmt(k["speed"], ".3f"), k["source"] + flag]
    return [*row, fmt(k["k"], ".3f") + flag, fmt_ci(k["ci"], ".3f")]


def _ladder_pairs(lad: Ladder, label: str) -> list[str]:
    """Per size: ``label``'s paired loss difference, step multiplier m, speed, and k = m x speed."""
    conf = ci_name(lad.alpha)
    head = ["size", "n", "loss diff", conf, "verdict", "step mult. m", f"m {conf}", "speed"]
    head += ["speed from", "k = m x speed", f"k {conf}"]
    return [
        "",
        f"## `{label}` vs `{lad.baseline}` at each size",
        "",
        "Loss diff: final validation loss, variant − baseline (nats/token), paired by seed, with "
        "the size's TOST verdict; m: the step multiplier; speed: baseline / variant step time "
        "(the machine's); k = m x speed, above 1 favours the variant. "
        + method("the-headline-effective-compute"),
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
    """The slope of ln m on ln N and, when the checks passed, the value at 124M parameters."""
    t = lad.trends[label]
    conf = f"{100 * (1 - lad.alpha):g}%"
    if t["n"] < 2 or missing(t["slope"]):
        return ["", f"- `{label}`: fewer than 2 sizes with a step multiplier: no trend."]
    how = "weighted by 1/se² of each size's ln m" if t["weighted"] else "unweighted"
    at = t["at_target"]
    where = f"{si(at['params'])} parameters (GPT-2 small, {fmt(at['beyond'], '.3g')}x beyond)"
    line = (
        f"- `{label}`: m ∝ N^b with b = {t['slope']:+.4f}, {conf} CI {fmt_ci(t['slope_ci'])} "
        f"(over {t['n']} sizes, {how}; {fmt(t['slope_df'], '.3g')} degrees of freedom): "
        f"{_trend_word(t)}"
    )
    if at["refused"] is not None:
        return ["", line, f"- `{label}` at {where}: **no value**: {at['refused']}."]
    return [
        "",
        line,
        f"- `{label}` at {where}: m = {fmt(at['k'], '.3f')}, {conf} interval "
        f"{fmt_ci(at['ci'], '.3f')}. **An extrapolation**, shown because both laws predicted "
        "the left-out largest size within its margin; it holds only if ln m stays a straight "
        "line in ln N that far.",
    ]


def _law_row(lab: str, law: dict[str, Any]) -> list[Any]:
    """One variant's row of the laws table (``ladder_law``)."""
    if law["form"] is None:
        return [f"`{lab}`", "none", "—", "—", "—", "—", law["n"], law["runs"], "—", law["why"]]
    se = law["se"]
    ci = "n/a: 0 df" if law["dof"] == 0 else fmt_ci(law["alpha_ci"], ".4f")
    e = f"{fmt(law['E'])} ± {fmt(se['E'])}" if not missing(law["E"]) else "—"
    row = [f"`{lab}`", law["form"], e, f"{fmt(law['A'])} ± {fmt(se['A'])}"]
    row += [f"{fmt(law['alpha'])} ± {fmt(se['alpha'])}", ci, law["n"], law["runs"], law["dof"]]
    return [*row, law["why"] or "3 parameters, a degree of freedom left, E inside its bounds"]


def _check_row(lad: Ladder, lab: str, law: dict[str, Any]) -> list[Any]:
    """One variant's lack-of-fit test and leave-largest-out prediction."""
    lof, loo = law["lof"], law["loo"]
    if lof is None:
        return [f"`{lab}`", "—", "—", "—", "—", "—", "—", "—"]
    f = f"{lof['F']:.3g} on ({lof['df_lof']}, {lof['df_pe']})"
    f = f if not missing(lof["F"]) else f"n/a: df ({lof['df_lof']}, {lof['df_pe']})"
    row = [f"`{lab}`", f, fmt(lof["p"], ".3g"), loo["shape"]]
    if loo["why"] is not None:
        return [*row, f"n/a: {loo['why']}", fmt(loo["measured"]), "—", "—"]
    margin = next(s["report"].margin for s in lad.sizes if s["shape"] == loo["shape"])
    within = "yes" if abs(loo["error"]) <= margin else "**no**"
    row += [fmt(loo["predicted"]), fmt(loo["measured"]), fmt(loo["error"], "+.4f")]
    return [*row, f"{within} (±{margin:.4g})"]


def _ladder_laws(lad: Ladder) -> list[str]:
    """The loss-compute laws over the size means with their two checks."""
    c0 = ", ".join(f"`{lab}` {fmt(law['c0'], '.3g')}" for lab, law in lad.laws.items())
    head = ["variant", "law", "E (fitted)", "A", "alpha", f"alpha {ci_name(lad.alpha)}"]
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
        f"at its training compute C (FLOPs); C0 ({c0}) the geometric mean of the sizes' C. "
        "**E is fitted**: the floor these sizes fit, not an irreducible loss. ± one standard "
        "error. " + method("why-the-ladder-reads-size-means-and-what-it-refuses"),
        *([] if not left else ["", f"Left out of every law, so all span the same sizes: {left}."]),
        "",
        *table(head, laws),
        "",
        "Lack of fit: a small p, the law misses the size means by more than seed noise. "
        "Leave-largest-out: the law refitted without the largest size, read at its compute; a "
        "trend gets a 124M value only when both its laws land within that size's margin.",
        "",
        *table(checks, tests),
    ]


#: The ladder's figures: key -> (title, one-line caption).
LADDER_FIGURES = {
    "ladder_loss": (
        "Final validation loss vs training compute (log-log): size means, fitted laws",
        "Final validation loss vs training compute, log-log: runs, size means (diamonds) and each "
        "variant's fitted law.",
    ),
    "ladder_multiplier": (
        "Step multiplier vs parameters, its trend (to 124M when allowed)",
        "Step multiplier m vs parameters with its interval and trend, dashed to 124M parameters "
        "only when both laws passed the leave-largest-out check.",
    ),
}


def render_ladder(lad: Ladder) -> str:
    """The ladder's ``report.md`` as Markdown."""
    lines = [*_ladder_header(lad), *_ladder_sizes(lad)]
    for lab in lad.labels[1:]:
        lines += _ladder_pairs(lad, lab)
    if lad.trends:
        lines += [
            "",
            "## Trend of the step multiplier with size",
            "",
            "Of m alone: the speed part of k is the machine's, read per size above. "
            + method("why-the-ladder-reads-size-means-and-what-it-refuses"),
        ]
        for lab in lad.labels[1:]:
            lines += _ladder_trend(lad, lab)
    lines += [*_ladder_laws(lad), "", "## Figures", ""]
    lines += figure_lines(lad.figures, LADDER_FIGURES)
    return "\n".join(lines).rstrip("\n") + "\n"


# --- the ladder's figures ------------------------------------------------------------------------


def plot_ladder_loss(lad: Ladder, path: Path) -> Path | None:
    """Final loss (nats/token) against training FLOPs, log-log: runs, size means and each law."""
    pts = {
        lab: [p for p in ps if p["compute"] > 0 and p["loss"] > 0] for lab, ps in lad.points.items()
    }
    if not any(pts.values()):
        return None
    fig, ax = axes((7.5, 5))
    for i, (lab, ps) in enumerate(pts.items()):
        color, law = f"C{i % 10}", lad.laws[lab]
        c, loss = np.array([p["compute"] for p in ps]), np.array([p["loss"] for p in ps])
        ax.plot(c, loss, "o", ms=3, color=color, alpha=0.5, label=f"{lab} (runs)")
        means = law["means"]
        if not means or law["form"] is None:
            continue
        mc = np.array([m["compute"] for m in means])
        ax.plot(mc, [m["loss"] for m in means], "D", ms=6, mfc="none", color=color)
        grid = np.geomspace(mc.min(), mc.max(), 100)
        label = f"{lab}: {law['form']}, alpha = {law['alpha']:.3f}"
        ax.plot(grid, law_value(law, grid), "-", color=color, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _: f"{v:g}"))
    title = "Final validation loss vs training compute (dots: runs; diamonds: size means; laws)"
    return finish(
        fig, ax, path, title, "training compute C (FLOPs)", "final validation loss (nats/token)"
    )


def plot_ladder_multiplier(lad: Ladder, path: Path) -> Path | None:
    """Step multiplier m against parameters N, log-log: per size m, its interval, the trend."""
    if not lad.trends:
        return None
    fig, ax = axes((7.5, 5))
    ax.axhline(1.0, color="0.5", lw=1, ls=":")
    for i, (lab, t) in enumerate(lad.trends.items()):
        color = f"C{(i + 1) % 10}"
        rows = [r for r in t["sizes"] if r["m"] > 0]
        if not rows:
            continue
        n = np.array([r["params"] for r in rows])
        m = np.array([r["m"] for r in rows])
        lo = np.array([r["ci"][0] if math.isfinite(r["ci"][0]) else r["m"] for r in rows])
        hi = np.array([r["ci"][1] if math.isfinite(r["ci"][1]) else r["m"] for r in rows])
        label = f"{lab} vs {lad.baseline}"
        ax.errorbar(n, m, yerr=[m - lo, hi - m], fmt="o", capsize=3, color=color, label=label)
        if not math.isfinite(t["slope"]):
            continue
        at = t["at_target"]
        inside = np.geomspace(n.min(), n.max(), 50)
        label = f"trend: m ∝ N^{t['slope']:+.3f}"
        ax.plot(inside, trend_value(t, inside), "-", color=color, label=label)
        if at["refused"] is not None:
            continue
        beyond = np.geomspace(n.max(), at["params"], 50)
        ax.plot(beyond, trend_value(t, beyond), "--", color=color)
        if all(map(math.isfinite, at["ci"])):
            ax.errorbar(
                [at["params"]],
                [at["k"]],
                yerr=[[at["k"] - at["ci"][0]], [at["ci"][1] - at["k"]]],
                fmt="s",
                mfc="none",
                capsize=4,
                color=color,
                label=f"{at['params'] / 1e6:.0f}M parameters: extrapolated",
            )
    ax.set_xscale("log")
    ms = [r["m"] for t in lad.trends.values() for r in t["sizes"]]
    _k_axis(ax, ms + [t["at_target"]["k"] for t in lad.trends.values()])
    conf = f"{100 * (1 - lad.alpha):g}% CI"
    title = f"Step multiplier vs parameters (bars: {conf}, clipped; dashed: extrapolation)"
    ylabel = "step multiplier m (> 1: a variant step is worth more)"
    return finish(fig, ax, path, title, "parameters N", ylabel)


def _k_axis(ax: Any, ks: list[float]) -> None:
    """A log k axis over ``ks`` and 1, widened 3x each way."""
    ks = [k for k in ks if math.isfinite(k) and k > 0] + [1.0]
    ax.set_yscale("log")
    # a two-seed interval can span decades: drawn whole, it would flatten every point
    ax.set_ylim(min(ks) / 3, max(ks) * 3)
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _: f"{v:g}"))


def write_ladder_figures(lad: Ladder, out_dir: Path) -> dict[str, Path | None]:
    """Write ``ladder_loss.png`` and ``ladder_multiplier.png``; name -> path (None: no data)."""
    return {
        "ladder_loss": plot_ladder_loss(lad, out_dir / "ladder_loss.png"),
        "ladder_multiplier": plot_ladder_multiplier(lad, out_dir / "ladder_multiplier.png"),
    }
