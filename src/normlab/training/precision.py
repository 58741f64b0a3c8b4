"""Autocast context and gradient scaler per precision, and the check that the device can run it.

Parameters and optimizer state stay fp32 in every precision; ``bf16``/``fp16`` run the forward pass
under ``torch.autocast`` (matmuls in low precision, reductions and softmax in fp32 as autocast
decides). ``fp16`` adds a ``torch.amp.GradScaler`` against gradient underflow (Micikevicius et al.
2018, "Mixed Precision Training"). The scaler starts at ``init_scale`` and halves the scale at each
step whose gradients overflow, skipping that step: the skips from a run's first step, before any
step succeeds, are the scaler finding its scale (:func:`calibration_skips_max`), not instability.
"""

from __future__ import annotations

import contextlib
import math

import torch

from normlab.config import ConfigError, Precision, PrecisionConfig

DTYPES = {
    Precision.fp32: torch.float32,
    Precision.bf16: torch.bfloat16,
    Precision.fp16: torch.float16,
}


def check_precision(precision: Precision, device: torch.device) -> None:
    """Run one tiny autocast matmul and its backward in ``precision`` on ``device``.

    Raises:
        ConfigError: the device cannot run that precision (one line, before any training).
    """
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
    """The most skipped steps at the start of a run that are :func:`grad_scaler`'s calibration:
    it skips step k (1-based, every step before it skipped) at ``init_scale * BACKOFF ** (k - 1)``,
    and a skip counts as calibration while that scale is above 1 (16 for the default 2^16). Past
    that, scaling the loss down no longer helps: the overflow is the model's. 0 without a scaler
    (fp32, bf16)."""
    if cfg.dtype != Precision.fp16:
        return 0
    scale, n = cfg.init_scale, 0
    while 1.0 < scale < math.inf:
        n, scale = n + 1, scale * BACKOFF
    return n
