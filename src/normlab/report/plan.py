"""The plan of a study from a pilot sweep (``normlab-report --plan``): the seeds a TOST at a margin
needs at the pilot's paired std and its upper bound, and the hours on the pilot's machine.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

from normlab.report.context import steps_done
from normlab.report.paired import Report, median_of
from normlab.report.runs import Run
from normlab.report.speed import MIN_STEPS
from normlab.report.stats import NAN, POWER, finite_median
from normlab.report.text import fmt


def steps_to_time(warmup: int, diag_interval: int | None, timed: int = MIN_STEPS) -> int | None:
    """Fewest ``max_steps`` that time ``timed`` steps past ``warmup`` and diagnostics, or None."""
    if diag_interval == 1:
        return None
    n = counted = 0
    while counted < warmup + timed:
        n += 1
        counted += not (diag_interval and n % diag_interval == 0)
    return n


def untimed(runs: list[Run], steps: float) -> dict[str, Any]:
    """Why pilot ``runs`` of ``steps`` steps has no step time: ``warmup``, ``diag_interval``,
    ``max_steps`` (fewest that time every run), ``short``."""
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
    """``margin``, ``alpha``, ``variants``, ``steps``, ``step_s``, ``overhead_s``, ``run_s``,
    ``untimed``, ``rows`` (per variant: std, ``std_upper``, seeds and hours at each)."""
    runs = [r for lab in rep.labels for r in rep.included(lab)]
    steps = finite_median([float(x) for r in runs if (x := steps_done(r)) is not None])
    step_s = median_of(runs, "step_time_ms_median") / 1000
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


# --- the lines printed ---------------------------------------------------------------------------


def _untimed_text(plan: dict[str, Any]) -> str:
    """Why the pilot of ``plan`` has no step time, and the ``max_steps`` that would time it."""
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
    """One variant's line: seeds (and hours, when timed) at the paired std and its upper bound."""
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
    """The lines ``normlab-report --plan`` prints: seeds per variant, hours or why untimed."""
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
