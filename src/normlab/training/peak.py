"""The device's measured dense matmul peak, for MFU against what this machine can actually do.

``peak_tflops: auto`` resolves through :func:`device_peak_tflops`: the best of a few timed square
matmuls (``2 n^3`` FLOP each, PaLM appendix B counts a multiply-add as 2 FLOP) in the run's matmul
dtype, cached per machine in ``$NORMLAB_CACHE/peak.json`` (or ``~/.cache/normlab``), keyed by the
device name, dtype, thread count and torch version. ``normlab-bench peak`` prints and refreshes it.
A published peak (an A100's 312 TF/s bf16 dense) is what a vendor promises; the measured one is what
this build of torch reaches on this machine, so MFU against it says how much of the reachable
throughput the training step uses.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from normlab.data.tokens import default_cache_root

#: Square matmul sizes timed per device type, smallest first: large enough to reach the plateau,
#: small enough to finish in about a second (CPU: 2 n^3 = 17 GFLOP at n=2048). A size whose call
#: would take over :data:`MAX_CALL_S` at the rate already measured is not timed: a dtype without
#: fast matmuls on the device (fp16 on most CPUs: minutes at n=2048) stops at a small size.
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
    """Best dense matmul throughput in TFLOP/s (``2 n^3`` FLOP per ``n x n @ n x n``) over the
    sizes of :data:`SIZES` and ``repeats`` timed calls each, after one untimed call per size; a
    size predicted to take over :data:`MAX_CALL_S` a call at the best rate so far ends it.

    Raises:
        ValueError: ``dtype`` is not one of fp32, bf16, fp16.
    """
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
    """The cached (or, when absent or ``refresh``, newly measured) peak of ``device`` in ``dtype``.

    Returns ``{"tflops": float, "key": str, "measured_at": str, "cached": bool}``; ``tflops`` is
    TFLOP/s. A cache file that cannot be read is measured anew; one that cannot be written is left.
    """
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


#: The matmul dtype of each autocast precision (``precision.dtype``).
PRECISION_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def resolve_peak(setting: float | int | str, device: torch.device, precision: str) -> dict:
    """The peak MFU is reported against: ``setting`` is ``peak_tflops`` (``"auto"`` or TFLOP/s).

    ``"auto"``: :func:`device_peak_tflops` of ``device`` in the run's matmul dtype (``precision``:
    fp32, bf16 or fp16), from the per-machine cache or measured once (about 1-2 s on a CPU core).
    Returns ``{"peak_tflops": float, "peak_tflops_source": "measured" | "configured",
    "peak_dtype": str}``, the keys ``summary.json`` records.

    Raises:
        ValueError: ``precision`` is not fp32, bf16 or fp16.
    """
    if precision not in PRECISION_DTYPE:
        raise ValueError(f"precision {precision!r} is not allowed: one of {', '.join(DTYPES)}")
    dtype = PRECISION_DTYPE[precision]
    if setting == "auto":
        tflops, source = device_peak_tflops(device, dtype)["tflops"], "measured"
    else:
        tflops, source = float(setting), "configured"
    return {"peak_tflops": tflops, "peak_tflops_source": source, "peak_dtype": dtype}
