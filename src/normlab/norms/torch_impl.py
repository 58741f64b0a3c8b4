"""PyTorch's own LayerNorm / RMSNorm ops behind normlab's shared parameter layout.

bf16/fp16 input: ``cast=before_weight`` normalizes without the weight (``x_hat`` rounded) and
applies weight and bias in the input dtype, as the reference does; ``cast=after_weight`` passes
the weight to the op, which rounds once; a zero-centred gain runs the op on ``x.float()`` and casts
back (Gemma). fp32 / fp64: one fused call.

Why: docs/norms.md
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from normlab.norms.reference import NormBase


def _low(x: torch.Tensor) -> bool:
    return x.dtype in (torch.bfloat16, torch.float16)


def _torch_norm(norm: NormBase, x: torch.Tensor, op, bias: torch.Tensor | None) -> torch.Tensor:
    """``op(x, weight, bias)`` (the F call over the last dim) honouring the module's cast order and
    zero-centred gain; ``(..., d)`` in, same shape and dtype out."""
    gain = norm.gain()
    if _low(x) and not norm.after:  # before_weight: x_hat rounded first
        y = op(x, None, None)
        y = y if gain is None else y * gain.to(x.dtype)
        return y if bias is None else y + bias.to(x.dtype)
    if _low(x) and norm.zero_centered:  # an fp32 gain: the whole op in fp32, one rounding
        b = None if bias is None else bias.float()
        return op(x.float(), gain, b).to(x.dtype)
    return op(x, gain, bias)


class TorchLayerNorm(NormBase):
    """``F.layer_norm`` (the op behind ``nn.LayerNorm``); ``(..., d)`` in, same shape and dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = lambda x, w, b: F.layer_norm(x, (self.d,), w, b, self.eps)  # noqa: E731
        return _torch_norm(self, x, op, self.bias)


class TorchRMSNorm(NormBase):
    """``F.rms_norm`` (the op behind ``nn.RMSNorm``); ``(..., d)`` in, same shape and dtype out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = lambda x, w, b: F.rms_norm(x, (self.d,), w, self.eps)  # noqa: E731
        return _torch_norm(self, x, op, None)
