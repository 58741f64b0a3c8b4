"""The device's measured dense matmul peak, for MFU against what this machine can actually do.

``peak_tflops: auto`` resolves through ``device_peak_tflops``: the best of a few timed square
matmuls (``2 n^3`` FLOP each, PaLM appendix B) in the run's matmul dtype, cached in
``$NORMLAB_CACHE/peak.json`` per device, dtype, thread count and torch version.

Why: docs/benchmarks.md
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from normlab.data.tokens import default_cache_root

#: Square matmul sizes per device type, smallest first: large enough to reach the plateau. A size
#: whose call would take over ``MAX_CALL_S`` at the rate measured is not timed (slow dtypes stop).
SIZES = {"cpu": (256, 1024, 2048), "cuda": (1024, 4096, 8192)}
MAX_CALL_S = 0.5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cache_file() -> Path:
    """``$NORMLAB_CACHE/peak.json`` (default ``~/.cache/normlab/peak.json``)."""
    return default_cache_root() / "peak.json"


def device_name(device: torch.device) -> str:
    """What identifies the hardware: the CUDA device name, or the CPU's model and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores)"


def cache_key(device: torch.device, dtype: str) -> str:
    """One cache entry per device, matmul dtype, thread count and torch version."""
    threads = torch.get_num_threads()
    return f"{device_name(device)}|{dtype}|threads={threads}|torch={torch.__version__}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_tflops(device: torch.device, dtype: str, repeats: int = 5) -> float:
    """Best dense matmul TFLOP/s (``2 n^3`` FLOP per ``n x n @ n x n``) over ``SIZES``, ``repeats``
    timed calls each after a warm one; raises ValueError for a dtype not fp32, bf16, fp16."""
    if dtype not in DTYPES:
        raise ValueError(f"peak dtype {dtype!r} is not allowed: one of {', '.join(DTYPES)}")
    best = 0.0
    for n in SIZES[device.type] if device.type in SIZES else SIZES["cuda"]:
        if best > 0 and 2 * n**3 / (best * 1e12) > MAX_CALL_S:
            break  # this size would be slow at the rate measured: the rate is the peak
        a = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
        b = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
        torch.mm(a, b)
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e12)
    return best


def device_peak_tflops(device: torch.device, dtype: str, refresh: bool = False) -> dict:
    """The cached (or, when absent or ``refresh``, newly measured) peak of ``device`` in ``dtype``:
    ``{"tflops", "key", "measured_at", "cached"}``; a failing cache read or write is passed by."""
    path, key = cache_file(), cache_key(device, dtype)
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if not refresh and key in table:
        return {**table[key], "key": key, "cached": True}
    now = time.strftime("%Y-%m-%d %H:%M")
    entry = {"tflops": measure_tflops(device, dtype), "measured_at": now}
    table[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass
    return {**entry, "key": key, "cached": False}


#: Dense (no sparsity) bf16 tensor-core TFLOP/s from NVIDIA's datasheets, by a part of
#: ``torch.cuda.get_device_name``, most specific first: MFU's usual denominator.
DATASHEET_BF16_TFLOPS = (
    ("H200 NVL", 835.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H200", 989.0),  # SXM
    ("H100", 989.0),  # SXM (HBM3)
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
)


def datasheet_bf16_tflops(name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``name`` (``DATASHEET_BF16_TFLOPS``); None when the
    table does not know it (a CPU, another GPU)."""
    return next((tflops for part, tflops in DATASHEET_BF16_TFLOPS if part in name), None)


#: The matmul dtype of each autocast precision (``precision.dtype``).
PRECISION_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def resolve_peak(setting: float | int | str, device: torch.device, precision: str) -> dict:
    """``summary.json``'s ``{"peak_tflops", "peak_tflops_source", "peak_dtype"}`` for ``setting``
    ``"auto"`` (``device_peak_tflops``) or TFLOP/s; raises ValueError for another ``precision``."""
    if precision not in PRECISION_DTYPE:
        raise ValueError(f"precision {precision!r} is not allowed: one of {', '.join(DTYPES)}")
    dtype = PRECISION_DTYPE[precision]
    if setting == "auto":
        tflops, source = device_peak_tflops(device, dtype)["tflops"], "measured"
    else:
        tflops, source = float(setting), "configured"
    return {"peak_tflops": tflops, "peak_tflops_source": source, "peak_dtype": dtype}
