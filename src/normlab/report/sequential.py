"""Anytime-valid verdicts: a confidence sequence for the paired mean difference, valid however
often it is looked at (after every seed pair) and whenever the study stops.

The sequence is Lai's (1976, Ann. Statist. 4:265) for a normal mean with unknown variance, as
Wang and Ramdas (2023) write it: a mixture over the standardized effect (precision ``c``) of the
scale-invariant likelihood ratio, closed by Ville's inequality. It assumes the paired differences
are independent and normal with one unknown variance; it needs no guess of the scale.
Why and how to read it: docs/reports.md "Anytime-valid verdicts".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.stats import NAN, paired_difference

#: The mixture precision over the standardized effect (mean / std): the sequence is tightest
#: where effects of about 1/sqrt(c) std are decided; chosen by simulation before any real data.
MIXTURE_C = 2.0
#: The fewest pairs a look uses (the sample variance needs two).
MIN_PAIRS = 2
DECISIONS = ("equivalent", "different", "undecided")
#: The most pairs a projection looks at.
PROJECT_MAX = 100_000


def half_width(n, ss, alpha: float, c: float = MIXTURE_C):
    """Half-width of Lai's 1−alpha confidence sequence after ``n`` pairs whose sum of squared
    deviations from their mean is ``ss`` (scalars or arrays that broadcast); inf while the
    sequence is still the whole line (too few pairs for this alpha)."""
    n, ss = np.asarray(n, dtype=np.float64), np.asarray(ss, dtype=np.float64)
    r = 1.0 - (alpha**2 * c / (n + c)) ** (1.0 / n)  # the bound on S^2 / ((n + c) Q)
    denom = n * (n - r * (n + c))
    ok = (n >= MIN_PAIRS) & (denom > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(ok, np.sqrt(r * (n + c) * ss / np.where(ok, denom, 1.0)), np.inf)
    return float(w) if w.ndim == 0 else w


def decide(lo: float, hi: float, margin: float) -> str:
    """``equivalent`` (the interval inside ±margin), ``different`` (entirely beyond it) or
    ``undecided``."""
    if -margin < lo and hi < margin:
        return "equivalent"
    if lo > margin or hi < -margin:
        return "different"
    return "undecided"


def looks(diffs: list[float], margin: float, alpha: float, c: float = MIXTURE_C) -> list[dict]:
    """The sequence after each pair of ``diffs`` (in the order the pairs were run): ``n``, the
    running-intersection interval ``lo``/``hi`` (valid at every n at once) and its decision."""
    out, lo, hi = [], -math.inf, math.inf
    for n in range(1, len(diffs) + 1):
        x = np.asarray(diffs[:n], dtype=np.float64)
        w = half_width(n, float(((x - x.mean()) ** 2).sum()), alpha, c)
        lo, hi = max(lo, x.mean() - w), min(hi, x.mean() + w)
        out.append({"n": n, "lo": lo, "hi": hi, "decision": decide(lo, hi, margin)})
    return out


def in_run_order(seeds: list, diffs: list[float]) -> list[float]:
    """``diffs`` ordered by seed, numerically (seeds 0, 1, 2, ... are the order a driver runs
    them in; a report lists them sorted as text)."""
    key = [(0, s, "") if isinstance(s, int) else (1, 0, str(s)) for s in seeds]
    return [d for _, d in sorted(zip(key, diffs, strict=True), key=lambda kd: kd[0])]


def projected_pairs(diffs: list[float], margin: float, alpha: float, c: float = MIXTURE_C):
    """``(pairs, decision)``: the fewest pairs after which the sequence would decide if the mean
    and std of ``diffs`` stayed as observed (an estimate: the running intersection may decide
    sooner, a new pair moves both); ``(None, None)`` beyond PROJECT_MAX pairs or with < 2 pairs."""
    if len(diffs) < MIN_PAIRS:
        return None, None
    x = np.asarray(diffs, dtype=np.float64)
    d, var = abs(float(x.mean())), float(x.var(ddof=1))
    n = np.arange(len(x), PROJECT_MAX + 1, dtype=np.float64)
    w = half_width(n, (n - 1) * var, alpha, c)
    decision = "equivalent" if d < margin else "different"
    ok = d + w < margin if d < margin else d - w > margin
    return (int(n[ok.argmax()]), decision) if ok.any() else (None, None)


def sequential_verdict(
    diffs: list[float], margin: float, alpha: float = 0.05, c: float = MIXTURE_C
) -> dict[str, Any]:
    """The anytime-valid verdict on paired differences in run order: the decision at the first
    decisive look (else ``undecided`` after all of them), the pairs it used, its interval, and the
    fixed-n TOST at the same n (valid only had that n been fixed in advance)."""
    seq = looks(diffs, margin, alpha, c)
    first = next((s for s in seq if s["decision"] != "undecided"), seq[-1] if seq else None)
    if first is None:
        return {"n": 0, "lo": NAN, "hi": NAN, "decision": "undecided", "looks": [], "fixed": None}
    fixed = paired_difference(list(diffs[: first["n"]]), margin, alpha)
    out = {**first, "n_available": len(diffs), "looks": seq, "fixed": fixed, "alpha": alpha}
    if first["decision"] == "undecided":
        out["projected"] = projected_pairs(diffs, margin, alpha, c)
    return out


def verdict_line(v: dict[str, Any], margin: float, unit: str = "nats") -> str:
    """One line: the decision, the pairs used, the always-valid interval and the fixed-n one."""
    conf = round(100 * (1 - v.get("alpha", 0.05)))
    head = f"{v['decision']} after {v['n']} of {v.get('n_available', v['n'])} pairs"
    ci = f"always-valid {conf}% CI [{v['lo']:+.4f}, {v['hi']:+.4f}] {unit} (margin ±{margin:g})"
    fixed, line = v.get("fixed"), f"{head}: {ci}"
    if fixed and math.isfinite(fixed["ci_tost"][0]):
        lo, hi = fixed["ci_tost"]
        tost = round(100 * (1 - 2 * v.get("alpha", 0.05)))
        line += f"; fixed-n {tost}% CI at the same n [{lo:+.4f}, {hi:+.4f}]"
    if "projected" in v:
        n, decision = v["projected"]
        line += (
            f"; at the observed mean and std it would decide ({decision}) after about {n} pairs"
            if n
            else f"; at the observed mean and std it would not decide within {PROJECT_MAX} pairs"
        )
    return line


def render_sequential(comparisons: list[dict[str, Any]], baseline: str, margin: float) -> list[str]:
    """``## Anytime-valid verdict`` (``--sequential``): per comparison its verdict line and the
    interval after each pair; [] when no comparison carries a ``sequential`` verdict."""
    rows = [c for c in comparisons if c.get("sequential")]
    if not rows:
        return []
    out = ["", "## Anytime-valid verdict", ""]
    for c in rows:
        v = c["sequential"]
        out += [f"`{c['label']}` vs `{baseline}`: **{verdict_line(v, margin)}**.", ""]
        out += ["| pairs | always-valid lo | hi | decision |", "|---|---|---|---|"]
        out += [
            f"| {s['n']} | {s['lo']:+.4f} | {s['hi']:+.4f} | {s['decision']} |"
            for s in v["looks"]
            if math.isfinite(s["lo"])
        ]
        out += [""]
    return out + ["Method: `docs/reports.md#anytime-valid-verdicts`."]
