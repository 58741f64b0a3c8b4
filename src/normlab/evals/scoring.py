"""Scoring: the log-likelihood of each choice's continuation given its context, with the run's
own model and tokenizer, and the accuracies and intervals that follow (lm-eval's rules).

``encode_pair`` splits tokens as lm-eval does; ``windows`` scores every continuation id within the
model's ``L`` positions; ``task_result`` gives ``acc`` (largest summed log-likelihood) and
``acc_norm`` (per character), exact ties counted ``1/t``, each with a Wilson 95% interval, or for
one-choice tasks (LAMBADA) bits per byte (OLMo's ``bpb_v2``) with a normal 95% interval. All under
``torch.inference_mode`` in ``eval()``; log-probabilities in fp32, summed in float64.

Why: docs/running.md
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from normlab.config import ConfigError
from normlab.evals.tasks import BPB_TASKS, Item

#: The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054
#: Scores within this relative distance of the best count as tied with it.
TIE_RTOL = 1e-9


@dataclass(frozen=True)
class Window:
    """One forward pass's row: ``ids`` (at most ``L + 1`` ids) feeds ``ids[:-1]`` and scores
    the last ``scored`` of the targets ``ids[1:]``; ``request``: the (item, choice) it adds to."""

    ids: tuple[int, ...]
    scored: int
    request: int


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """``(context ids, continuation ids)`` as lm-eval's ``_encode_pair``: trailing context spaces
    move to the continuation, whose ids are the whole's after the context's (the parts apart when a
    BPE merge crosses the boundary); an empty context is the document separator."""
    spaces = len(context) - len(context.rstrip(" "))
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = [int(i) for i in tokenizer.encode([context + continuation])[0]]
    if not context:
        return [int(i) for i in np.asarray(tokenizer.separator)], whole
    ctx = [int(i) for i in tokenizer.encode([context])[0]]
    if whole[: len(ctx)] != ctx:  # a merge across the boundary: each part on its own
        return ctx, [int(i) for i in tokenizer.encode([continuation])[0]]
    return ctx, whole[len(ctx) :]


def windows(context: list[int], continuation: list[int], length: int, request: int) -> list[Window]:
    """The windows scoring every id of ``continuation`` after ``context`` with ``length`` (L)
    positions: one, its context cut from the left, if it fits; else blocks of L // 2 ids, each
    after the L ids before its last. ConfigError for an empty continuation."""
    if not continuation:
        raise ConfigError(f"request {request} has an empty continuation: nothing to score")
    seq = context + continuation
    start, end = len(context), len(seq)
    block = end - start if end - start <= length else max(1, length // 2)
    out = []
    for a in range(start, end, block):
        b = min(a + block, end)
        out.append(Window(tuple(seq[max(0, b - 1 - length) : b]), b - a, request))
    return out


def build_windows(items: list[Item], tokenizer, length: int) -> tuple[list[Window], int]:
    """Every window of every choice of ``items`` (requests numbered item by item, choice by
    choice) and the number of choices whose continuation needed more than one window."""
    out, split, r = [], 0, 0
    for item in items:
        for context, continuation in zip(item.contexts, item.continuations, strict=True):
            ctx, cont = encode_pair(tokenizer, context, continuation)
            ws = windows(ctx, cont, length, r)
            split += len(ws) > 1
            out += ws
            r += 1
    return out, split


def score_windows(
    model, ws: list[Window], n_requests: int, device: torch.device, batch_size: int, autocast=None
) -> np.ndarray:
    """Summed log-likelihood (nats, float64, shape ``(n_requests,)``) of each request's scored
    ids: batches of ``batch_size`` windows, longest first, padded on the right (a causal model's
    scores of real positions do not see the padding). ``autocast``: None (fp32) or a callable that
    returns a fresh context manager for each forward, as ``Run.autocast`` does."""
    order = sorted(range(len(ws)), key=lambda i: -len(ws[i].ids))
    totals = np.zeros(n_requests, dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for lo in range(0, len(order), batch_size):
                batch = [ws[i] for i in order[lo : lo + batch_size]]
                for w, ll in zip(batch, _batch_loglik(model, batch, device, autocast), strict=True):
                    totals[w.request] += ll
    finally:
        model.train(was_training)
    return totals


def _batch_loglik(model, batch: list[Window], device: torch.device, autocast) -> list[float]:
    """Each window's summed log-probability of its scored targets (one forward pass)."""
    width = max(len(w.ids) for w in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    for row, w in enumerate(batch):
        ids[row, : len(w.ids)] = torch.tensor(w.ids)
    ids = ids.to(device)
    with autocast() if autocast is not None else contextlib.nullcontext():
        logits, _ = model(ids[:, :-1])  # (B, width - 1, V)
    logp = torch.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(-1, ids[:, 1:, None])[..., 0].double().cpu()  # (B, width - 1)
    return [
        float(picked[r, len(w.ids) - 1 - w.scored : len(w.ids) - 1].sum())
        for r, w in enumerate(batch)
    ]


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson (1927) score interval of ``successes / n`` (two-sided, ``z``); ValueError for
    ``n`` < 1 or ``successes`` outside [0, n]."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"Wilson interval needs 0 <= successes <= n and n >= 1: {successes}/{n}")
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def tie_credit(scores: np.ndarray, label: int) -> float:
    """1/t when the right choice is among the ``t`` best ``scores`` (ties within ``TIE_RTOL``),
    else 0: the expected accuracy of breaking ties at random."""
    best = scores.max()
    tied = np.abs(scores - best) <= TIE_RTOL * max(abs(best), 1e-300)
    return 1.0 / int(tied.sum()) if tied[label] else 0.0  # a float, never a numpy scalar


@dataclass(frozen=True)
class TaskResult:
    """One task's scores over ``n`` items (the first ``n`` of the file). Accuracy tasks fill
    ``acc``, ``acc_norm`` (fractions in [0, 1]) and their Wilson 95% ``*_ci``; ``chance`` is the
    mean of 1/choices. ``bpb`` tasks fill ``bpb`` (bits per byte, mean over items) and ``bpb_ci``.
    ``split``: choices whose continuation was longer than the model's context (several windows)."""

    task: str
    n: int
    chance: float | None
    acc: float | None = None
    acc_ci: tuple[float, float] | None = None
    acc_norm: float | None = None
    acc_norm_ci: tuple[float, float] | None = None
    bpb: float | None = None
    bpb_ci: tuple[float, float] | None = None
    split: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def task_result(task: str, items: list[Item], logliks: np.ndarray, split: int = 0) -> TaskResult:
    """The scores of ``items`` from their requests' log-likelihoods (nats, choice by choice in
    item order, as ``build_windows`` numbers them): ``acc``, ``acc_norm`` (per character, delimiter
    space not counted), or ``bpb``: the mean of -loglik / ln 2 / UTF-8 bytes of the continuation."""
    n = len(items)
    if task in BPB_TASKS:
        per = np.array(
            [
                -logliks[i] / math.log(2) / len(it.continuations[0].encode("utf-8"))
                for i, it in enumerate(items)
            ]
        )
        half = Z95 * per.std(ddof=1) / math.sqrt(n) if n > 1 else math.nan
        mean = float(per.mean())
        return TaskResult(task, n, None, bpb=mean, bpb_ci=(mean - half, mean + half), split=split)
    raw = norm = 0.0
    at = 0
    for it in items:
        k = len(it.choices)
        ll = logliks[at : at + k]
        raw += tie_credit(ll, it.label)
        norm += tie_credit(ll / np.array([max(1, len(c)) for c in it.choices]), it.label)
        at += k
    chance = float(np.mean([1 / len(it.choices) for it in items]))
    return TaskResult(
        task,
        n,
        chance,
        acc=raw / n,
        acc_ci=wilson_interval(raw, n),
        acc_norm=norm / n,
        acc_norm_ci=wilson_interval(norm, n),
        split=split,
    )
