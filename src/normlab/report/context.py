"""The context of a verdict, so a reader can judge whether its margin is loose or tight: model and
parameters, tokens seen and epochs of the corpus, learning rate and schedule, precision, device,
evaluation size, the train/validation gap, and the margin in compute-equivalent steps of the
baseline's own validation curve.

Pure functions of :class:`~normlab.report.runs.Run` objects. Losses in nats/token.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.report.runs import NAN, Run
from normlab.report.series import aggregate, series

#: The train/validation gap uses the mean of the last GAP_ROWS logged training losses.
GAP_ROWS = 10


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
    """Final validation loss − the mean of the last :data:`GAP_ROWS` logged training losses
    (nats/token; nan without either). Positive: the model does better on what it trained on."""
    _, train = series(run.metrics, "train/loss")
    if not len(train) or not math.isfinite(run.final_val_loss):
        return NAN
    return run.final_val_loss - float(np.mean(train[-GAP_ROWS:]))


def steps_worth(steps: np.ndarray, mean: np.ndarray, margin: float) -> dict[str, float]:
    """What ``margin`` (nats/token) is worth on a validation curve (``steps``, ``mean``: shape
    ``(k,)``, by step): the step at which the curve was last ``margin`` above its final value,
    linearly interpolated between evaluations, and ``steps`` = final step − that step (the
    training the margin amounts to at the end). ``step`` nan when the curve never was that high
    (the margin is worth more than the whole run) or has fewer than 2 points."""
    out = {"final": NAN, "level": NAN, "step": NAN, "steps": NAN, "last_step": NAN}
    if len(steps) < 2:
        return out
    final = float(mean[-1])
    level = final + margin
    out |= {"final": final, "level": level, "last_step": float(steps[-1])}
    above = np.nonzero(mean[:-1] >= level)[0]
    if not above.size:
        return out
    i = int(above[-1])  # mean[i] >= level > mean[j] for every j > i
    s0, s1, y0, y1 = steps[i], steps[i + 1], mean[i], mean[i + 1]
    at = float(s0 + (y0 - level) / (y0 - y1) * (s1 - s0)) if y0 != y1 else float(s0)
    return {**out, "step": at, "steps": float(steps[-1]) - at}


def _median(values: list[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(np.median(v)) if v else NAN


def build_context(included: dict[str, list[Run]], baseline: str, margin: float) -> dict[str, Any]:
    """The context section's facts: ``setting`` (key -> values over the runs, as text),
    ``params``, ``tokens_seen``, ``epochs`` (medians over runs), ``params_by`` (label -> median
    parameter count: RMSNorm has no bias, so kinds differ), ``eval_tokens`` (tokens scored
    per evaluation: eval_batches × batch_size × context_length), ``gap`` per label (median
    :func:`train_val_gap`), ``per_seed`` (label -> seed -> final loss), ``worth``
    (:func:`steps_worth` of the baseline's mean validation curve) and ``stopped_by`` (label ->
    the runs' ``stopped_by`` values)."""
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
        "optim.weight_decay",
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
    models = (  # the GPU's name on CUDA; on a CPU its model name (cpu_model: runs since 2026-12)
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
    base = included.get(baseline, [])
    steps, mean, _, _ = aggregate([series(r.metrics, "val/loss") for r in base])
    return {
        "setting": setting,
        "params": _median([(r.summary or {}).get("params") or NAN for r in runs]),
        "params_by": {
            lab: _median([(r.summary or {}).get("params") or NAN for r in rs])
            for lab, rs in included.items()
        },
        "tokens_seen": _median([tokens_seen(r) for r in runs]),
        "epochs": _median([epochs(r) for r in runs]),
        "eval_tokens": _median(eval_tokens),
        "gap": {lab: _median([train_val_gap(r) for r in rs]) for lab, rs in included.items()},
        "per_seed": {lab: {r.seed: r.final_val_loss for r in rs} for lab, rs in included.items()},
        "worth": steps_worth(steps, mean, margin),
        "stopped_by": {
            lab: sorted({str((r.summary or {}).get("stopped_by")) for r in rs})
            for lab, rs in included.items()
        },
    }
