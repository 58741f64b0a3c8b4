"""Tokenizers: text <-> ``uint16`` token ids. Named so as not to shadow the stdlib ``tokenize``.

``encode(texts) -> [ids]``, ``decode(ids) -> text``, ``decode(encode([x])[0]) == x``; a split
UTF-8 character decodes to U+FFFD. ``byte``: 256 ids, documents joined by ``"\\n\\n"``; ``gpt2``:
tiktoken's 50257 ids (``padded_vocab``: 50304 rows), separator ``<|endoftext|>``; ``bpe``:
byte-level BPE trained on the train split (``tokenizer.json``), id 0 ``<|endoftext|>``. ``load``
checks tiktoken's cache and the network (3 s) first; ``digest`` names what a tokenizer computes.

Why: docs/data.md
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from normlab.config import Tokenizer

GPT2_URLS = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)
EOT = "<|endoftext|>"
BPE_FILE = "tokenizer.json"
VOCAB_MULTIPLE = 64  # embedding rows: faster matmuls; the padding rows are never a target


class TokenizerError(ValueError):
    """A tokenizer cannot be loaded; one line saying what is missing and how to fix it."""


def padded_vocab(n: int) -> int:
    """``n`` rounded up to a multiple of 64: the embedding size reported as ``vocab_size``."""
    return -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``url``'s host opens within ``timeout`` s (True via a proxy)."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # the proxy decides; a direct probe would say nothing
    u = urlparse(url)
    try:
        socket.create_connection(
            (u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout
        ).close()
        return True
    except OSError:
        return False


def tiktoken_cache_dir() -> Path | None:
    """Where tiktoken caches downloads (None: caching is off, ``TIKTOKEN_CACHE_DIR=""``)."""
    for key in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if key in os.environ:
            return Path(os.environ[key]) if os.environ[key] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def gpt2_cached() -> bool:
    """Whether tiktoken's GPT-2 files are in its cache (tiktoken names them by the URL's SHA-1)."""
    cache = tiktoken_cache_dir()
    return cache is not None and all(
        (cache / hashlib.sha1(u.encode()).hexdigest()).is_file() for u in GPT2_URLS
    )


def _ids(ids: Sequence[int] | np.ndarray) -> list[int]:
    return np.asarray(ids, dtype=np.int64).reshape(-1).tolist()


class ByteTokenizer:
    name = "byte"
    n_vocab = 256
    separator = np.frombuffer(b"\n\n", dtype=np.uint8).astype(np.uint16)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's UTF-8 bytes as ``uint16`` ids in [0, 256)."""
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint16) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The UTF-8 text of byte ids (invalid sequences become U+FFFD); TokenizerError for an id
        outside [0, 256) (a padded vocabulary's rows can be sampled)."""
        values = _ids(ids)
        bad = [i for i in values if not 0 <= i < 256]
        if bad:
            raise TokenizerError(f"byte ids must be in [0, 256); got {bad[0]}")
        return bytes(values).decode("utf-8", errors="replace")

    def serialized(self) -> bytes:
        """What makes it this tokenizer (``digest``): the byte of each id."""
        return bytes(range(256))


class GPT2Tokenizer:
    name = "gpt2"
    n_vocab = 50257

    def __init__(self) -> None:
        import tiktoken

        self.enc = tiktoken.get_encoding("gpt2")
        self.separator = np.array([self.enc.eot_token], dtype=np.uint16)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """GPT-2 BPE ids; ``"<|endoftext|>"`` inside a text is text (``encode_ordinary``)."""
        return [
            np.asarray(ids, dtype=np.uint16)
            for ids in self.enc.encode_ordinary_batch(list(texts), num_threads=1)
        ]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of GPT-2 ids (50256 decodes to ``"<|endoftext|>"``); TokenizerError for an id
        outside [0, 50257) (one of the embedding's padding rows)."""
        values = _ids(ids)
        bad = [i for i in values if not 0 <= i < self.n_vocab]
        if bad:
            raise TokenizerError(f"gpt2 ids must be in [0, {self.n_vocab}); got {bad[0]}")
        return self.enc.decode(values, errors="replace")

    def serialized(self) -> bytes:
        """What makes it this tokenizer (``digest``): each id's bytes, length-prefixed."""
        pieces = (self.enc.decode_single_token_bytes(i) for i in range(self.n_vocab))
        return b"".join(len(b).to_bytes(4, "little") + b for b in pieces)


class BPETokenizer:
    name = "bpe"

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.tok = HFTokenizer.from_file(str(path))
        self.tok.encode_special_tokens = True  # "<|endoftext|>" inside a document is text
        self.n_vocab = self.tok.get_vocab_size()
        self.separator = np.array([self.tok.token_to_id(EOT)], dtype=np.uint16)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Byte-level BPE ids of each text (no special tokens added)."""
        return [
            np.asarray(e.ids, dtype=np.uint16)
            for e in self.tok.encode_batch_fast(list(texts), add_special_tokens=False)
        ]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of BPE ids (id 0 decodes to ``"<|endoftext|>"``); TokenizerError for an id
        outside [0, n_vocab) (one of the embedding's padding rows)."""
        values = _ids(ids)
        bad = [i for i in values if not 0 <= i < self.n_vocab]
        if bad:
            raise TokenizerError(f"bpe ids must be in [0, {self.n_vocab}); got {bad[0]}")
        return self.tok.decode(values, skip_special_tokens=False)

    def serialized(self) -> bytes:
        """What makes it this tokenizer (``digest``): its ``tokenizer.json`` as canonical JSON
        (sorted keys)."""
        doc = json.loads(self.tok.to_str())
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(tok) -> str:
    """sha256 hex of a tokenizer's name and ``serialized`` form: what it computes, not its file."""
    return hashlib.sha256(tok.name.encode() + b"\0" + tok.serialized()).hexdigest()


def load(kind: Tokenizer, directory: Path | None = None):
    """The tokenizer ``kind``, ``bpe`` read from ``directory/tokenizer.json``; TokenizerError when
    GPT-2's files are neither cached nor downloadable, or tokenizer.json is missing."""
    if kind == Tokenizer.byte:
        return ByteTokenizer()
    if kind == Tokenizer.bpe:
        path = Path(directory or ".") / BPE_FILE
        if not path.is_file():
            raise TokenizerError(
                f"data.tokenizer=bpe needs {path}: rerun `normlab-prepare` with the same data "
                "settings to train it"
            )
        return BPETokenizer(path)
    if not gpt2_cached() and not reachable(GPT2_URLS[0]):
        raise TokenizerError(
            f"data.tokenizer=gpt2 needs tiktoken's GPT-2 files ({GPT2_URLS[0]} and encoder.json), "
            f"which are not in tiktoken's cache ({tiktoken_cache_dir()}) and cannot be downloaded "
            "here: run `python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\"` on a machine "
            "with internet and copy its cache folder here, then set TIKTOKEN_CACHE_DIR to that "
            "folder"
        )
    try:
        return GPT2Tokenizer()
    except Exception as e:  # a failed download, a corrupt cache
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise TokenizerError(
            f"data.tokenizer=gpt2: tiktoken could not load the GPT-2 BPE ({first}); set "
            "TIKTOKEN_CACHE_DIR to a folder holding its cached files"
        ) from None


def train_bpe(texts: Iterable[str], vocab_size: int, path: Path) -> BPETokenizer:
    """Train a byte-level BPE (GPT-2's pre-tokenizer, ``vocab_size`` ids, id 0 ``<|endoftext|>``),
    deterministic for the same texts in order, written atomically to ``path``."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return BPETokenizer(path)
