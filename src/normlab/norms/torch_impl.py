"""PyTorch's own LayerNorm / RMSNorm ops behind normlab's shared parameter layout.

``F.layer_norm`` / ``F.rms_norm`` given the weight round once, at the end: ``cast=after_weight``
(with a bf16/fp16 input and an fp32 weight they compute in fp32, unfused). For
``cast=before_weight`` with a bf16/fp16 input the op normalizes without the weight (``x_hat``
rounded to the input dtype) and the weight (and bias) follow in the input dtype, as the reference
does. In fp32 / fp64 the two orders are one formula and take the single fused call. A zero-centred
gain ``1 + w`` is fp32: with a low-precision input the ``after_weight`` call then runs on the fp32
upcast of x (Gemma's ``norm(x.float()) * (1 + w.float())``) and casts back.
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
    """``F.layer_norm`` (the op behind ``nn.LayerNorm``); ``(..., d)`` in, same shape and dtype
    out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = lambda x, w, b: F.layer_norm(x, (self.d,), w, b, self.eps)  # noqa: E731
        return _torch_norm(self, x, op, self.bias)


class TorchRMSNorm(NormBase):
    """``F.rms_norm`` (the op behind ``nn.RMSNorm``); ``(..., d)`` in, same shape and dtype out.

    On CPU this op is not fused (many small kernels for forward+backward): see ``normlab-bench``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = lambda x, w, b: F.rms_norm(x, (self.d,), w, self.eps)  # noqa: E731
        return _torch_norm(self, x, op, None)
