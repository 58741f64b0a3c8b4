"""Stability: loss spikes per run and their paired difference, the largest activation abs-max and
kurtosis with their sublayer, the largest pre-clip gradient norm; its section.

Why: docs/reports.md
"""

from __future__ import annotations

import json
import math
from typing import Any

from normlab.report.paired import Report, paired_diffs
from normlab.report.runs import Run
from normlab.report.series import num
from normlab.report.stats import NAN, describe, paired_difference
from normlab.report.text import ci_name, fmt, fmt_ci, method, table

#: ``summary.json`` keys of the run's stability record (``normlab.training.record``).
SPIKES_KEY, MAX_GRAD_KEY = "loss_spikes", "max_grad_norm"
#: Suffixes of the ``diag/`` outlier statistics (``normlab.training.diagnostics.tail_stats``).
ABSMAX_SUFFIX, KURTOSIS_SUFFIX = "_absmax", "_kurtosis"


def largest_diag(run: Run, suffix: str) -> tuple[float, str | None]:
    """Largest finite ``diag/...<suffix>`` of ``run`` and its sublayer, or ``(nan, None)``."""
    best, where = NAN, None
    for row in run.metrics:
        for k, v in row.items():
            if k.startswith("diag/") and k.endswith(suffix) and math.isfinite(x := num(v)):
                if not best >= x:  # nan compares False: the first value wins
                    best, where = x, k.removeprefix("diag/").removesuffix(suffix)
    return best, where


def _largest(runs: list[Run], suffix: str) -> dict[str, Any]:
    """The largest ``largest_diag`` of ``runs`` with where it was and how many runs had one."""
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
    """Per variant ``spikes``, ``absmax``, ``kurtosis``, ``grad_norm``; paired spike ``diff``;
    ``all_zero``; ``rules``. None when no run recorded any."""
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
            seeds, d = paired_diffs(counts[rep.baseline], counts[lab])
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


# --- the section ---------------------------------------------------------------------------------


def _spike_rule(rules: list[dict[str, Any]]) -> str:
    """The spike rule's parameters as the runs recorded them."""
    if not rules:
        return "the runs recorded no spike rule"
    each = "; ".join(f"window {r.get('window')} steps, k = {r.get('k')}" for r in rules)
    return each + (": the runs differ in rule" if len(rules) > 1 else "")


def _stability_rows(st: dict[str, Any]) -> list[list[Any]]:
    """Per variant: runs, spikes, runs spiking, largest abs-max, kurtosis, gradient norm."""
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
    """``## Stability``: spikes and their paired difference, activations, gradient norm."""
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
        f"Spike rule: {_spike_rule(st['rules'])}. Abs-max and kurtosis: n/a without diagnostics "
        "(`diag_interval`); gradient norm: before clipping. " + method("stability"),
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
        head = ["variant", "n", f"spikes − `{rep.baseline}` (per run)", ci_name(rep.alpha)]
        out += ["", "Paired by seed:", "", *table(head, rows)]
    return out
