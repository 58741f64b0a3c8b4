"""Every evaluation of a run: the validation split and the held-out corpora (``eval_data``), in
nats per token and bits per byte, and the text samples of ``sample_interval``.

``eval_row`` scores the model on the fixed validation batches of the training corpus and each
held-out corpus: ``val/loss``, ``val/bpb``, ``val/<name>/loss``, ``val/<name>/bpb``. Evaluation
draws no random number, so it changes no training loss. ``training_sample`` writes a sample with
``normlab-sample``'s generation code (``sample.generate``).

Why: docs/data.md
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
    """Each held-out corpus of ``configs``, prepared (or cached) with the tokenizer of
    ``train_dir``, and its sampler; raises DataError naming a corpus that cannot be prepared."""
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
    """Mean cross-entropy (nats/token) over the fixed validation batches ``0..n_batches-1``; one
    host sync. Collective: each rank scores its share, averaged in batch order."""
    model.eval()
    mine = distributed.shard(n_batches)  # batches rank, rank + N, ...
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
    """One evaluation of a ``Run``: ``{metric key: value}``, ``bpb`` None for shards without
    byte counts; ``eval_tasks`` add ``downstream/<task>/...`` (``evals.metric_row``)."""
    n, ctx = run.cfg.eval_batches, run.autocast
    loss = evaluate(run.eval_fwd, run.sampler, n, ctx)
    row = {NAMES["val_loss"]: loss, NAMES["val_bpb"]: run.data.bits_per_byte(loss)}
    for s in run.evals:
        loss_key, bpb_key = eval_keys(s.name)
        loss = evaluate(run.eval_fwd, s.sampler, n, ctx)
        row.update({loss_key: loss, bpb_key: s.data.bits_per_byte(loss)})
    if run.downstream is not None:  # the unwrapped model: every rank scores every item
        row.update(run.downstream(run.model, None, run.device, run.autocast))
    return row


def final_eval(row: dict[str, Any], names: list[str]) -> dict[str, dict[str, float | None]]:
    """``{name: {"loss", "bpb"}}`` of the held-out corpora in an ``eval_row``."""
    out = {}
    for name in names:
        loss_key, bpb_key = eval_keys(name)
        out[name] = {"loss": row.get(loss_key), "bpb": row.get(bpb_key)}
    return out


@dataclass
class TextSamples:
    """Text samples every ``interval`` steps and after the last (None: never), on rank 0, to
    ``train.log`` and ``sink``; a tokenizer that cannot load ends them with one warning."""

    interval: int | None
    sink: Any  # tracking.MetricsLogger or NoSink
    tokenizer: Any = None

    def due(self, done: int, last: bool) -> bool:
        return bool(self.interval) and (done % self.interval == 0 or last)

    def write(self, run, done: int) -> None:
        """A sample (``training_sample``) after step ``done`` of ``run``."""
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
    """``(prompt, text)``: the validation split's first ``SAMPLE_PROMPT_TOKENS`` tokens and their
    continuation by ``cfg.sample_tokens`` tokens, seed 0; no global RNG is touched."""
    # the same prompt and draws at every step and variant: samples differ only by the model
    opts = SampleOptions(max_new_tokens=run.cfg.sample_tokens)
    prompt = [int(i) for i in run.data.val_shards[0][:SAMPLE_PROMPT_TOKENS]]  # no concatenation
    run.model.eval()
    try:
        out = sample_ids(run.model, [prompt], opts, run.device, tokenizer.n_vocab)
    finally:
        run.model.train()
    return tokenizer.decode(prompt), tokenizer.decode(out[0].tolist())
