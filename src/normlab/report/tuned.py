"""The tuned comparison: each variant at its own best learning rate, chosen on half the seeds and
tested on the others; its section and ``lr_curve.png``. Losses in nats/token.

Why: docs/reports.md
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from normlab.report.paired import Report, paired_diffs
from normlab.report.plots import axes, finish
from normlab.report.runs import Run, override_key
from normlab.report.stats import describe, paired_difference, t_interval
from normlab.report.text import ci_name, fmt, fmt_ci, method, table

#: The key a tuned comparison sweeps (each variant at its own best value of it).
LR_KEY = "optim.lr"
#: A tuned comparison with at least SPLIT_SEEDS seeds chooses each variant's lr on half of them
#: and tests on the others (``choose_best_lr``); with fewer its interval is selection-biased.
SPLIT_SEEDS = 4


def run_lr(run: Run) -> float | None:
    """The run's peak learning rate (``optim.lr`` as resolved), None when not recorded."""
    v = run.resolved(LR_KEY)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def lr_swept(runs: list[Run]) -> bool:
    """True when every run overrides ``optim.lr`` and the runs hold 2+ learning rates."""
    overridden = bool(runs) and all(
        any(override_key(o) == LR_KEY for o in r.overrides) for r in runs
    )
    return overridden and len({run_lr(r) for r in runs} - {None}) >= 2


def choose_best_lr(runs: list[Run], labels: list[str], alpha: float = 0.05) -> dict[str, Any]:
    """``{"lrs", "points", "best", "edge", "selection", "choose_seeds", "test_seeds"}`` per variant;
    sets ``Run.set_aside`` on every run off its variant's best lr (mutates ``runs``)."""
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
    """One grid cell: ``describe`` of final losses (nats/token), its t ``ci``, ``by_seed``."""
    finals = [r.final_val_loss for r in runs]
    return {
        **describe(finals),
        "ci": t_interval(finals, 1 - alpha),
        "by_seed": {r.seed: r.final_val_loss for r in runs},
    }


def at_each_lr(
    tuned: dict[str, Any], baseline: str, margin: float, alpha: float
) -> dict[str, dict[float, dict[str, Any]]]:
    """Per label and shared lr: ``paired_difference`` variant − baseline by seed (nats/token)."""
    base = tuned["points"].get(baseline, {})
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for lab, pts in tuned["points"].items():
        if lab == baseline:
            continue
        out[lab] = {}
        for lr, p in pts.items():
            if lr not in base:
                continue
            _, diffs = paired_diffs(base[lr]["by_seed"], p["by_seed"])
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


def selection_warning(tuned: dict[str, Any]) -> str | None:
    """The warning when the learning rates were chosen on the tested seeds, else None."""
    if tuned["selection"] != "biased":
        return None
    return (
        f"each variant's learning rate was chosen on the same {len(tuned['test_seeds'])} "
        f"seed(s) the verdict then tests (under {SPLIT_SEEDS} seeds: no split): the interval is "
        "selection-biased (winner's curse), a variant's best rate looks better on these seeds "
        f"than on new ones; with >= {SPLIT_SEEDS} seeds the report chooses on half and tests on "
        "the others"
    )


# --- the section and the figure ------------------------------------------------------------------


def render_tuned(rep: Report) -> list[str]:
    """``## Tuned comparison``: loss per lr and variant, each best, paired differences per lr."""
    t = rep.tuned
    if not t:
        return []
    labels = list(t["points"])
    conf = ci_name(rep.alpha)

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
        "rate; bold: each variant's best. Every section above compares each variant at its "
        f"best: {best}. {_selection(t)} Last columns: the paired difference at each learning "
        "rate, over every seed. " + method("tuned-comparison"),
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
        f"tests ({seeds}; a split needs >= {SPLIT_SEEDS} seeds): winner's curse."
    )


def plot_lr_curve(tuned: dict[str, Any], path: Path, conf: str) -> Path | None:
    """Mean final loss against ``optim.lr`` (log) per variant with ``conf`` bars, bests circled."""
    curves = lr_curves(tuned)
    if not any(len(c[0]) for c in curves.values()):
        return None
    fig, ax = axes()
    for i, (lab, (lrs, mean, lo, hi, _n)) in enumerate(curves.items()):
        color = f"C{i % 10}"
        err = np.vstack([mean - lo, hi - mean])
        err = np.where(np.isfinite(err), err, 0.0)
        ax.errorbar(lrs, mean, yerr=err, color=color, marker="o", ms=4, capsize=3, label=lab)
        best = tuned["best"].get(lab)
        if best is not None:
            y = mean[list(lrs).index(best)]
            ax.plot([best], [y], "o", ms=12, mfc="none", color=color)
    ax.set_xscale("log")
    title = f"Final validation loss vs learning rate (mean over seeds, bars: {conf}; ring: best)"
    return finish(fig, ax, path, title, "optim.lr (peak)", "final validation loss (nats/token)")


#: The figure of this section, as the Figures section shows it: key -> (title, caption).
FIGURE = {
    "lr_curve": (
        "Final validation loss vs learning rate (tuned comparison)",
        "Final validation loss vs learning rate: mean over seeds with its interval, each "
        "variant's best circled.",
    )
}


def tuned_figure(rep: Report, out_dir: Path) -> dict[str, Path | None]:
    """``lr_curve.png`` of a tuned study into ``out_dir``; nothing otherwise."""
    if not rep.tuned:
        return {}
    path = out_dir / "lr_curve.png"
    return {"lr_curve": plot_lr_curve(rep.tuned, path, ci_name(rep.alpha))}


#: Why a report at one learning rate says so.
OFF_OPTIMUM = "not at its own best: a variant whose best lr differs is judged off its optimum"


def one_lr(rep: Report) -> float | None:
    """The learning rate every compared run trained at; None for a tuned report, no comparison,
    or runs at several (or unrecorded) learning rates."""
    if rep.tuned is not None or not rep.comparisons:
        return None
    lrs = {run_lr(r) for lab in rep.labels for r in rep.included(lab)}
    return None if len(lrs) != 1 or None in lrs else lrs.pop()


def untuned_note(rep: Report) -> str | None:
    """The note when every variant trained at one lr, or None for a tuned report."""
    if (lr := one_lr(rep)) is None:
        return None
    return (
        f"every variant trained at one learning rate ({LR_KEY}={lr:g}), {OFF_OPTIMUM}. To tune "
        f"each: sweep {LR_KEY} over 3 or more values beside the variants, with 4 or more seeds "
        "(experiment=loss_parity_tuned_cpu)"
    )
