"""Fixtures shared by the tests of a trained run's checkpoint (``normlab-sample`` here,
``normlab-eval`` in ``tests/evals``): a run dir holding an untrained tiny model's checkpoint."""

from __future__ import annotations

import dataclasses

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
