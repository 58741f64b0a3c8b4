"""Speed: the interleaved step benchmark's verdict (``step_bench.json``) and the secondary ratio of
the runs' sequential step times with the checks that say whether they compare. Times in ms.

Why: docs/reports.md
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from normlab.report import plots
from normlab.report.paired import Report, common_seeds
from normlab.report.plots import axes, stamp
from normlab.report.runs import ReportError, Run, series_step_bench
from normlab.report.series import robust_limits
from normlab.report.stats import NAN, ratio_interval, sign_test
from normlab.report.text import ci_name, fmt, fmt_ci, method, table

#: The interleaved step benchmark's result, looked for in every source dir of a report.
BENCH_FILE = "step_bench.json"
#: The machine was quiet for a bench when its 1-minute load average stayed at most the bench's
#: threads plus LOAD_SLACK at both ends (the bench itself keeps its threads busy; the rest is
#: room for the OS and the shell).
LOAD_SLACK = 0.5
#: What the figures of sequential times (``step_time.png``, ``val_time.png``) carry when the
#: report finds those times not comparable (``not_comparable``).
NOT_COMPARABLE_MARK = "NOT COMPARABLE: step times fail the report's checks"
#: What a table cell of such a time carries beside it (``flag``).
NOT_COMPARABLE_FLAG = " (**not comparable**)"
#: Sequential step times are flagged as not comparable when, in any run of the comparison:
#: p90 / median of its post-warm-up step times > SPREAD_LIMIT (the machine was busy part of the
#: time), or the median of its second half differs from the median of its first half by more than
#: DRIFT_LIMIT (relative; the machine changed during the run); or when, within one variant, the
#: largest run median / the smallest > BETWEEN_LIMIT (the machine changed between runs of one
#: config). A run with fewer than MIN_STEPS measured steps is not checked, and says so.
SPREAD_LIMIT = 1.5
DRIFT_LIMIT = 0.20
BETWEEN_LIMIT = 1.5
MIN_STEPS = 4


# --- sequential step times: the checks and the ratio ---------------------------------------------


def timing_check(times_ms: list[float]) -> dict[str, Any]:
    """One run's step times (ms): ``median``, ``spread`` (p90/median), ``drift``, ``checked``,
    ``problems`` (text)."""
    t = np.asarray([x for x in times_ms if x is not None and np.isfinite(x)], float)
    out: dict[str, Any] = {"steps": int(t.size), "median": NAN, "spread": NAN, "drift": NAN}
    if t.size < MIN_STEPS:
        return {**out, "checked": False, "problems": []}
    half = t.size // 2
    med = float(np.median(t))
    out |= {
        "median": med,
        "spread": float(np.percentile(t, 90)) / med,
        "drift": float(np.median(t[half:]) / np.median(t[:half]) - 1),
    }
    problems = []
    if out["spread"] > SPREAD_LIMIT:
        problems.append(f"p90/median {out['spread']:.2f} > {SPREAD_LIMIT:g}")
    if abs(out["drift"]) > DRIFT_LIMIT:
        problems.append(
            f"median shift {out['drift']:+.0%} between halves (limit ±{DRIFT_LIMIT:.0%})"
        )
    return {**out, "checked": True, "problems": problems}


def between_runs_problem(medians_ms: list[float]) -> str | None:
    """The ``BETWEEN_LIMIT`` rule for the run medians (ms) of one variant, or None."""
    m = [x for x in medians_ms if np.isfinite(x) and x > 0]
    if len(m) < 2 or max(m) / min(m) <= BETWEEN_LIMIT:
        return None
    return f"run medians span {max(m) / min(m):.2f}x > {BETWEEN_LIMIT:g}x"


def timing(runs: list[Run]) -> dict[str, Any]:
    """The step-time checks (``timing_check``) of ``runs`` and the between-runs rule."""
    checks = {r.name: timing_check((r.summary or {}).get("step_times_ms") or []) for r in runs}
    between = between_runs_problem([r.summary_float("step_time_ms_median") for r in runs])
    return {"runs": checks, "between": between}


def sequential_ratio(
    rep: Report, base: dict[Any, Run], var: dict[Any, Run], label: str
) -> dict[str, Any]:
    """Per-seed ratio variant / baseline of median step times (``ratio_interval``) with
    ``comparable``, ``problems`` and ``unchecked`` runs."""
    seeds = common_seeds(base, var)
    key = "step_time_ms_median"
    ratios = {s: var[s].summary_float(key) / base[s].summary_float(key) for s in seeds}
    ratios = {s: x for s, x in ratios.items() if math.isfinite(x) and x > 0}
    problems = []
    for lab in (rep.baseline, label):
        t = rep.timing[lab]
        problems += [
            f"{name}: {'; '.join(c['problems'])}" for name, c in t["runs"].items() if c["problems"]
        ]
        problems += [f"`{lab}`: {t['between']}"] if t["between"] else []
    if len(ratios) >= 2 and max(ratios.values()) / min(ratios.values()) > BETWEEN_LIMIT:
        span = max(ratios.values()) / min(ratios.values())
        problems.append(f"per-seed ratios span {span:.2f}x > {BETWEEN_LIMIT:g}x")
    unchecked = [
        n
        for lab in (rep.baseline, label)
        for n, c in rep.timing[lab]["runs"].items()
        if not c["checked"]
    ]
    return {
        **ratio_interval(list(ratios.values()), rep.alpha),
        "seeds": list(ratios),
        "comparable": not problems,
        "problems": problems,
        "unchecked": unchecked,
    }


def not_comparable(rep: Report) -> list[str]:
    """The variants whose sequential step times fail the checks against the baseline's."""
    return [c["label"] for c in rep.comparisons if not c["ratio"]["comparable"]]


def flag(rep: Report, label: str) -> str:
    """``NOT_COMPARABLE_FLAG`` for a sequential time of ``label`` failing the checks, else ""."""
    bad = not_comparable(rep)
    return NOT_COMPARABLE_FLAG if label in bad or (bad and label == rep.baseline) else ""


def backend_differences(base: list[Run], var: list[Run]) -> list[str]:
    """Norm positions whose recorded backends differ, baseline vs variant (``"attn_in `aten` vs
    `quack`"``); empty when they agree or a side recorded none."""

    def backends(runs: list[Run]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for r in runs:
            for pos, k in ((r.summary or {}).get("kernels") or {}).items():
                out.setdefault(pos.split(" (")[0], set()).add(str((k or {}).get("backend")))
        return out

    b, v = backends(base), backends(var)
    return [
        f"{pos} `{'/'.join(sorted(b[pos]))}` vs `{'/'.join(sorted(v[pos]))}`"
        for pos in b
        if pos in v and b[pos] != v[pos]
    ]


# --- the interleaved step benchmark --------------------------------------------------------------


def interleaved(rep: Report) -> dict[str, Any] | None:
    """A source's step bench: ``path``, ``ratios``, ``raw``, ``load``; None when none has one.
    Raises ReportError: an unreadable bench."""
    found = load_step_bench(rep.sources)
    if found is None:
        return None
    ratios = {lab: bench_ratio(found[1], rep.baseline, lab, rep.alpha) for lab in rep.labels[1:]}
    return {"path": found[0], "ratios": ratios, "raw": found[1], "load": bench_load(found[1])}


def load_step_bench(sources: list[Path]) -> tuple[Path, dict[str, Any]] | None:
    """``(path, json)`` of the first ``step_bench.json`` of the sources, or None. Raises
    ReportError: not JSON or not a ``normlab-bench step`` result."""
    for src in sources:
        path, stored = Path(src) / BENCH_FILE, series_step_bench(Path(src))
        if stored is not None:
            path, bench = stored
        elif not path.is_file():
            continue
        else:
            try:
                bench = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ReportError(f"cannot read {path}: {e.msg} (line {e.lineno})") from None
        ok = isinstance(bench, dict) and bench.get("mode") == "step"
        ok = ok and all(isinstance(bench.get(k), dict) for k in ("a", "b", "ratio"))
        if not ok or not bench["ratio"].get("per_pair"):
            raise ReportError(
                f"cannot read {path}: not a `normlab-bench step` result (mode 'step' with a, b "
                "and ratio.per_pair)"
            )
        return path, bench
    return None


def _matches(setup: dict[str, Any], common: list[str], label: str) -> bool:
    """True when every override of the variant ``label`` is among the setup's overrides."""
    given = {*setup.get("overrides", []), *common}
    return set(label.split(",")) <= given


def bench_ratio(bench: dict[str, Any], baseline: str, label: str, alpha: float) -> dict | None:
    """Interleaved step-time ratio variant / baseline of ``bench``: ``median``, ``iqr``, interval,
    sign test, medians (ms), ``call``, ``verdict``; None when no setup matches."""
    common = bench.get("common", [])
    a, b = bench["a"], bench["b"]
    per = np.asarray(bench["ratio"]["per_pair"], float)
    if _matches(a, common, baseline) and _matches(b, common, label):
        base, var = a, b
    elif _matches(b, common, baseline) and _matches(a, common, label):
        base, var, per = b, a, 1 / per
    else:
        return None
    per = per[np.isfinite(per) & (per > 0)]
    p25, med, p75 = (float(v) for v in np.percentile(per, [25, 50, 75]))
    sign = sign_test(list(per))
    r = {
        **ratio_interval(list(per), alpha),
        "median": med,
        "iqr": (p25, p75),
        "below": sign["below"],
        "above": sign["above"],
        "sign_p": sign["p"],
        "pairs": int(per.size),
        "baseline_ms": base.get("median_ms"),
        "variant_ms": var.get("median_ms"),
        "device": bench.get("device"),
        "threads": bench.get("threads"),
    }
    return r | speed_verdict(r, alpha)


def speed_verdict(r: dict[str, Any], alpha: float) -> dict[str, Any]:
    """``call``: faster or slower when median, CI and sign test agree, else None; ``verdict``."""
    med, (lo, hi), p = r["median"], r["ci"], r["sign_p"]
    side = "faster" if med < 1 else "slower" if med > 1 else None
    ci = f"{r['gmean']:.3f} {fmt_ci(r['ci'], '.3f')}"
    counts = f"{r['below']} of {r['below'] + r['above']} untied pairs faster"
    why = []
    if side is None:
        why.append(f"the median ratio is {med:.3f}")
    elif math.isnan(lo):
        why.append("the geometric mean has no CI (fewer than 2 pairs)")
    elif lo <= 1 <= hi:
        why.append(f"the geometric mean's CI {ci} includes 1")
    elif (hi < 1) != (side == "faster"):
        why.append(f"the geometric mean's CI {ci} lies on the other side of 1 from the median")
    if not p < alpha:
        why.append(f"the sign test gives p = {p:.3g} >= {alpha:g} ({counts})")
    if why:
        return {"call": None, "verdict": "not shown faster or slower: " + "; ".join(why)}
    figures = f"median ratio {med:.3f}, geometric mean {ci}, sign test p = {p:.3g} ({counts})"
    return {"call": side, "verdict": f"{side}: {figures}"}


def bench_load(bench: dict[str, Any]) -> dict[str, Any] | None:
    """1-minute load at both ends of the bench, ``threads``, ``limit``, ``quiet``; or None."""
    ends = [bench.get(k) for k in ("loadavg_before", "loadavg_after")]
    ends = [e[0] if isinstance(e, list) and e else e for e in ends]
    if not all(isinstance(e, int | float) and math.isfinite(e) for e in ends):
        return None
    threads = bench.get("threads")
    limit = (threads if isinstance(threads, int) else 1) + LOAD_SLACK
    quiet = max(ends) <= limit
    return {"before": ends[0], "after": ends[1], "threads": threads, "limit": limit, "quiet": quiet}


# --- the sections and the figure -----------------------------------------------------------------


def _speed_row(lab: str, r: dict[str, Any] | None) -> list[Any]:
    if r is None:
        return [f"`{lab}`", "-", "not in the benchmark", "-", "-", "-", "-", "-"]
    return [
        f"`{lab}`",
        r["pairs"],
        fmt(r["median"], ".3f"),
        f"{fmt(r['iqr'][0], '.3f')}–{fmt(r['iqr'][1], '.3f')}",
        f"{fmt(r['gmean'], '.3f')} {fmt_ci(r['ci'], '.3f')}",
        fmt(r["baseline_ms"], ".1f"),
        fmt(r["variant_ms"], ".1f"),
        f"**{r['verdict']}**" if r["call"] else r["verdict"],
    ]


def _load_note(load: dict[str, Any] | None) -> str:
    """One sentence on the machine's load at both ends of the bench."""
    if load is None:
        return "Load not recorded (a bench written before `loadavg_before` / `loadavg_after`)."
    ends = f"1-minute load average {load['before']:.2f} before, {load['after']:.2f} after"
    if load["quiet"]:
        return f"The machine was quiet: {ends} (at most {load['limit']:g})."
    return (
        f"**The machine was not quiet:** {ends}, above the bench's {load['threads']} thread(s) + "
        f"{LOAD_SLACK:g}; the pairs share any slowdown, but time it again on a quiet machine."
    )


def render_speed(rep: Report) -> list[str]:
    """``## Speed verdict``: the bench's ratio and verdict per variant and the load, or how to."""
    if not rep.comparisons:
        return []
    out = ["", "## Speed verdict (interleaved step benchmark)", ""]
    if rep.bench is None:
        return out + [
            f"No `{BENCH_FILE}` in the sweep dir: the sequential step-time ratio below is the only "
            "speed figure. For a speed verdict: `normlab-bench step <common overrides> --a "
            f"<baseline overrides> --b <variant overrides> --json <sweep>/{BENCH_FILE}`. "
            + method("the-interleaved-step-benchmark")
        ]
    raw = rep.bench["raw"]
    rows = [_speed_row(lab, r) for lab, r in rep.bench["ratios"].items()]
    head = ["variant", "pairs", "median ratio", "IQR", f"geometric mean, {ci_name(rep.alpha)}"]
    head += [f"`{rep.baseline}` ms/step", "variant ms/step", "verdict"]
    return out + [
        f"From `{rep.bench['path']}` (`normlab-bench step`, {raw.get('device')}, "
        f"{raw.get('threads')} thread(s), {raw.get('warmup')} warm-up step(s) each, common "
        f"overrides `{' '.join(raw.get('common', [])) or '-'}`); ratio = variant / "
        f"`{rep.baseline}` step time per pair. **This is the speed verdict**; the sequential "
        "ratio of the sweep's own runs (next section) is secondary. "
        + method("the-interleaved-step-benchmark"),
        "",
        _load_note(rep.bench.get("load")),
        "",
        *table(head, rows),
        *backend_notes(rep),
    ]


def _comparable(ratio: dict[str, Any]) -> str:
    """The step-time ratio table's "comparable" cell."""
    if not ratio["comparable"]:
        return "**no**"
    if ratio["unchecked"]:
        return f"not checked ({len(ratio['unchecked'])} runs under {MIN_STEPS} measured steps)"
    return "yes"


def render_ratio(rep: Report) -> list[str]:
    """``## Step-time ratio``: the runs' sequential ratio per variant and the checks it failed."""
    if not rep.comparisons:
        return []
    conf = ci_name(rep.alpha)
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
        f"Geometric mean of the per-seed ratios with its {conf}; runs timed one after another "
        "compare only if the machine stayed the same. " + method("sequential-step-times"),
        "",
        *table(["variant", "n", "geometric mean ratio", conf, "comparable"], rows),
    ]
    for c in rep.comparisons:
        if c["ratio"]["problems"]:
            out += ["", f"`{c['label']}` vs `{rep.baseline}` not comparable:"]
            out += [f"- {p}" for p in c["ratio"]["problems"]]
    return out + backend_notes(rep)


def backend_notes(rep: Report) -> list[str]:
    """One line per variant whose runs recorded other norm backends than the baseline's."""
    return [
        line
        for c in rep.comparisons
        if c["backends"]
        for line in (
            "",
            f"`{c['label']}` vs `{rep.baseline}`: not the same design: backends differ: "
            + "; ".join(c["backends"])
            + " (the ratio times different kernels, not the norms' design alone).",
        )
    ]


def plot_step_times(
    times: dict[str, list[float]], path: Path, mark: str | None = None
) -> Path | None:
    """Box plot of step times (ms) per variant, y by ``robust_limits``, outliers as counted
    triangles, ``mark`` stamped; None without data."""
    times = {lab: [x for x in t if math.isfinite(x)] for lab, t in times.items()}
    times = {lab: t for lab, t in times.items() if t}
    if not times:
        return None
    lo, hi = robust_limits([x for t in times.values() for x in t])
    fig, ax = axes((max(6, 1.8 * len(times)), 5))
    ax.boxplot(list(times.values()), flierprops={"markersize": 2})
    ax.set_ylim(lo, hi)
    for i, t in enumerate(times.values(), start=1):
        for edge, n, marker in (
            (hi, sum(x > hi for x in t), "^"),
            (lo, sum(x < lo for x in t), "v"),
        ):
            if n:
                ax.plot([i], [edge], marker=marker, color="C3", ms=7, clip_on=False)
                ax.annotate(
                    f"{n} beyond",
                    (i, edge),
                    xytext=(8, -4),
                    textcoords="offset points",
                    fontsize="x-small",
                    color="C3",
                )
    ticks = [f"{lab}\n({len(t)} steps)" for lab, t in times.items()]
    ax.set_xticks(range(1, len(times) + 1), ticks, fontsize="small")
    ax.set(
        title="Step time per variant (post-warm-up steps, seeds pooled)\n"
        "y range set without outliers; triangles: steps beyond it",
        xlabel="variant",
        ylabel="step time (ms)",
    )
    ax.grid(axis="y", alpha=0.3)
    stamp(fig, ax, mark)
    return plots.save(fig, path)  # the one writer of figure files


def step_time_figure(rep: Report, out_dir: Path) -> dict[str, Path | None]:
    """``{"step_time": path or None}``: ``step_time.png`` of included runs, stamped if flagged."""
    times = {
        lab: [
            float(t)
            for r in rep.included(lab)
            for t in (r.summary or {}).get("step_times_ms") or []
            if t is not None
        ]
        for lab in rep.labels
    }
    mark = NOT_COMPARABLE_MARK if not_comparable(rep) else None
    return {"step_time": plot_step_times(times, out_dir / "step_time.png", mark)}
