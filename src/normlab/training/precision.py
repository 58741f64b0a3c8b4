"""Autocast context and gradient scaler per precision, and the check that the device can run it.

Parameters and optimizer state stay fp32; ``bf16``/``fp16`` run the forward under
``torch.autocast``. ``fp16`` adds a ``GradScaler`` against gradient underflow (Micikevicius et al.
2018), whose skips from a run's first step are its calibration (``calibration_skips_max``).

Why: docs/running.md
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path

import torch

from normlab.config import ConfigError, Precision, PrecisionConfig

DTYPES = {
    Precision.fp32: torch.float32,
    Precision.bf16: torch.bfloat16,
    Precision.fp16: torch.float16,
}

log = logging.getLogger(__name__)

#: Where Linux lists the CPU's model and flags; the flags of native bf16 arithmetic in it
#: (x86: AVX512-BF16, AMX; Arm: BF16).
CPUINFO = Path("/proc/cpuinfo")
BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def emulated_bf16() -> str | None:
    """One line when ``CPUINFO`` lists flags but none of ``BF16_FLAGS`` (bf16 is emulated and
    slow there), naming the CPU; None when it has one, or the file lists no flags."""
    flags, model = set(), None
    with contextlib.suppress(OSError):
        for line in CPUINFO.read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key in ("flags", "Features"):
                flags |= set(value.split())
            model = model or (value if key == "model name" else None)
    if not flags or flags & BF16_FLAGS:
        return None
    return (
        f"precision=bf16 on {model or 'this CPU'}: no native bf16 (no avx512_bf16 or amx_bf16 in "
        f"{CPUINFO}), so bf16 is emulated, usually slower than fp32"
    )


def check_precision(precision: Precision, device: torch.device) -> None:
    """Run a tiny autocast matmul and backward in ``precision``; ConfigError if ``device`` can't,
    one warning if a CPU runs bf16 emulated (``emulated_bf16``)."""
    if precision == Precision.fp32:
        return
    dtype = DTYPES[precision]
    if device.type == "cuda" and precision == Precision.bf16 and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precision={precision.name} is not supported by {torch.cuda.get_device_name(device)}; "
            "allowed here: fp32, fp16"
        )
    try:
        a = torch.randn(8, 8, device=device, requires_grad=True)
        with torch.autocast(device_type=device.type, dtype=dtype):
            out = a @ a
        out.float().sum().backward()
        ok = out.dtype == dtype
    except (RuntimeError, AssertionError) as e:
        raise ConfigError(
            f"precision={precision.name} cannot run on device {device.type}: "
            f"{str(e).splitlines()[0]}"
        ) from None
    if not ok:
        raise ConfigError(
            f"precision={precision.name} cannot run on device {device.type}: autocast produced "
            f"{out.dtype}"
        )
    if device.type == "cpu" and precision == Precision.bf16 and (note := emulated_bf16()):
        log.warning("normlab: %s", note)


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward-pass context: ``torch.autocast`` for bf16/fp16, a no-op for fp32."""
    if precision == Precision.fp32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


#: The grad scaler multiplies its scale by this at each skipped step (torch's default).
BACKOFF = 0.5


def grad_scaler(cfg: PrecisionConfig, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for fp16 (a disabled one passes calls straight through)."""
    return torch.amp.GradScaler(
        device.type,
        init_scale=cfg.init_scale,
        backoff_factor=BACKOFF,
        enabled=cfg.dtype == Precision.fp16,
    )


def calibration_skips_max(cfg: PrecisionConfig) -> int:
    """The most start-up skips that are ``grad_scaler``'s calibration: step k skipped at
    ``init_scale * BACKOFF ** (k - 1)`` > 1 (16 for 2^16); 0 without a scaler."""
    if cfg.dtype != Precision.fp16:
        return 0
    scale, n = cfg.init_scale, 0
    while 1.0 < scale < math.inf:  # at scale 1 the overflow is the model's, not the scale's
        n, scale = n + 1, scale * BACKOFF
    return n
