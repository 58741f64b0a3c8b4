"""Tokenizing in a pool of processes, in document order.

Each pool process builds its tokenizer once (the initializer) and keeps it for its lifetime; the
chunks come back in the order they went out, so any ``data.num_proc`` writes the same shards.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from pathlib import Path

import numpy as np

from normlab.config import DataConfig, Tokenizer
from normlab.data.tokenizer import load

_worker_tokenizer = None


def init_worker(kind_name: str, directory: str | None) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load(Tokenizer[kind_name], Path(directory) if directory else None)


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
