"""Autocast context and gradient scaler per precision, and the check that the device can run it.

Parameters and optimizer state stay fp32 in every precision; ``bf16``/``fp16`` run the forward pass
under ``torch.autocast`` (matmuls in low precision, reductions and softmax in fp32 as autocast
decides). ``fp16`` adds a ``torch.amp.GradScaler`` against gradient underflow (Micikevicius et al.
2018, "Mixed Precision Training").
"""

from __future__ import annotations

import contextlib

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


def grad_scaler(cfg: PrecisionConfig, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for fp16 (a disabled one passes calls straight through)."""
    return torch.amp.GradScaler(
        device.type, init_scale=cfg.init_scale, enabled=cfg.dtype == Precision.fp16
    )
