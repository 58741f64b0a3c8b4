"""A CPU run keeps freed host memory in the process (``training.host_memory``): the same
activations every step cost no page faults (summary.json records the setting: test_cli.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from normlab.training import host_memory

# A fresh process with glibc's allocator as it comes (build_run's call to keep_freed_memory is
# made a no-op): the setup train builds for a tiny model, 2 warm-up steps, the minor page faults per
# step of 2 more; then keep_freed_memory(), 1 step to settle, the faults per step of 2 more.
FAULTS = """
import resource, torch
torch.set_num_threads(1)
import normlab.training.setup as setup
from normlab.studies.bench_step import build_setup
from normlab.training import host_memory
setup.keep_freed_memory = lambda: host_memory.DEFAULTS
s = build_setup(["model=tiny", "data.batch_size=32", "model.context_length=128", "device=cpu"])

def faults(warmup):
    for _ in range(warmup):
        s.run_step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(2):
        s.run_step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 2

default = faults(2)
setting = host_memory.keep_freed_memory()
print(default, faults(1), setting)
"""

glibc = pytest.mark.skipif(
    host_memory._libc() is None, reason="the C library is not glibc: nothing to set"
)


@glibc
def test_a_cpu_training_step_stops_page_faulting_its_activations_back_in():
    # Measured here (batch 32 x 128, three runs): 14,800-21,700 faults per step with glibc's
    # defaults, 9-521 kept (what is left is not malloc's: Python's own arenas, for one).
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True)
    default, kept, setting = out.stdout.strip().splitlines()[-1].split(" ", 2)
    assert setting == host_memory.KEPT
    assert int(default) > 2000, out.stdout
    assert int(kept) * 2 < int(default), out.stdout


@glibc
def test_keep_freed_memory_is_idempotent_and_reported():
    assert host_memory.keep_freed_memory() == host_memory.KEPT
    assert host_memory.keep_freed_memory() == host_memory.KEPT
    assert host_memory.host_memory() == host_memory.KEPT
    host_memory.release_freed_memory()  # trimming does not undo the setting
    assert host_memory.host_memory() == host_memory.KEPT
