"""The ``device`` marker of the norm contract, and one JSON line per finished test case when
``NORMLAB_CASES_JSONL`` names a file (``scripts/gpu_check.sh`` reads it: a step stopped by its
time limit still leaves every case that finished). In that mode the cases also run in order of
value: Triton first, other implementations next, ``compiled`` (cold inductor compiles) last."""

from __future__ import annotations

import json
import os

import pytest
import torch

from normlab.commands.gpu_report import impl_of

RANK = {"triton": 0, "other": 1, "compiled": 2}


#: This process is an xdist worker (its controller writes the cases); set at configure time, not
#: from the environment, which a pytest started from inside a worker inherits.
_WORKER = False


def pytest_configure(config):
    global _WORKER
    _WORKER = hasattr(config, "workerinput")
    config.addinivalue_line(
        "markers", "device: runs on NORMLAB_TEST_DEVICE (default cpu; the GPU check sets cuda)"
    )


def pytest_collection_modifyitems(config, items):
    if os.environ.get("NORMLAB_CASES_JSONL"):
        items.sort(key=lambda item: RANK[impl_of(item.nodeid)])  # stable: file order within a rank


def pytest_runtest_logreport(report):
    """Append ``{"case", "outcome", "seconds", "error"}`` for each test once its call phase (or a
    failed setup) is over, flushed at once; under xdist only the controller writes (the hook also
    runs in each worker: the case would be counted twice)."""
    path = os.environ.get("NORMLAB_CASES_JSONL")
    if not path or _WORKER:
        return
    if not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    error = None
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)  # the assertion's message
        error = (crash.message if crash else report.longreprtext.strip()).splitlines()[0][:500]
    row = {
        "case": report.nodeid.split("::", 1)[-1],
        "outcome": report.outcome,
        "seconds": round(report.duration, 3),
        "error": error,
    }
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def triton_device() -> torch.device:
    """``NORMLAB_TEST_DEVICE`` (default cpu) for a Triton test module, called at its import: the
    module is skipped where its kernels cannot run (a CPU session without the interpreter, or cuda
    without a CUDA device); interpreted on a CPU, compiled on the GPU check's device."""
    device = torch.device(os.environ.get("NORMLAB_TEST_DEVICE", "cpu"))
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton interpreter tests need a CPU session", allow_module_level=True)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("NORMLAB_TEST_DEVICE=cuda without a CUDA device", allow_module_level=True)
    return device
