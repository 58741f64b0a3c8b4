"""The context a verdict holds in (model, data, schedule, precision, device, evaluation size, why
the runs stopped, train/validation gap, per-seed losses) and the far-from-convergence caveat.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.paired import Report
from normlab.report.runs import Run
from normlab.report.series import series
from normlab.report.stats import NAN, compute_for_nats, finite_median
from normlab.report.text import fmt, method, table

#: The train/validation gap uses the mean of the last GAP_ROWS logged training losses.
GAP_ROWS = 10
#: A verdict rests on runs far from convergence (``short_run_caveat``) when the baseline's loss
#: still falls by more than the margin over the last STILL_FALLING of its steps.
STILL_FALLING = 0.1


def _values(runs: list[Run], key: str) -> list[str]:
    """The distinct resolved values of ``key`` over ``runs``, as text, in first-seen order."""
    return list(dict.fromkeys(str(r.resolved(key)) for r in runs))


def steps_done(run: Run) -> int | None:
    """Optimizer steps the run completed: ``steps_done``, else ``steps_completed``."""
    s = run.summary or {}
    v = s.get("steps_done", s.get("steps_completed"))
    return int(v) if isinstance(v, (int, float)) else None


def tokens_seen(run: Run) -> float:
    """Training tokens consumed: steps done × tokens per step (nan when either is unknown)."""
    n, k = steps_done(run), run.tokens_per_step
    return float(n * k) if n is not None and k else NAN


def epochs(run: Run) -> float:
    """Tokens seen / tokens of the training split (``summary.json`` ``data.tokens.train``)."""
    tokens = ((run.summary or {}).get("data") or {}).get("tokens") or {}
    train = tokens.get("train") if isinstance(tokens, dict) else None
    return tokens_seen(run) / train if isinstance(train, (int, float)) and train > 0 else NAN


def train_val_gap(run: Run) -> float:
    """Final val loss − mean of the last ``GAP_ROWS`` training losses (nats/token), or nan."""
    _, train = series(run.metrics, "train/loss")
    if not len(train) or not math.isfinite(run.final_val_loss):
        return NAN
    return run.final_val_loss - float(np.mean(train[-GAP_ROWS:]))


def build_context(included: dict[str, list[Run]]) -> dict[str, Any]:
    """The context's facts over included runs: ``setting``, medians, and per label ``params_by``,
    ``gap``, ``per_seed``, ``stopped_by``."""
    runs = [r for rs in included.values() for r in rs]
    keys = (
        "model.name",
        "model.n_layer",
        "model.d_model",
        "model.n_head",
        "model.context_length",
        "data.name",
        "data.tokenizer",
        "data.batch_size",
        "optim.lr",
        "optim.min_lr",
        "optim.warmup_steps",
        "optim.decay",
        "optim.schedule",
        "optim.decay_fraction",
        "optim.decay_shape",
        "optim.anneal_at",
        "optim.weight_decay",
        "optim.norm_weight_decay",
        "max_steps",
        "max_time_s",
        "precision.dtype",
        "norm.impl",
        "compile",
    )
    setting = {k: _values(runs, k) for k in keys}
    versions = [(r.summary or {}).get("versions") or {} for r in runs]
    devices = [str((r.summary or {}).get("device")) for r in runs]
    setting["device"] = list(dict.fromkeys(devices))
    models = (  # the GPU's name on CUDA; on a CPU its model name (``cpu_model``, when recorded)
        v.get("device") if d.startswith("cuda") else v.get("cpu_model") or v.get("device")
        for v, d in zip(versions, devices, strict=True)
    )
    setting["device model"] = list(dict.fromkeys(map(str, models)))
    setting["torch"] = list(dict.fromkeys(str(v.get("torch")) for v in versions))
    threads = [((r.summary or {}).get("run_options") or {}).get("threads") for r in runs]
    setting["threads"] = list(dict.fromkeys(map(str, threads)))
    eval_tokens = []
    for r in runs:
        vals = [r.resolved(k) for k in ("eval_batches", "data.batch_size", "model.context_length")]
        eval_tokens.append(math.prod(vals) if all(isinstance(v, int) for v in vals) else NAN)
    return {
        "setting": setting,
        "params": finite_median([(r.summary or {}).get("params") or NAN for r in runs]),
        "params_by": {
            lab: finite_median([(r.summary or {}).get("params") or NAN for r in rs])
            for lab, rs in included.items()
        },
        "tokens_seen": finite_median([tokens_seen(r) for r in runs]),
        "epochs": finite_median([epochs(r) for r in runs]),
        "eval_tokens": finite_median(eval_tokens),
        "gap": {lab: finite_median([train_val_gap(r) for r in rs]) for lab, rs in included.items()},
        "per_seed": {lab: {r.seed: r.final_val_loss for r in rs} for lab, rs in included.items()},
        "stopped_by": {
            lab: sorted({str((r.summary or {}).get("stopped_by")) for r in rs})
            for lab, rs in included.items()
        },
    }


def short_run_caveat(margin: float, slope: float, source: str) -> str | None:
    """The caveat when, at ``slope``, the loss still falls by over ``margin`` in the last
    ``STILL_FALLING`` of steps; else None."""
    fall = slope * math.log(1 / (1 - STILL_FALLING)) if math.isfinite(slope) else NAN
    if not fall > margin:
        return None
    which = "annealed" if source == "annealed" else "end"
    return (
        f"the verdict is for this budget: at the baseline's {which} slope ({slope:.3g} nats per "
        f"e-fold of steps) {STILL_FALLING:.0%} more steps would lower its loss by about "
        f"{fall:.3g} nats, {fall / margin:.3g} times the margin (±{margin:.4g} nats, worth "
        f"{compute_for_nats(margin, slope):.2%} of effective compute). A difference, or an "
        "equivalence, this small against the curve's fall need not hold at a longer budget, "
        "whatever the power: read it at these steps, or train longer (max_steps)"
    )


def budget_warning(included: dict[str, list[Run]]) -> str | None:
    """The warning when some runs stopped on ``max_time_s`` and others did not; else None."""
    stops = {str((r.summary or {}).get("stopped_by")) for runs in included.values() for r in runs}
    if "max_time_s" not in stops or len(stops) < 2:
        return None
    return (
        "some runs were stopped by the time budget (max_time_s), others were not ("
        + ", ".join(sorted(stops))
        + "): their final losses compare at neither equal steps nor equal training time"
    )


# --- the section ---------------------------------------------------------------------------------


def _joined(values: list[str], unset: str = "not recorded") -> str:
    """The distinct values as code, joined by `` / ``; ``unset`` when none is set."""
    shown = [v for v in values if v not in ("None", "")]
    return " / ".join(f"`{v}`" for v in shown) if shown else unset


def _schedule_text(st: dict[str, list[str]]) -> str:
    """The lr schedule after warm-up (``cosine`` when unrecorded, or ``wsd`` with its decay)."""
    kinds = [v for v in st["optim.schedule"] if v not in ("None", "")] or ["cosine"]
    text = f"schedule {' / '.join(f'`{k}`' for k in kinds)}"
    if "wsd" in kinds:
        text += (
            f" (decay over the last {_joined(st['optim.decay_fraction'])} of each budget, shape "
            f"{_joined(st['optim.decay_shape'])}; cool-down branches at "
            f"{_joined(st['optim.anneal_at'], 'none')} of the run)"
        )
    return f"{text}, decay {_joined(st['optim.decay'])}"


def _params(c: dict[str, Any]) -> str:
    """``N parameters`` when every variant has N, else each variant's count."""
    by = c.get("params_by") or {}
    if len({v for v in by.values() if math.isfinite(v)}) <= 1:
        return f"{fmt(c['params'], ',.0f')} parameters"
    return "parameters: " + ", ".join(f"{fmt(v, ',.0f')} (`{lab}`)" for lab, v in by.items())


def _budget_note(stopped_by: dict[str, list[str]]) -> str:
    """What "stopped by" means when every run was stopped by the time budget."""
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
        f"warm-up {_joined(st['optim.warmup_steps'])} steps, {_schedule_text(st)}, "
        f"weight decay {_joined(st['optim.weight_decay'])} "
        f"(norm gains: {_joined(st['optim.norm_weight_decay'], '`none`')}); "
        f"max_steps {_joined(st['max_steps'])}, "
        f"max_time_s {_joined(st['max_time_s'], 'none (no time budget)')}",
        "- Stopped by: "
        + "; ".join(f"`{lab}`: {_joined(v)}" for lab, v in c["stopped_by"].items())
        + _budget_note(c["stopped_by"]),
        f"- Precision {_joined(st['precision.dtype'])}, norm implementation "
        f"{_joined(st['norm.impl'])}, compile {_joined(st['compile'])}",
        f"- Device {_joined(st['device'])} ({_joined(st['device model'])}), torch "
        f"{_joined(st['torch'])}, threads {_joined(st['threads'])}",
        f"- Evaluation: {fmt(c['eval_tokens'], ',.0f')} validation tokens scored per evaluation; "
        f"held-out corpora: {eval_data}",
        "",
        f"Per-seed final validation losses (nats/token); gap: final validation loss − mean of "
        f"the last {GAP_ROWS} training losses, median over runs. " + method("context"),
        "",
    ]
    labels = list(c["per_seed"])
    seeds = sorted({s for v in c["per_seed"].values() for s in v}, key=str)
    rows = [[s, *(fmt(c["per_seed"][lab].get(s)) for lab in labels)] for s in seeds]
    rows.append(["gap", *(fmt(c["gap"][lab], "+.4f") for lab in labels)])
    return lines + table(["seed", *(f"`{lab}`" for lab in labels)], rows)
