"""Fixtures shared by the tests of a trained run's checkpoint (``normlab-sample`` here,
``normlab-eval`` in ``tests/evals``): a run dir holding an untrained tiny model's checkpoint."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from normlab.config import to_plain
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.training.checkpoint import CKPT_DIR, save_checkpoint


def write_run(run_dir, cfg, seed=0, step=7):
    """A run dir holding one checkpoint of an untrained model of ``cfg`` (norm resolved, byte
    vocabulary), as training writes it; returns the model."""
    cfg = dataclasses.replace(
        cfg,
        norm=resolve_norm(cfg.norm, "cpu"),
        model=dataclasses.replace(cfg.model, vocab_size=256),
    )
    torch.manual_seed(seed)
    model = GPT(cfg.model, cfg.norm)
    state = {"step": step, "model": model.state_dict(), "config": to_plain(cfg)}
    save_checkpoint(run_dir / CKPT_DIR, state, keep=2)
    return model.eval()


@pytest.fixture
def tiny_run(tmp_path, cfg_tiny, one_thread):
    """``(run dir, model)``: one checkpoint (step 7) of an untrained tiny model (norm rms/torch,
    bytes)."""
    run_dir = tmp_path / "run"
    return run_dir, write_run(run_dir, cfg_tiny("norm=rms", "norm.impl=torch"))


#: Words of the small corpora a BPE run trains on (documents of random words, one per line).
WORDS = "the a norm layer root mean square gradient token model train valid loss step".split()


def corpus_lines(n: int, seed: int, words: list[str] = WORDS) -> str:
    """``n`` documents of 20 to 60 random ``words``, one per line (seeded)."""
    rng = random.Random(seed)
    return "\n".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(n)
    )


def train_bpe_run(tmp_path, cfg_tiny):
    """A 2-step run on a small text corpus with a ``bpe`` tokenizer (300 ids) trained on it, its
    token cache under ``tmp_path/cache``: ``(run dir, corpus file, summary, data config)``."""
    from normlab.training.loop import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_lines(300, seed=2))
    cfg = cfg_tiny(
        "data=text_files",
        f"data.path={corpus}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.tokenizer=bpe",
        "data.bpe_vocab_size=300",
        "data.val_fraction=0.2",
        "max_steps=2",
        "eval_interval=2",
    )
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    return tmp_path / "run", corpus, summary, cfg.data
