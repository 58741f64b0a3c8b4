"""Host memory of a CPU run: keep what PyTorch's CPU allocator frees inside the process.

PyTorch's CPU allocator is plain ``malloc``. With glibc's defaults, blocks over the (dynamic) mmap
threshold get their own ``mmap`` and go back to the kernel when freed, and the heap top is trimmed:
the next step asks for the same activations again and page-faults every 4 KiB page of them back in,
zero-filled: thousands of minor page faults per training step (glibc's threshold adapts, so the
count varies from process to process; measured counts belong in docs/results). ``build_run`` calls
:func:`keep_freed_memory` for every CPU run, so ``train`` and ``normlab-bench`` time the same
allocator behaviour; ``free_memory`` (after each run) calls :func:`release_freed_memory`, so the
next job of a multirun starts from a trimmed heap.
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
    """Ask glibc to keep freed memory in the process: ``mallopt(M_MMAP_MAX, 0)`` (no ``mmap`` per
    large block) and ``mallopt(M_TRIM_THRESHOLD, 2**31 - 1)`` (no trimming of the heap top).
    Idempotent. Returns what was done (:data:`KEPT`, or :data:`NOT_GLIBC` where the C library is
    not glibc), also what :func:`host_memory` reports from then on."""
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
    """What :func:`keep_freed_memory` did in this process (:data:`DEFAULTS` before any call)."""
    return _state[0]
