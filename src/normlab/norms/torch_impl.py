"""PyTorch's own LayerNorm / RMSNorm ops behind normlab's shared parameter layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from normlab.norms.reference import NormBase


class TorchLayerNorm(NormBase):
    """``F.layer_norm`` (the op behind ``nn.LayerNorm``); ``(..., d)`` in, same shape and dtype
    out."""

    forward_ad = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)


class TorchRMSNorm(NormBase):
    """``F.rms_norm`` (the op behind ``nn.RMSNorm``); ``(..., d)`` in, same shape and dtype out.

    On CPU this op is not fused (about 20 kernels for forward+backward): see ``normlab-bench``.
    """

    takes_bias, forward_ad = False, True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.d,), self.weight, self.eps)
