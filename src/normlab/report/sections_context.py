"""Sections of ``report.md`` that qualify the verdict: the context (model, tokens, schedule,
device, evaluation size, per-seed values, train/validation gap, what the margin is worth), bits
per byte, and one section per held-out corpus. Each returns Markdown lines ([] when it has nothing
to say). Losses in nats/token, bpb in bits/byte.
"""

from __future__ import annotations

import math
from typing import Any

from normlab.report.compare import Report
from normlab.report.context import GAP_ROWS
from normlab.report.text import figure_lines, fmt, fmt_ci, table


def _joined(values: list[str], unset: str = "not recorded") -> str:
    """The distinct values as code, joined by `` / ``; ``unset`` when none is set (a null key,
    or a key that older runs did not record)."""
    shown = [v for v in values if v not in ("None", "")]
    return " / ".join(f"`{v}`" for v in shown) if shown else unset


def _params(c: dict[str, Any]) -> str:
    """``N parameters`` when every variant has N; else each variant's count (no median of two
    counts that no run has)."""
    by = c.get("params_by") or {}
    if len({v for v in by.values() if math.isfinite(v)}) <= 1:
        return f"{fmt(c['params'], ',.0f')} parameters"
    return "parameters: " + ", ".join(f"{fmt(v, ',.0f')} (`{lab}`)" for lab, v in by.items())


def _worth(rep: Report) -> str:
    w = rep.context["worth"]
    m = rep.margin
    if not math.isfinite(w["final"]):
        return (
            f"- The margin ±{m:g} nats: no validation curve of `{rep.baseline}` to measure it on."
        )
    where = (
        f"the baseline's mean validation curve was {m:g} nats above its final value "
        f"({fmt(w['final'])}) last at about step {fmt(w['step'], ',.0f')}, so the margin is worth "
        f"about {fmt(w['steps'], ',.0f')} of its last training steps "
        f"({fmt(w['steps'] / w['last_step'], '.0%')} of the run)"
        if math.isfinite(w["step"])
        else f"the baseline's mean validation curve never was {m:g} nats above its final value "
        f"({fmt(w['final'])}) at an evaluation after its first, so the margin is worth more than "
        "the whole run: it is loose"
    )
    return f"- What ±{m:g} nats means in compute: {where} (linear between evaluations)."


def _budget_note(stopped_by: dict[str, list[str]]) -> str:
    every = {v for vals in stopped_by.values() for v in vals}
    if every == {"max_time_s"}:
        return " (every run: the final losses compare at equal training time, not equal steps)"
    return ""


def render_context(rep: Report) -> list[str]:
    """``## Context``: the setting the verdict holds in."""
    c = rep.context
    if not c:
        return []
    st = c["setting"]
    eval_data = ", ".join(f"`{n}`" for n in rep.heldout.get("heldout", {})) or "none"
    lines = [
        "",
        "## Context",
        "",
        f"- Model: {_joined(st['model.name'])} ({_joined(st['model.n_layer'])} layers, d_model "
        f"{_joined(st['model.d_model'])}, {_joined(st['model.n_head'])} heads, context "
        f"{_joined(st['model.context_length'])}); {_params(c)}",
        f"- Data: {_joined(st['data.name'])}, tokenizer {_joined(st['data.tokenizer'])}, batch "
        f"{_joined(st['data.batch_size'])}; tokens seen {fmt(c['tokens_seen'], ',.0f')} per run "
        f"(median), {fmt(c['epochs'], '.3g')} epochs of the training split",
        f"- Schedule: peak lr {_joined(st['optim.lr'])}, min lr {_joined(st['optim.min_lr'])}, "
        f"warm-up {_joined(st['optim.warmup_steps'])} steps, cosine decay "
        f"{_joined(st['optim.decay'])}, weight decay {_joined(st['optim.weight_decay'])}; "
        f"max_steps {_joined(st['max_steps'])}, "
        f"max_time_s {_joined(st['max_time_s'], 'none (no time budget)')}",
        "- Stopped by: "
        + "; ".join(f"`{lab}`: {_joined(v)}" for lab, v in c["stopped_by"].items())
        + _budget_note(c["stopped_by"]),
        f"- Precision {_joined(st['precision.dtype'])}, norm implementation "
        f"{_joined(st['norm.impl'])}, compile {_joined(st['compile'])}",
        f"- Device {_joined(st['device'])} ({_joined(st['device model'])}), torch "
        f"{_joined(st['torch'])}, threads {_joined(st['threads'])}",
        f"- Evaluation: {fmt(c['eval_tokens'], ',.0f')} validation tokens scored per evaluation "
        f"(eval_batches × batch_size × context_length); held-out corpora: {eval_data}",
        _worth(rep),
        "",
        f"Train/validation gap: final validation loss − mean of the last {GAP_ROWS} logged "
        "training losses (median over runs, nats/token); per-seed final validation losses:",
        "",
    ]
    labels = list(c["per_seed"])
    seeds = sorted({s for v in c["per_seed"].values() for s in v}, key=str)
    rows = [[s, *(fmt(c["per_seed"][lab].get(s)) for lab in labels)] for s in seeds]
    rows.append(["gap", *(fmt(c["gap"][lab], "+.4f") for lab in labels)])
    return lines + table(["seed", *(f"`{lab}`" for lab in labels)], rows)


def _comparison_rows(comp: dict[str, Any], spec: str = "+.4f") -> list[list[Any]]:
    return [
        [f"`{lab}`", c["n"], fmt(c["mean"], spec), fmt_ci(c["ci"], spec), c["verdict"]]
        for lab, c in comp["comparisons"].items()
    ]


def _variant_rows(comp: dict[str, Any]) -> list[list[Any]]:
    return [
        [f"`{lab}`", v["n"], fmt(v["mean"]), fmt(v["std"])] for lab, v in comp["variants"].items()
    ]


def render_bpb(rep: Report) -> list[str]:
    """``## Bits per byte``: final validation bpb per variant and the paired verdict in bpb;
    nothing when no run has ``val/bpb``."""
    h = rep.heldout
    b = h.get("bpb")
    if not b:
        return []
    conf = f"{100 * (1 - rep.alpha):g}% CI"
    lead = (
        "**The variants use different tokenizers: this is the verdict to read** (nats/token "
        "count different tokens). "
        if h["tokenizer_differs"]
        else ""
    )
    return [
        "",
        "## Bits per byte (validation split)",
        "",
        f"{lead}bpb = loss / ln 2 / (UTF-8 bytes per token of the split): independent of the "
        f"tokenizer. The margin ±{rep.margin:g} nats is ±{fmt(b['margin'], '.4g')} bits/byte on "
        f"the baseline's tokens. Paired by seed, variant − `{rep.baseline}`, TOST as above.",
        "",
        *table(["variant", "n", "mean bpb", "std"], _variant_rows(b)),
        "",
        *table(["variant", "n", "mean diff (bits/byte)", conf, "verdict"], _comparison_rows(b)),
    ]


def render_heldout(rep: Report) -> list[str]:
    """One ``## Held-out corpus`` section per ``val/<name>``: final loss and bpb per variant,
    the paired differences with their CI and verdicts."""
    out: list[str] = []
    conf = f"{100 * (1 - rep.alpha):g}% CI"
    for name, h in rep.heldout.get("heldout", {}).items():
        loss, bpb = h["loss"], h["bpb"]
        rows = [
            [*row, fmt(bpb["variants"][row[0].strip("`")]["mean"]) if bpb else "n/a"]
            for row in _variant_rows(loss)
        ]
        out += [
            "",
            f"## Held-out corpus `{name}` (`val/{name}/loss`, `val/{name}/bpb`)",
            "",
            "Evaluated on the same fixed batches at every evaluation, never trained on. Final "
            "values; paired by seed, variant − baseline, margin as for the validation split.",
            "",
            *table(["variant", "n", "mean loss", "std", "mean bpb"], rows),
            "",
            *table(["variant", "n", "loss diff", conf, "verdict"], _comparison_rows(loss)),
        ]
        if bpb:
            out += [
                "",
                *table(["variant", "n", "bpb diff", conf, "verdict"], _comparison_rows(bpb)),
            ]
        title = f"Held-out corpus {name}: validation loss vs step"
        out += ["", *figure_lines(rep.figures, {f"val_{name}": title})]
    return out
