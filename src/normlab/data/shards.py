"""The prepare step: corpus -> ``uint16`` token shards + ``meta.json`` in one folder.

Shards ``<split>-NNNNN.bin`` hold whole documents (joined by the tokenizer's separator) up to
about ``data.shard_tokens`` tokens, each written atomically, then recorded in ``meta.json`` with
the document index it ends at: a rerun resumes after the last finished shard and writes the same
shards; ``"complete": true`` marks the end. ``data.num_proc`` processes tokenize ~1M-character
chunks in order (``encoder``), so any process count writes the same shards. Each split records its
UTF-8 bytes plus ``BOUNDARY_BYTES`` per separator, the same for every tokenizer (bits per byte).

Why: docs/data.md
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

import numpy as np

from normlab.config import DataConfig, Tokenizer
from normlab.data import tokenizer as tt
from normlab.data.corpus import DataError, Stream, held_out
from normlab.data.sources import open_streams, source_info

log = logging.getLogger(__name__)

META = "meta.json"
SPLITS = ("train", "val")
FORMAT_VERSION = 3  # 3: bytes per split (bits per byte)
#: Bytes a document boundary counts for, with any tokenizer: the byte tokenizer's "\n\n".
BOUNDARY_BYTES = 2
_CHUNK_CHARS = 1 << 20


def _atomic_write(path: Path, data: bytes | np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    if isinstance(data, np.ndarray):
        data.tofile(tmp)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_shard(path: Path, ids: np.ndarray) -> None:
    """One shard, atomically (a temp file, then rename)."""
    _atomic_write(path, ids.astype(np.uint16, copy=False))


class _SplitWriter:
    """Accumulates one split's documents; writes a shard each time ``shard_tokens`` is reached."""

    def __init__(self, directory: Path, split: str, state: dict, cfg: DataConfig, sep, save):
        self.directory, self.split, self.state = directory, split, state
        self.shard_tokens, self.sep, self.save = cfg.shard_tokens, sep, save
        self.buf: list[np.ndarray] = []
        self.pending = self.n = self.nbytes = 0

    @property
    def tokens(self) -> int:
        return self.state["tokens"] + self.n

    def add(self, ids: np.ndarray, index: int, nbytes: int) -> None:
        """Append document ``index`` (``ids``, ``nbytes`` UTF-8 bytes of text) after a separator."""
        if self.state["docs"] + self.pending and len(self.sep):
            self.buf.append(self.sep)
            self.n += len(self.sep)
            self.nbytes += BOUNDARY_BYTES
        self.buf.append(ids)
        self.n += len(ids)
        self.nbytes += nbytes
        self.pending += 1
        if self.n >= self.shard_tokens:
            self.flush(index + 1)

    def flush(self, docs_end: int, done: bool = False) -> None:
        if self.n:
            name = f"{self.split}-{len(self.state['shards']):05d}.bin"
            _write_shard(self.directory / name, np.concatenate(self.buf))
            self.state["shards"].append({"file": name, "tokens": self.n, "docs_end": docs_end})
        self.state.update(
            tokens=self.tokens,
            bytes=self.state["bytes"] + self.nbytes,
            docs=self.state["docs"] + self.pending,
            docs_end=docs_end,
            done=done,
        )
        self.buf, self.pending, self.n, self.nbytes = [], 0, 0, 0
        self.save()


def _chunks(
    docs: Iterator[tuple[int, str]], route: Callable[[int, str], str | None]
) -> Iterator[tuple[list, list[str]]]:
    """``((index, split, bytes) tags, texts)`` chunks of about 1M characters; the documents that
    ``route`` gives no split are left out."""
    tags, texts, size = [], [], 0
    for i, text in docs:
        split = route(i, text)
        if split is None:
            continue
        tags.append((i, split, len(text.encode("utf-8", "surrogatepass"))))
        texts.append(text)
        size += len(text)
        if size >= _CHUNK_CHARS:
            yield tags, texts
            tags, texts, size = [], [], 0
    if tags:
        yield tags, texts


def _tokenize(
    cfg: DataConfig,
    streams: list[Stream],
    tok,
    directory: Path,
    meta: dict,
    save: Callable[[], None],
) -> None:
    """Tokenize every stream into shards, skipping documents already in finished shards."""
    state = meta["splits"]
    sep = tok.separator if cfg.doc_separator else np.zeros(0, np.uint16)
    writers = {s: _SplitWriter(directory, s, state[s], cfg, sep, save) for s in SPLITS}
    ratio = cfg.val_fraction / (1 - cfg.val_fraction)
    with encoder(cfg, tok, directory) as encode:
        for stream in streams:
            feeds = [stream.split] if stream.split else list(SPLITS)
            if all(state[s]["done"] for s in feeds):
                continue
            # caps: on train; on a separate validation stream in proportion (val_fraction)
            scale = ratio if stream.split == "val" and len(streams) > 1 else 1.0
            caps = (
                math.ceil(cfg.max_documents * scale) if cfg.max_documents else None,
                math.ceil(cfg.max_tokens * scale) if cfg.max_tokens else None,
            )
            end = _tokenize_stream(cfg, stream, encode, writers, caps)
            for s in feeds:
                if not state[s]["done"]:
                    writers[s].flush(end, done=True)


def _tokenize_stream(
    cfg: DataConfig, stream: Stream, encode, writers: dict, caps: tuple[int | None, int | None]
) -> int:
    """Feed one stream's documents to the writers, skipping those in finished shards; returns the
    index after the last consumed. The token cap is checked before each document from the capped
    split's ``docs_end`` on, so a resumed run stops where an uninterrupted one does."""
    from tqdm import tqdm

    max_docs, max_tokens = caps
    state = {s: w.state for s, w in writers.items()}
    capped = stream.split or "train"
    feeds = [stream.split] if stream.split else list(SPLITS)
    start = min(state[s]["docs_end"] for s in feeds)
    seen = [start]

    def route(i: int, text: str) -> str | None:
        split = stream.split or ("val" if held_out(text, cfg.val_fraction) else "train")
        return None if not text or state[split]["done"] or i < state[split]["docs_end"] else split

    def docs() -> Iterator[tuple[int, str]]:
        for i, text in enumerate(islice(stream.open(), start, max_docs), start):
            seen[0] = i + 1
            yield i, text

    with tqdm(
        total=max_docs or stream.total,
        initial=start,
        unit="doc",
        desc=f"{cfg.name} {stream.label}",
        disable=None,
        mininterval=1.0,
    ) as bar:
        for tags, ids_list in encode(_chunks(docs(), route)):
            for (i, split, nbytes), ids in zip(tags, ids_list, strict=True):
                if (
                    max_tokens
                    and writers[capped].tokens >= max_tokens
                    and i >= state[capped]["docs_end"]
                ):
                    return i
                writers[split].add(ids, i, nbytes)
            bar.update(tags[-1][0] + 1 - bar.n)
            bar.set_postfix(tokens=sum(w.tokens for w in writers.values()), refresh=False)
    return seen[0]


def _train_texts(cfg: DataConfig, streams: list[Stream]) -> Iterator[str]:
    """Training documents for BPE: at most ``bpe_train_chars`` characters, in stream order."""
    left = cfg.bpe_train_chars
    for stream in streams:
        if stream.split == "val":
            continue
        for text in islice(stream.open(), cfg.max_documents):
            if not text or (stream.split is None and held_out(text, cfg.val_fraction)):
                continue
            yield text[:left]
            left -= len(text)
            if left <= 0:
                return


def build(cfg: DataConfig, directory: Path, meta: dict | None, fp: str) -> dict:
    """Tokenize ``cfg``'s corpus into ``directory`` (resuming from ``meta``): the complete meta;
    DataError when the corpus or tokenizer cannot be read, or a split comes out empty."""
    t0 = time.perf_counter()
    resumed = meta is not None
    streams = open_streams(cfg)
    # fail before writing anything (bpe is trained below)
    tok = None if cfg.tokenizer == Tokenizer.bpe else _load_tokenizer(cfg, directory)
    if meta is None:
        meta = {
            "format_version": FORMAT_VERSION,
            "complete": False,
            "name": cfg.name,
            "fingerprint": fp,
            "source": source_info(cfg),
            "tokenizer": cfg.tokenizer.name,
            "dtype": "uint16",
            "splits": {
                s: {"shards": [], "tokens": 0, "bytes": 0, "docs": 0, "docs_end": 0, "done": False}
                for s in SPLITS
            },
        }
        if cfg.tokenizer == Tokenizer.bpe:
            meta["bpe_vocab_size"] = cfg.bpe_vocab_size

    def save() -> None:
        meta["tokens"] = {s: meta["splits"][s]["tokens"] for s in SPLITS}
        _atomic_write(directory / META, json.dumps(meta, indent=2).encode())

    save()
    if tok is None:
        if not (directory / tt.BPE_FILE).is_file():
            log.info(
                "training a %d-token BPE on the train split of %s", cfg.bpe_vocab_size, cfg.name
            )
            tt.train_bpe(_train_texts(cfg, streams), cfg.bpe_vocab_size, directory / tt.BPE_FILE)
        tok = _load_tokenizer(cfg, directory)
    meta.update(tokenizer_vocab_size=tok.n_vocab, vocab_size=tt.padded_vocab(tok.n_vocab))
    log.info(
        "tokenizing %s with %s into %s%s",
        cfg.name,
        cfg.tokenizer.name,
        directory,
        " (resuming)" if resumed else "",
    )
    _tokenize(cfg, streams, tok, directory, meta, save)
    for split in SPLITS:
        if not meta["splits"][split]["tokens"]:
            raise DataError(
                f"the {split} split of data={cfg.name} is empty: add documents or raise "
                "data.val_fraction"
            )
    total = sum(meta["tokens"].values())
    val = meta["splits"]["val"]
    meta.update(
        complete=True,
        val_fraction_actual=meta["tokens"]["val"] / total,
        val_bytes=val["bytes"],
        val_tokens=val["tokens"],
        bytes_per_token=val["bytes"] / val["tokens"],
        prepare_seconds=round(time.perf_counter() - t0, 3),
        resumed=resumed,
    )
    save()
    return meta


def _load_tokenizer(cfg: DataConfig, directory: Path):
    try:
        return tt.load(cfg.tokenizer, directory)
    except tt.TokenizerError as e:
        raise DataError(str(e)) from None


_worker_tokenizer = None


def init_worker(kind_name: str, directory: str | None) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tt.load(Tokenizer[kind_name], Path(directory) if directory else None)


def encode_chunk(job: tuple[object, list[str]]) -> tuple[object, list[np.ndarray]]:
    """``(tag, texts) -> (tag, ids per text)`` in a worker; the tag travels back untouched."""
    tag, texts = job
    return tag, _worker_tokenizer.encode(texts)


@contextlib.contextmanager
def encoder(cfg: DataConfig, tok, directory: Path):
    """A function mapping chunks ``(tags, texts)`` to ``(tags, ids)``, in order: in-process for
    one process (``data.num_proc``; null: 1 for byte, else min(8, CPUs)), else in a pool."""
    cpus = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    n = cfg.num_proc or (1 if cfg.tokenizer == Tokenizer.byte else min(8, cpus))
    if n == 1:
        yield lambda jobs: ((tags, tok.encode(texts)) for tags, texts in jobs)
        return
    import multiprocessing as mp
    import sys

    # fork on Linux: quick to start, and a caller's unguarded script is not re-imported (spawn's
    # pitfall). The workers touch only numpy and the tokenizer, never torch or CUDA. They get
    # TOKENIZERS_PARALLELISM=false (one thread each, and no fork warning after BPE training).
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        pool = ctx.Pool(n, initializer=init_worker, initargs=(cfg.tokenizer.name, str(directory)))
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved

    def run(jobs):  # at most 2 chunks per process in flight: a streamed corpus is never read ahead
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.apply_async(encode_chunk, (job,)))
            if len(pending) >= 2 * n:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    try:
        yield run
    finally:
        pool.terminate()
        pool.join()
