"""Every evaluation of a run: the validation split and the held-out corpora (``eval_data``), in
nats per token and bits per byte, and the text samples of ``sample_interval``.

:func:`eval_row` scores the model on the fixed validation batches of the training corpus and of
each held-out corpus (the same ``eval_batches``, batch size and context; batch ``i`` is the same
windows for every run, seed and variant) and returns the metric keys of one evaluation:
``val/loss``, ``val/bpb`` and ``val/<name>/loss``, ``val/<name>/bpb`` per held-out corpus. Bits
per byte are ``loss / ln 2 / bytes_per_token`` of the split scored
(:meth:`~normlab.data.tokens.TokenData.bits_per_byte`), so runs with different tokenizers compare.

Evaluation draws no random number (``eval()`` turns dropout off; the batches come from their own
generator), so it changes no number a run trains with: ``eval_data`` and the step-0 evaluation
leave every training loss as it was, and ``eval_data`` is not in the resume config hash.

:func:`training_sample` writes a sample with the run's own model and tokenizer, by the generation
code of ``normlab-sample`` (:func:`normlab.training.sample.generate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normlab.config import DataConfig, TrainConfig
from normlab.data.corpus import DataError
from normlab.data.eval_sets import prepare_eval
from normlab.data.tokens import BatchSampler, TokenData
from normlab.training import distributed
from normlab.training.metrics import NAMES, eval_keys
from normlab.training.sample import SampleOptions, sample_ids

log = logging.getLogger(__name__)

#: Tokens of the validation split's start that every training sample continues.
SAMPLE_PROMPT_TOKENS = 16


@dataclass
class EvalSet:
    """One held-out corpus: its name (``eval_data``), its token shards and fixed batches."""

    name: str
    data: TokenData
    sampler: BatchSampler


def build_eval_sets(
    cfg: TrainConfig, configs: dict[str, DataConfig], train_dir: Path, device: torch.device
) -> list[EvalSet]:
    """Prepare (or find cached) each held-out corpus of ``configs`` (tokenized like the training
    corpus in ``train_dir``) and its batch sampler.

    Raises:
        DataError: a corpus cannot be prepared, or its validation split is shorter than one
            sequence (the message names the corpus).
    """
    out = []
    for name, data_cfg in configs.items():
        data = prepare_eval(name, data_cfg, train_dir)
        try:
            sampler = BatchSampler(
                data, cfg.data.batch_size, cfg.model.context_length, cfg.order_seed, device
            )
        except DataError as e:
            raise DataError(f"eval_data: {name}: {e}") from None
        out.append(EvalSet(name, data, sampler))
    return out


@torch.no_grad()
def evaluate(model: Callable, sampler: BatchSampler, n_batches: int, ctx_factory) -> float:
    """Mean cross-entropy (nats/token) over the fixed validation batches ``0..n_batches-1``.

    With several processes each evaluates its share (batches rank, rank + N, ...); the losses are
    gathered and averaged in batch order, as one process does. One host sync per call.
    """
    model.eval()
    mine = distributed.shard(n_batches)
    losses = []
    for i in mine:
        x, y = sampler.val_batch(i)
        with ctx_factory():
            _, loss = model(x, y)
        losses.append(loss.detach().float())
    model.train()
    values = torch.stack(losses).tolist() if losses else []
    parts = distributed.all_gather(dict(zip(mine, values, strict=True)))
    found = {i: v for part in parts for i, v in part.items()}
    return float(np.mean([found[i] for i in range(n_batches)]))


def eval_row(run) -> dict[str, float | None]:
    """One evaluation of ``run`` (a :class:`~normlab.training.setup.Run`): ``{metric key: value}``.

    ``val/bpb`` (and a corpus's ``bpb``) is None for shards prepared before bytes were recorded.
    One host sync per corpus (:func:`evaluate`). With ``eval_tasks`` the downstream tasks add
    ``downstream/<task>/acc`` and ``acc_norm`` (fractions; ``bpb`` for lambada), the keys of
    ``normlab.evals.metric_row``, scored with the unwrapped model (every rank scores every item).
    """
    n, ctx = run.cfg.eval_batches, run.autocast
    loss = evaluate(run.eval_fwd, run.sampler, n, ctx)
    row = {NAMES["val_loss"]: loss, NAMES["val_bpb"]: run.data.bits_per_byte(loss)}
    for s in run.evals:
        loss_key, bpb_key = eval_keys(s.name)
        loss = evaluate(run.eval_fwd, s.sampler, n, ctx)
        row.update({loss_key: loss, bpb_key: s.data.bits_per_byte(loss)})
    if run.downstream is not None:
        row.update(run.downstream(run.model, None, run.device, run.autocast))
    return row


def final_eval(row: dict[str, Any], names: list[str]) -> dict[str, dict[str, float | None]]:
    """``{name: {"loss", "bpb"}}`` of the held-out corpora in an :func:`eval_row`."""
    out = {}
    for name in names:
        loss_key, bpb_key = eval_keys(name)
        out[name] = {"loss": row.get(loss_key), "bpb": row.get(bpb_key)}
    return out


@dataclass
class TextSamples:
    """The text samples of a run: every ``interval`` steps and after the last (None: never), on
    rank 0, to ``train.log`` and ``sink`` (its ``log_sample``: wandb's table). The tokenizer is
    loaded at the first one; when it cannot be, one warning and no more samples: they never stop
    training."""

    interval: int | None
    sink: Any  # tracking.MetricsLogger or NoSink
    tokenizer: Any = None

    def due(self, done: int, last: bool) -> bool:
        return bool(self.interval) and (done % self.interval == 0 or last)

    def write(self, run, done: int) -> None:
        """A sample (:func:`training_sample`) after step ``done`` of ``run``."""
        if not distributed.is_main() or not self.interval:
            return
        try:
            self.tokenizer = self.tokenizer or run.data.load_tokenizer()
        except DataError as e:
            log.warning("no samples: the tokenizer cannot be loaded (%s)", e)
            self.interval = None
            return
        prompt, text = training_sample(run, self.tokenizer)
        log.info("sample after step %d (prompt %r):\n%s", done, prompt, text)
        self.sink.log_sample(done, prompt, text)


@torch.no_grad()
def training_sample(run, tokenizer) -> tuple[str, str]:
    """``(prompt, text)``: the first :data:`SAMPLE_PROMPT_TOKENS` tokens of the validation split
    continued by ``cfg.sample_tokens`` new tokens, with a generator seeded 0 and the defaults of
    ``normlab-sample`` (temperature 0.8, top-k 200): the same prompt and random draws at every step
    and for every variant, so samples differ only by the model. ``text`` is the decoded prompt plus
    the new tokens. The model is put back in training mode; no global RNG is touched."""
    opts = SampleOptions(max_new_tokens=run.cfg.sample_tokens)
    prompt = [int(i) for i in run.data.val_shards[0][:SAMPLE_PROMPT_TOKENS]]  # no concatenation
    run.model.eval()
    try:
        out = sample_ids(run.model, [prompt], opts, run.device, tokenizer.n_vocab)
    finally:
        run.model.train()
    return tokenizer.decode(prompt), tokenizer.decode(out[0].tolist())
