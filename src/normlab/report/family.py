"""A family of comparisons (2+ variants, one baseline): Holm-adjusted verdicts and whether one
design is shown best; the family's section.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

from normlab.report.paired import Report, by_seed, paired_diffs
from normlab.report.stats import holm, holm_verdicts, p_two_sided, paired_difference
from normlab.report.text import ci_name, fmt, fmt_ci, method, table
from normlab.report.tuned import run_lr


def family_verdicts(rep: Report) -> None:
    """Give each comparison of a family its ``holm`` verdict; nothing for a single comparison."""
    if len(rep.comparisons) > 1:
        family = holm_verdicts(rep.comparisons, rep.margin, rep.alpha)
        for c, h in zip(rep.comparisons, family, strict=True):
            c["holm"] = h


def best_design(rep: Report) -> dict[str, Any] | None:
    """``leader``, ``runner_up``, ``n``, ``mean``, ``ci``, ``p``, ``p_holm``, ``withheld``,
    ``shown``...: the lead's two-sided paired t-test, Holm-adjusted in the family; None for one."""
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
    """Why no best design is named whatever the test (no baseline run, lead in margin), or None."""
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
    """``"`label` seed S: reason"`` per seed ``label`` did not complete (tuned: at its best lr)."""
    runs = [r for r in rep.runs if r.label == label]
    if rep.tuned is not None:
        runs = [r for r in runs if run_lr(r) == rep.tuned["best"].get(label)]
    out = [f"`{label}` seed {r.seed}: {r.excluded}" for r in runs if r.excluded is not None]
    missing = {r.seed for r in rep.runs if r.seed is not None} - {r.seed for r in runs}
    return out + [f"`{label}` seed {s}: no run" for s in sorted(missing, key=str)]


# --- the section ---------------------------------------------------------------------------------


def family_clause(rep: Report, c: dict[str, Any], sentence: str) -> str:
    """``sentence`` plus, in a family, the comparison's Holm verdict."""
    h = c.get("holm")
    if not h:
        return sentence
    return (
        f"{sentence} Over the family of {len(rep.comparisons)} comparisons with "
        f"`{rep.baseline}` (Holm-adjusted p = {fmt(h['p_tost_holm'], '.3g')} for equivalence, "
        f"{fmt(h['p_diff_holm'], '.3g')} for a difference): **{h['verdict']}**."
    )


def render_family(rep: Report) -> list[str]:
    """``## Family of comparisons (Holm)``: plain and adjusted p-values and verdicts, or nothing."""
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
    """The family's best-design sentence with its test; empty for a single comparison."""
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
