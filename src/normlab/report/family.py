"""A family of comparisons (more than one variant against one baseline): Holm-adjusted verdicts
and whether one design is shown best (a tested lead beyond the margin, over a baseline that has
runs); the family's section. See docs/reports.md "Families (Holm) and a best design".
"""

from __future__ import annotations

import math
from typing import Any

from normlab.report.paired import Report, by_seed, paired_diffs
from normlab.report.stats import holm, holm_verdicts, p_two_sided, paired_difference
from normlab.report.text import ci_name, fmt, fmt_ci, method, table
from normlab.report.tuned import run_lr


def family_verdicts(rep: Report) -> None:
    """Give each comparison of a family (more than one variant against the baseline) its
    ``holm`` verdict (``holm_verdicts``); nothing for a single comparison."""
    if len(rep.comparisons) > 1:
        family = holm_verdicts(rep.comparisons, rep.margin, rep.alpha)
        for c, h in zip(rep.comparisons, family, strict=True):
            c["holm"] = h


def best_design(rep: Report) -> dict[str, Any] | None:
    """Whether one design of a family is shown best: the leader (lowest mean final loss) ahead of
    the runner-up by a two-sided paired t-test, Holm-adjusted with the family's tests, and nothing
    withholding it (``best_withheld``); None for one comparison.

    Returns:
        ``leader``, ``runner_up``, the lead's ``n``, ``mean``, ``ci``, ``equivalent``, ``p``,
        ``p_holm``, ``family`` (tests), ``detectable``, ``withheld``, ``exclusions`` (the two's
        seeds that did not complete) and ``shown``.
    """
    if len(rep.comparisons) < 2:
        return None
    ranked = sorted(
        (v for v in rep.variants if math.isfinite(v["mean"])), key=lambda v: (v["mean"], v["label"])
    )
    if len(ranked) < 2:
        return None
    leader, runner = ranked[0]["label"], ranked[1]["label"]
    _, diffs = paired_diffs(
        {s: r.final_val_loss for s, r in by_seed(rep, leader).items()},
        {s: r.final_val_loss for s, r in by_seed(rep, runner).items()},
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
    """Why no best design is named whatever the test says, or None: the baseline has no completed
    run, or a detectable lead (``lead``: runner-up − leader, nats/token) inside the study's margin.
    """
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
    """The seeds of the study that variant ``label`` did not complete, as ``"`label` seed S:
    reason"`` (its exclusion, or ``no run``); in a tuned study only its runs at its best learning
    rate count."""
    runs = [r for r in rep.runs if r.label == label]
    if rep.tuned is not None:
        runs = [r for r in runs if run_lr(r) == rep.tuned["best"].get(label)]
    out = [f"`{label}` seed {r.seed}: {r.excluded}" for r in runs if r.excluded is not None]
    missing = {r.seed for r in rep.runs if r.seed is not None} - {r.seed for r in runs}
    return out + [f"`{label}` seed {s}: no run" for s in sorted(missing, key=str)]


# --- the section ---------------------------------------------------------------------------------


def family_clause(rep: Report, c: dict[str, Any], sentence: str) -> str:
    """``sentence`` followed, for a comparison of a family (``c["holm"]``), by its Holm verdict."""
    h = c.get("holm")
    if not h:
        return sentence
    return (
        f"{sentence} Over the family of {len(rep.comparisons)} comparisons with "
        f"`{rep.baseline}` (Holm-adjusted p = {fmt(h['p_tost_holm'], '.3g')} for equivalence, "
        f"{fmt(h['p_diff_holm'], '.3g')} for a difference): **{h['verdict']}**."
    )


def render_family(rep: Report) -> list[str]:
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
        f"p-values adjusted over the family of {len(comps)} comparisons (alpha = {rep.alpha:g}); "
        "a claim about one variant of many rests on the family's verdict. "
        + method("families-holm-and-a-best-design"),
        "",
        *table(head, rows),
        "",
        best_text(rep),
    ]


def best_text(rep: Report) -> str:
    """Whether the family shows a best design (``best_design``), in one sentence with its test: the
    leader named best, "no best design" with the reason, or "no variant is shown best"; the two's
    seeds that did not complete named in it. Empty for a single comparison."""
    b = best_design(rep)
    if b is None:
        return ""
    conf = ci_name(rep.alpha)
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
