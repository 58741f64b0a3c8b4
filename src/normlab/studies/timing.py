"""Timing helpers of the benchmarks: synchronized samples, settling a case into its steady state,
cold-cache samples after a cache flush (keeping freed memory in the process:
``training.host_memory``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from normlab.training.tracking import synchronize

SETTLE_TOL = 1.1  # an untimed call within 10% of the case's fastest single call: steady state


def sample_ms(fn: Callable[[], object], device: torch.device, inner: int = 1) -> float:
    """Wall ms per call of ``fn``: ``inner`` calls between two synchronized clock reads."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3 / inner


def settle(
    fn: Callable[[], object], device: torch.device, calls: int, ref_ms: float = math.inf
) -> tuple[int, float]:
    """Untimed calls of ``fn`` before a warm sample: at least ``calls``, then more, up to
    ``2 * calls``, while the last one took over ``SETTLE_TOL`` x the fastest single call seen
    (``ref_ms`` or these). Returns ``(calls made, fastest of them in ms)``."""
    n, best, last = 0, math.inf, math.inf
    while n < calls or (n < 2 * calls and last > SETTLE_TOL * min(ref_ms, best)):
        last = sample_ms(fn, device)
        best, n = min(best, last), n + 1
    return n, best


def make_flush(device: torch.device, mb: int) -> Callable[[], object]:
    """A cache flush: each call reads and writes every byte of one ``mb`` MiB buffer on
    ``device``."""
    buf = torch.zeros(mb * 2**20, dtype=torch.uint8, device=device)
    return lambda: buf.add_(1)


def cold_sample_ms(
    fn: Callable[[], object], device: torch.device, flush: Callable[[], object]
) -> float:
    """Wall ms of one call of ``fn`` with cold caches: one untimed call (so its allocations reuse
    memory instead of page-faulting fresh pages), ``flush()``, then the timed call; ``sample_ms``
    synchronizes before reading the clock, so the flush is not timed."""
    fn()
    flush()
    return sample_ms(fn, device, 1)
