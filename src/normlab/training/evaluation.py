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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from normlab.config import DataConfig, TrainConfig
from normlab.data.corpus import DataError
from normlab.data.eval_sets import prepare_eval
from normlab.data.tokens import BatchSampler, TokenData
from normlab.training.metrics import NAMES, eval_keys
from normlab.training.sample import SampleOptions, sample_ids
from normlab.training.step import evaluate

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
                data, cfg.data.batch_size, cfg.model.context_length, cfg.seed, device
            )
        except DataError as e:
            raise DataError(f"eval_data: {name}: {e}") from None
        out.append(EvalSet(name, data, sampler))
    return out


def eval_row(run) -> dict[str, float | None]:
    """One evaluation of ``run`` (a :class:`~normlab.training.step.Run`): ``{metric key: value}``.

    ``val/bpb`` (and a corpus's ``bpb``) is None for shards prepared before bytes were recorded.
    One host sync per corpus (:func:`~normlab.training.step.evaluate`).
    """
    n, ctx = run.cfg.eval_batches, run.autocast
    loss = evaluate(run.eval_fwd, run.sampler, n, ctx)
    row = {NAMES["val_loss"]: loss, NAMES["val_bpb"]: run.data.bits_per_byte(loss)}
    for s in run.evals:
        loss_key, bpb_key = eval_keys(s.name)
        loss = evaluate(run.eval_fwd, s.sampler, n, ctx)
        row.update({loss_key: loss, bpb_key: s.data.bits_per_byte(loss)})
    return row


def final_eval(row: dict[str, Any], names: list[str]) -> dict[str, dict[str, float | None]]:
    """``{name: {"loss", "bpb"}}`` of the held-out corpora in an :func:`eval_row`."""
    out = {}
    for name in names:
        loss_key, bpb_key = eval_keys(name)
        out[name] = {"loss": row.get(loss_key), "bpb": row.get(bpb_key)}
    return out


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
