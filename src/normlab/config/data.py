"""The data group: corpus, tokenizer, token shards and batch shape.

Why: docs/data.md
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from normlab.config.base import _as_enum, _require


class Tokenizer(Enum):
    """How text becomes token ids (all stored as uint16)."""

    byte = "byte"  # UTF-8 bytes, vocabulary 256
    gpt2 = "gpt2"  # tiktoken's GPT-2 BPE: 50257 ids, reported padded to 50304 for the embedding
    bpe = "bpe"  # byte-level BPE trained on the train split (HF tokenizers), bpe_vocab_size ids


class DataFormat(Enum):
    """How the corpus is read through Hugging Face ``datasets``."""

    auto = "auto"  # from the files' suffixes: .txt/.md -> text, .json/.jsonl(.gz) -> json, .parquet
    text = "text"  # one document per file (the ``text`` builder, sample_by=document)
    json = "json"  # JSON lines, one document per record (its ``text_field``)
    json_values = "json_values"  # one JSON object {key: record}: its values are the records
    parquet = "parquet"  # one document per row (its ``text_field``)
    hub = "hub"  # ``datasets.load_dataset(hf_path, hf_name, revision=...)``: Hub id or folder


@dataclass
class DataConfig:
    """Corpus, tokenizer, token shards and batch shape (normlab.data; conf/data/*.yaml).

    Local corpora: ``path`` is a file or a folder (``file_glob``); null: the packaged corpus
    ``name`` (normlab.data.corpus.PACKAGED). Hub corpora (``format=hub``): ``hf_path`` (a Hub id or
    a local folder laid out like one), ``hf_name``, ``revision``, ``streaming``. Validation: the
    source's own split, else whole files, the tail of one file, or documents hashed below
    ``val_fraction``. ``max_documents`` / ``max_tokens`` cap the training stream (null: all).
    Shards go to ``token_dir``, or (null) a fingerprinted folder under ``cache_dir`` (null:
    ``$NORMLAB_CACHE`` or ``~/.cache/normlab``). ``batch_size``: sequences per micro-batch.
    """

    name: str = "shakespeare"  # the corpus; also names its token-cache folder
    format: DataFormat = DataFormat.text
    path: str | None = None
    file_glob: str = "*_gut.txt"  # which files of a folder path are read
    hf_path: str | None = None  # format=hub: a Hub dataset id or a local dataset folder
    hf_name: str | None = None  # format=hub: the subset (configuration) name
    revision: str | None = None  # null: the default branch
    streaming: bool = False  # hub only: read while tokenizing instead of downloading first
    text_field: str = "text"  # json/parquet/hub: the column holding the text
    doc_separator: bool = True  # an end-of-text separator between documents; false: rows are lines
    tokenizer: Tokenizer = Tokenizer.byte
    bpe_vocab_size: int = 4096
    bpe_train_chars: int = 100_000_000  # BPE training reads at most this many characters
    max_documents: int | None = None
    max_tokens: int | None = None
    shard_tokens: int = 50_000_000  # tokens per uint16 shard file
    num_proc: int | None = None  # tokenizer processes; null: min(8, CPU count)
    cache_dir: str | None = None
    token_dir: str | None = None
    val_fraction: float = 0.05  # held-out share when the source has no validation split
    batch_size: int = 8

    def __post_init__(self) -> None:
        self.tokenizer = _as_enum(Tokenizer, self.tokenizer, "data.tokenizer")
        self.format = _as_enum(DataFormat, self.format, "data.format")
        _require(
            bool(self.name) and "/" not in self.name,
            "data.name",
            self.name,
            "must be a non-empty name without '/'",
        )
        _require(
            self.format != DataFormat.hub or bool(self.hf_path),
            "data.hf_path",
            self.hf_path,
            "data.format=hub needs a Hub dataset id or a local dataset folder",
        )
        _require(bool(self.text_field), "data.text_field", self.text_field, "must be a column name")
        _require(
            257 <= self.bpe_vocab_size <= 65536,
            "data.bpe_vocab_size",
            self.bpe_vocab_size,
            "must be in [257, 65536] (256 bytes + at least one merge; ids are stored as uint16)",
        )
        _require(
            self.bpe_train_chars >= 1, "data.bpe_train_chars", self.bpe_train_chars, "must be >= 1"
        )
        for key in ("max_documents", "max_tokens", "num_proc"):
            value = getattr(self, key)
            _require(value is None or value >= 1, f"data.{key}", value, "must be null or >= 1")
        _require(self.shard_tokens >= 1, "data.shard_tokens", self.shard_tokens, "must be >= 1")
        _require(
            0.0 < self.val_fraction < 0.5,
            "data.val_fraction",
            self.val_fraction,
            "must be in (0, 0.5)",
        )
        _require(self.batch_size >= 1, "data.batch_size", self.batch_size, "must be >= 1")
