"""Corpus -> token shards (cached, shared by every run): ``prepare`` -> ``TokenData``.

``prepare`` finds the token folder (``data.token_dir``, or ``<cache>/<name>-<tokenizer>-<fp>/``),
uses a complete one as is (no corpus read, no network), refuses one of another tokenizer, else
runs ``shards.build``. ``BatchSampler`` draws batches from the memory-mapped shards as a pure
function of ``(seed, step, micro_step)``, uniformly over every window start, never across a
shard. ``fingerprint`` hashes every setting that changes the tokens and the local files.

Why: docs/data.md
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from normlab.config import DataConfig, DataFormat, Tokenizer
from normlab.data import tokenizer as tt
from normlab.data.corpus import (
    DataError,
    corpus_files,
    file_format,
    held_out,
    relative_names,
    split_by_tails,
    split_by_work,
)
from normlab.data.shards import FORMAT_VERSION, META, SPLITS, build
from normlab.data.sources import source_files

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


def encode_bytes(text: str) -> np.ndarray:
    """Byte-level tokenizer: UTF-8 bytes as ``uint16`` token ids in [0, 256)."""
    return tt.ByteTokenizer().encode([text])[0]


#: DataConfig fields that never change the tokens, each with the reason. Every other field of
#: DataConfig (a new one included) is hashed by ``fingerprint``;
#: tests/data/test_data_fingerprint.py checks each reason by preparing with two values and
#: comparing the shards.
NOT_IN_FINGERPRINT = {
    "path": "the files it names are hashed instead, by relative name and contents",
    "file_glob": "the files it selects are hashed instead, by relative name and contents",
    "streaming": "datasets yields the same rows in the same order, streamed or downloaded",
    "num_proc": "the pool returns chunks in the order they went out",
    "cache_dir": "where the token folder goes, not what it holds",
    "token_dir": "where the token folder goes, not what it holds",
    "batch_size": "batches are drawn from the shards after they are written",
}
#: Fields that change the tokens only in some settings: hashed only when the rule holds.
ONLY_WHEN = {
    "bpe_vocab_size": lambda cfg, files: cfg.tokenizer == Tokenizer.bpe,
    "bpe_train_chars": lambda cfg, files: cfg.tokenizer == Tokenizer.bpe,
    "hf_path": lambda cfg, files: not files,  # a local Hub-like folder: its files are hashed
}


def fingerprint_settings(cfg: DataConfig, files: list[Path]) -> dict:
    """The settings ``fingerprint`` hashes: every dataclass field of ``cfg`` but
    ``NOT_IN_FINGERPRINT`` and the ``ONLY_WHEN`` fields whose rule fails; ``format`` resolved, and
    ``val_split: tails`` when text files hold out their tails (``split_by_tails``)."""
    settings = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name not in NOT_IN_FINGERPRINT
        and (f.name not in ONLY_WHEN or ONLY_WHEN[f.name](cfg, files))
    }
    settings["format"] = file_format(cfg, files) if cfg.format != DataFormat.hub else "hub"
    if settings["format"] == "text" and split_by_tails(files, cfg.val_fraction):
        settings["val_split"] = "tails"  # absent for whole works: their caches keep their names
    return settings


def fingerprint(cfg: DataConfig, files: list[Path]) -> str:
    """16 hex digits of sha256 over ``fingerprint_settings`` and the files' relative names and
    contents (never where the corpus folder is)."""
    settings = fingerprint_settings(cfg, files)
    blob = json.dumps(settings, default=lambda v: v.name, sort_keys=True).encode()
    h = hashlib.sha256(blob + f"|v{FORMAT_VERSION}".encode())
    names = relative_names(files) if files else {}
    for f in files:  # by name, not by location
        h.update(names[f].encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


def default_cache_root() -> Path:
    """normlab's cache folder when no config names one: $NORMLAB_CACHE, else ~/.cache/normlab."""
    return Path(os.environ.get("NORMLAB_CACHE", "~/.cache/normlab")).expanduser()


def cache_root(cfg: DataConfig) -> Path:
    """``data.cache_dir``, else ``default_cache_root``."""
    if cfg.cache_dir is not None:
        return Path(cfg.cache_dir).expanduser()
    return default_cache_root()


def token_dir(cfg: DataConfig) -> Path:
    """Where the shards of ``cfg`` live: ``data.token_dir``, else the fingerprinted cache folder."""
    if cfg.token_dir is not None:
        return Path(cfg.token_dir).expanduser()
    return (
        cache_root(cfg) / f"{cfg.name}-{cfg.tokenizer.name}-{fingerprint(cfg, source_files(cfg))}"
    )


@dataclass(frozen=True)
class TokenData:
    """Memory-mapped token shards of both splits and where they came from; ``train`` / ``val``:
    one ``uint16`` array per split (the shards concatenated in memory when several)."""

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
    def val_bytes_per_token(self) -> float | None:
        """Validation UTF-8 bytes per token (``meta.json``'s ``bytes_per_token``, boundaries
        counted as 2 bytes); None for shards of format_version < 3 (prepare them again)."""
        value = self.meta.get("bytes_per_token")
        return float(value) if value is not None else None

    def bits_per_byte(self, loss: float) -> float | None:
        """Validation bits per byte of a mean loss in nats per token, ``loss / ln 2 /
        bytes_per_token`` (nanochat's val/bpb); None without ``val_bytes_per_token``."""
        bpt = self.val_bytes_per_token
        return None if bpt is None else loss / math.log(2) / bpt

    def load_tokenizer(self):
        """The tokenizer these shards were made with; DataError when its files cannot be loaded
        (gpt2 offline and not cached)."""
        try:
            return tt.load(Tokenizer[self.meta["tokenizer"]], self.directory)
        except tt.TokenizerError as e:
            raise DataError(str(e)) from None

    def tokenizer_digest(self) -> str | None:
        """``tokenizer.digest`` of the tokenizer these shards were made with (``summary.json``'s
        ``data.tokenizer_digest``); None when loading it would need the network."""
        if self.meta.get("tokenizer") == Tokenizer.gpt2.name and not tt.gpt2_cached():
            return None
        try:
            return tt.digest(self.load_tokenizer())
        except DataError:
            return None

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
            f"{directory} holds shards made with tokenizer {made}, not data.tokenizer={want}: use "
            "the tokenizer they were made with, or another data.token_dir (or delete that folder) "
            f"to prepare {cfg.tokenizer.name} shards"
        )


def _read_meta(directory: Path) -> dict | None:
    path = directory / META
    return json.loads(path.read_text()) if path.is_file() else None


@contextlib.contextmanager
def _locked(directory: Path):
    """An exclusive lock on the folder while it is prepared (two runs never write one shard)."""
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
    """Tokenize the corpus into shards once (resuming) and memory-map them; a complete folder is
    used as is. DataError: corpus or tokenizer missing or unreachable, the folder holds shards of
    another tokenizer or settings, or a split comes out empty."""
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
                if meta is not None and meta.get("format_version") != FORMAT_VERSION:
                    raise DataError(
                        f"{directory} holds an unfinished prepare of format_version "
                        f"{meta.get('format_version')} (this normlab writes {FORMAT_VERSION}): "
                        "delete it or choose another data.token_dir"
                    )
                if meta is not None and meta.get("fingerprint") != fp:
                    raise DataError(
                        f"{directory} holds an unfinished prepare of other data settings: delete "
                        "it or choose another data.token_dir"
                    )
                meta = build(cfg, directory, meta, fp)
    except DataError:
        if not (directory / META).exists():  # failed before writing: leave no empty folder
            with contextlib.suppress(OSError):
                (directory / ".lock").unlink()
                directory.rmdir()
        raise
    return _open_shards(directory, meta)


#: Seed of the fixed validation batches: the same windows for every run, seed and variant.
VAL_SEED = 1_000_003


class _Windows:
    """Uniform random windows over shards: a shard is drawn in proportion to its window starts."""

    def __init__(self, shards: tuple[np.ndarray, ...], seq_len: int, split: str):
        self.shards, self.T = shards, seq_len
        starts = np.array([max(0, len(s) - seq_len - 1) for s in shards], dtype=np.int64)
        if starts.sum() == 0:
            longest = max((len(s) for s in shards), default=0)
            raise DataError(
                f"the {split} split has {longest} tokens in its longest shard, fewer than one "
                f"sequence of {seq_len + 1}"
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
    """Random windows of ``seq_len + 1`` tokens, each batch a pure function of its indices:
    ``train_batch(step, micro)``, ``val_batch(i)`` -> ``(x, y)`` ``(B, T)`` int64 on ``device``, y
    shifted one token right. DataError: no shard of a split holds ``seq_len + 2`` tokens."""

    def __init__(self, data, batch_size: int, seq_len: int, seed: int, device: torch.device):
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
