"""Sections of ``report.md`` on fair comparisons: the speed verdict from the interleaved step
benchmark, the time to a target loss, and the tuned comparison (each variant at its own best
learning rate). Each returns Markdown lines ([] when it has nothing to say). Losses in
nats/token, times in seconds or ms as named.
"""

from __future__ import annotations

from normlab.report.compare import Report
from normlab.report.speed import BENCH_FILE
from normlab.report.text import fmt, fmt_ci, table


def _conf(rep: Report) -> str:
    return f"{100 * (1 - rep.alpha):g}% CI"


def render_speed(rep: Report) -> list[str]:
    """``## Speed verdict``: the interleaved benchmark's ratio per variant, or where to get one."""
    if not rep.comparisons:
        return []
    out = ["", "## Speed verdict (interleaved step benchmark)", ""]
    if rep.bench is None:
        return out + [
            f"No `{BENCH_FILE}` in the sweep dir: the sequential step-time ratio below is the only "
            "speed figure, and sequential jobs see whatever else the machine did. For a speed "
            "verdict time the variants interleaved in one process: `normlab-bench step <common "
            "overrides> --a <baseline overrides> --b <variant overrides> --json "
            f"<sweep>/{BENCH_FILE}` (scripts/loss_parity_cpu.sh does)."
        ]
    raw = rep.bench["raw"]
    rows = []
    for lab, r in rep.bench["ratios"].items():
        if r is None:
            rows.append([f"`{lab}`", "-", "not in the benchmark", "-", "-", "-", "-"])
            continue
        rows.append(
            [
                f"`{lab}`",
                r["pairs"],
                fmt(r["median"], ".3f"),
                f"{fmt(r['iqr'][0], '.3f')}–{fmt(r['iqr'][1], '.3f')}",
                f"{fmt(r['gmean'], '.3f')} {fmt_ci(r['ci'], '.3f')}",
                fmt(r["baseline_ms"], ".1f"),
                fmt(r["variant_ms"], ".1f"),
            ]
        )
    head = ["variant", "pairs", "median ratio", "IQR", f"geometric mean, {_conf(rep)}"]
    head += [f"`{rep.baseline}` ms/step", "variant ms/step"]
    return out + [
        f"From `{rep.bench['path']}` (`normlab-bench step`, {raw.get('device')}, "
        f"{raw.get('threads')} thread(s), {raw.get('warmup')} warm-up step(s) each, common "
        f"overrides `{' '.join(raw.get('common', [])) or '-'}`): both setups in one process, "
        "optimizer steps timed in pairs A B, B A, ..., so a change of machine speed slows both "
        "alike. Ratio = "
        f"variant / `{rep.baseline}` step time per pair; the CI is Student t on the log-ratios "
        "of the pairs. **This is the speed verdict**; the sequential ratio of the sweep's own "
        "runs (next section) is secondary.",
        "",
        *table(head, rows),
    ]


def render_target(rep: Report) -> list[str]:
    """``## Time to target loss``: reach per variant and the paired ratios."""
    t = rep.target
    if not t or not rep.variants or t["target"] != t["target"]:
        return []
    how = (
        "the highest final validation loss of any included run (the worst variant's worst seed), "
        "so every run reaches it"
        if t["default"]
        else "set by --target"
    )
    rows = [
        [
            f"`{lab}`",
            f"{v['reached']}/{v['runs']}",
            fmt(v["seconds"]["mean"], ".1f"),
            fmt(v["step"]["mean"], ".0f"),
            fmt(v["tokens"]["mean"], ",.0f"),
        ]
        for lab, v in t["variants"].items()
    ]
    conf = _conf(rep)

    def cell(r: dict) -> str:
        return f"{fmt(r['gmean'], '.3f')} {fmt_ci(r['ci'], '.3f')} (n = {r['n']})"

    paired = [
        [f"`{lab}`", cell(c["seconds"]), cell(c["step"]), cell(c["tokens"])]
        for lab, c in t["comparisons"].items()
    ]
    out = [
        "",
        f"## Time to target loss ({fmt(t['target'])} nats/token)",
        "",
        f"Target: {how}. Time to target = the first evaluation at or below it, in training "
        "seconds (`perf/train_time_s`: training wall time without evaluations and checkpoints; "
        "n/a for runs that do not record it), optimizer steps and tokens. Ratios are variant / "
        f"baseline per seed (geometric mean, {conf} on logs), over the seeds where both reached "
        "it; below 1: the variant gets there sooner. Seconds come from sequential jobs: read them "
        "with the step-time checks above.",
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


def render_tuned(rep: Report) -> list[str]:
    """``## Tuned comparison``: final loss per learning rate and variant, the best of each, and
    the paired difference at each common learning rate."""
    t = rep.tuned
    if not t:
        return []
    labels = list(t["points"])
    conf = _conf(rep)

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
        f"Mean final validation loss (nats/token) with its {conf} over seeds, per learning rate; "
        "bold: the variant's best (lowest mean). The verdict, the paired table and every section "
        f"above compare each variant at its own best learning rate: {best}. The last columns: "
        "the paired difference at each common learning rate, for reference.",
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
