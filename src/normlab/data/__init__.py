"""Corpus -> documents -> tokens -> uint16 shards (cached) -> deterministic batches.

``corpus`` (local files, packaged corpora) and ``sources`` (the Hub) give documents; ``tokenizer``
encodes and decodes; ``shards`` tokenizes in processes and writes the token folder;
``tokens.prepare`` finds or builds it and returns ``TokenData``, whose ``BatchSampler`` draws
batches. The names below are imported on first use (PEP 562), so ``import normlab.data.corpus``
(which ``train`` runs to refuse a missing corpus early) does not import torch.

Why: docs/data.md
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "DataError": "normlab.data.corpus",
    "BatchSampler": "normlab.data.tokens",
    "TokenData": "normlab.data.tokens",
    "prepare": "normlab.data.tokens",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'normlab.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
