"""Host memory of a CPU run: keep what PyTorch's CPU allocator frees inside the process.

PyTorch's CPU allocator is plain ``malloc``; with glibc's defaults large freed blocks go back to
the kernel and the next step page-faults the same activations in again. ``build_run`` calls
``keep_freed_memory`` for every CPU run, so ``train`` and ``normlab-bench`` time the same
allocator; ``free_memory`` calls ``release_freed_memory`` after each run.

Why: docs/benchmarks.md
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

KEPT = "glibc mallopt: freed memory kept in the process (no mmap, no trim)"
DEFAULTS = "allocator defaults"  # keep_freed_memory not called (a GPU run), or it could not be
NOT_GLIBC = "allocator defaults (not glibc)"
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
_state = [DEFAULTS]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc only: AttributeError elsewhere)
        return libc
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> str:
    """Ask glibc to keep freed memory in the process (no ``mmap`` per large block, no heap trim);
    idempotent. Returns ``KEPT`` or ``NOT_GLIBC``, what ``host_memory`` reports from then on."""
    libc = _libc()
    if libc is None:
        _state[0] = NOT_GLIBC
    elif libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1:
        _state[0] = KEPT
    return _state[0]


def release_freed_memory() -> None:
    """Give the heap's free pages back to the kernel (glibc ``malloc_trim(0)``); no-op elsewhere."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def host_memory() -> str:
    """What ``keep_freed_memory`` did in this process (``DEFAULTS`` before any call)."""
    return _state[0]
