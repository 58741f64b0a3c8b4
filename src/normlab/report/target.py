"""Time to a target loss: when each run first reaches it (training seconds, steps, tokens) and the
paired ratios variant / baseline; its section and ``val_time.png``.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from normlab.report.paired import Report, common_seeds
from normlab.report.plots import axes, finish, stamp, zoom_to_losses
from normlab.report.runs import Run
from normlab.report.speed import NOT_COMPARABLE_MARK, flag, not_comparable
from normlab.report.stats import NAN, describe, ratio_interval
from normlab.report.text import ci_name, fmt, fmt_ci, method, table

#: Cumulative training seconds (evaluations and checkpoints excluded), in ``metrics.jsonl``.
TIME_KEY = "perf/train_time_s"


def seconds_at(run: Run, step: float) -> float:
    """``perf/train_time_s`` of ``run`` at ``step``, else at the latest earlier row, else nan."""
    times = [
        (float(r["step"]), float(r[TIME_KEY]))
        for r in run.metrics
        if "step" in r and r.get(TIME_KEY) is not None and float(r["step"]) <= step
    ]
    return max(times)[1] if times else NAN


def first_reach(run: Run, target: float, key: str = "val/loss") -> dict[str, float] | None:
    """``{"step", "seconds", "tokens", "last"}`` of ``run``'s first evaluation at or below
    ``target``, or None."""
    rows = sorted((r for r in run.metrics if "step" in r and r.get(key) is not None), key=_step)
    k = run.tokens_per_step
    for row in rows:
        v = float(row[key])
        if math.isfinite(v) and v <= target:
            return {
                "step": float(row["step"]),
                "seconds": seconds_at(run, float(row["step"])),
                "tokens": float(row["step"] * k) if k else NAN,
                "last": row is rows[-1],
            }
    return None


def _step(row: dict[str, Any]) -> float:
    """A metrics row's step, for sorting."""
    return float(row["step"])


def default_target(included: dict[str, list[Run]]) -> float:
    """The highest final validation loss of any included run, so every run reaches it; or nan."""
    finals = [r.final_val_loss for runs in included.values() for r in runs]
    finals = [x for x in finals if math.isfinite(x)]
    return max(finals) if finals else NAN


def _ratios(base: dict[Any, dict], var: dict[Any, dict], what: str, alpha: float) -> dict:
    """``ratio_interval`` of ``what`` variant / baseline over seeds both reached, and ``seeds``."""
    seeds = common_seeds(base, var)
    pairs = {s: var[s][what] / base[s][what] for s in seeds if base[s][what] > 0}
    pairs = {s: x for s, x in pairs.items() if math.isfinite(x) and x > 0}
    return {**ratio_interval(list(pairs.values()), alpha), "seeds": list(pairs)}


def time_to_target(
    included: dict[str, list[Run]], baseline: str, target: float | None, alpha: float
) -> dict[str, Any]:
    """Per variant runs reaching ``target`` and ``describe`` of seconds, steps, tokens; paired
    ratios; ``only_last`` when every reach was at a last evaluation."""
    chosen = default_target(included) if target is None else float(target)
    reach = {
        lab: {r.seed: first_reach(r, chosen) for r in runs if r.seed is not None}
        for lab, runs in included.items()
    }
    got_all = [x for by_seed in reach.values() for x in by_seed.values() if x is not None]
    out: dict[str, Any] = {
        "target": chosen,
        "default": target is None,
        "only_last": bool(got_all) and all(x["last"] for x in got_all),
        "variants": {},
        "comparisons": {},
    }
    for lab, by_seed in reach.items():
        got = [x for x in by_seed.values() if x is not None]
        out["variants"][lab] = {
            "runs": len(by_seed),
            "reached": len(got),
            **{
                w: describe([x[w] for x in got if math.isfinite(x[w])])
                for w in ("seconds", "step", "tokens")
            },
        }
    base = {s: x for s, x in reach.get(baseline, {}).items() if x is not None}
    for lab, by_seed in reach.items():
        if lab == baseline:
            continue
        var = {s: x for s, x in by_seed.items() if x is not None}
        out["comparisons"][lab] = {
            w: _ratios(base, var, w, alpha) for w in ("seconds", "step", "tokens")
        }
    return out


def time_curves(runs: list[Run], key: str = "val/loss") -> list[tuple[np.ndarray, np.ndarray]]:
    """Per run ``(training seconds, key)`` float arrays of shape ``(k,)`` (empty: no seconds)."""
    out = []
    for r in runs:
        pts = [
            (seconds_at(r, float(row["step"])), float(row[key]))
            for row in sorted(r.metrics, key=lambda x: x.get("step", 0))
            if "step" in row and row.get(key) is not None
        ]
        pts = [p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1])]
        out.append((np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
    return out


# --- the section and the figure ------------------------------------------------------------------


def render_target(rep: Report) -> list[str]:
    """``## Time to target loss``: reach per variant and paired ratios, seconds flagged."""
    t = rep.target
    if not t or not rep.variants or t["target"] != t["target"]:
        return []
    how = "the highest final validation loss of any included run" if t["default"] else "--target"
    rows = [
        [
            f"`{lab}`",
            f"{v['reached']}/{v['runs']}",
            fmt(v["seconds"]["mean"], ".1f") + flag(rep, lab),
            fmt(v["step"]["mean"], ".0f"),
            fmt(v["tokens"]["mean"], ",.0f"),
        ]
        for lab, v in t["variants"].items()
    ]

    def cell(r: dict) -> str:
        return f"{fmt(r['gmean'], '.3f')} {fmt_ci(r['ci'], '.3f')} (n = {r['n']})"

    paired = [
        [f"`{lab}`", cell(c["seconds"]) + flag(rep, lab), cell(c["step"]), cell(c["tokens"])]
        for lab, c in t["comparisons"].items()
    ]
    out = [
        "",
        f"## Time to target loss ({fmt(t['target'])} nats/token)",
        "",
        f"Target: {how}. The first evaluation at or below it, in training seconds, optimizer "
        f"steps and tokens; ratios variant / baseline per seed with their {ci_name(rep.alpha)} "
        "(below 1: the variant gets there sooner). " + method("time-to-target"),
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


def plot_val_time(
    included: dict[str, list[Run]], target: float, path: Path, mark: str | None = None
) -> Path | None:
    """Validation loss against training seconds, a line per run, target dotted, ``mark`` stamped."""
    curves = {lab: [c for c in time_curves(runs) if len(c[0])] for lab, runs in included.items()}
    if not any(curves.values()):
        return None
    fig, ax = axes()
    for i, (lab, runs) in enumerate(curves.items()):
        for j, (t, v) in enumerate(runs):
            name = f"{lab} ({len(runs)} runs)" if j == 0 else None
            ax.plot(t, v, color=f"C{i % 10}", lw=1, marker="o", ms=2, alpha=0.8, label=name)
    zoom_to_losses(ax, [c for runs in curves.values() for c in runs])
    if math.isfinite(target):
        ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.4f}")
    title = "Validation loss vs training time (each run; evaluations excluded from the time)"
    stamp(fig, ax, mark)
    return finish(fig, ax, path, title, "training seconds", "validation loss (nats/token)")


#: The figure of this section, as the Figures section shows it: key -> (title, caption).
FIGURE = {
    "val_time": (
        "Validation loss vs training seconds",
        "Validation loss vs training seconds (`perf/train_time_s`): one line per run, the "
        "target loss dotted.",
    )
}


def target_figure(rep: Report, out_dir: Path) -> dict[str, Path | None]:
    """``val_time.png`` of ``rep``'s included runs into ``out_dir``, stamped when flagged."""
    included = {lab: rep.included(lab) for lab in rep.labels}
    mark = NOT_COMPARABLE_MARK if not_comparable(rep) else None
    path = out_dir / "val_time.png"
    return {"val_time": plot_val_time(included, rep.target.get("target", NAN), path, mark)}
