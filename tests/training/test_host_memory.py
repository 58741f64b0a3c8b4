"""A CPU run keeps freed host memory in the process (``training.host_memory``): a freed block
comes back without page faults (summary.json records the setting: test_cli.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from normlab.training import host_memory

# A fresh process: malloc, write and free a 64 MiB block 4 times and count the minor page faults of
# the last 3, first with glibc's allocator as it comes, then after keep_freed_memory(). 64 MiB is
# over glibc's largest dynamic mmap threshold (32 MiB), so with the defaults every block is a
# fresh mmap, faulted in page by page and unmapped on free: what a step's large activations met.
# (The effect on a whole training step is measured, not tested: glibc's dynamic threshold makes
# the default's count vary from 2 to 21,700 faults per step of the tiny model; README.)
FAULTS = """
import ctypes, resource
from normlab.training import host_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 64 * 2**20

def faults():
    counts = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(SIZE)
        ctypes.memset(block, 1, SIZE)
        libc.free(block)
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sum(counts[1:])

default = faults()
setting = host_memory.keep_freed_memory()
print(default, faults(), setting)
"""

glibc = pytest.mark.skipif(
    host_memory._libc() is None, reason="the C library is not glibc: nothing to set"
)


@glibc
def test_kept_memory_gives_a_freed_64_mib_block_back_without_page_faults():
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True)
    default, kept, setting = out.stdout.strip().splitlines()[-1].split(" ", 2)
    pages = 3 * 64 * 2**20 // 4096  # the 3 counted blocks, 16,384 pages each
    assert setting == host_memory.KEPT
    assert int(default) >= 0.9 * pages, out.stdout  # every page faulted in again
    assert int(kept) <= 0.05 * pages, out.stdout  # the same heap pages reused


@glibc
def test_keep_freed_memory_is_idempotent_and_reported():
    assert host_memory.keep_freed_memory() == host_memory.KEPT
    assert host_memory.keep_freed_memory() == host_memory.KEPT
    assert host_memory.host_memory() == host_memory.KEPT
    host_memory.release_freed_memory()  # trimming does not undo the setting
    assert host_memory.host_memory() == host_memory.KEPT
