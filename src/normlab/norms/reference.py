"""Readable eager LayerNorm and RMSNorm: the oracle every other implementation is tested against.

The dtype policy follows the seed documents and HF's ``LlamaRMSNorm``: upcast the input to fp32,
compute the statistics and normalize in fp32, cast back to the input dtype, then scale (and shift).

Formulas (last dimension of size d, eps inside the square root):

* LayerNorm (Ba et al. 2016, arXiv:1607.06450):
  ``y = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias`` with the biased variance.
* RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467):
  ``y = x * rsqrt(mean(x^2) + eps) * weight``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


def layer_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    upcast: bool = True,
) -> torch.Tensor:
    """LayerNorm over the last dimension.

    Args:
        x: ``(..., d)`` any float dtype, any strides.
        weight, bias: ``(d,)`` or None.
        eps: added to the variance inside the square root, > 0.
        upcast: compute mean, variance and the normalization in at least fp32 (True) or in ``x.dtype``.

    Returns:
        ``(..., d)`` in ``x.dtype``.
    """
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32)) if upcast else x  # fp64 stays fp64
    mean = xs.mean(-1, keepdim=True)
    xc = xs - mean
    var = (xc * xc).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (xc * rstd).to(dtype)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    return y


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    upcast: bool = True,
) -> torch.Tensor:
    """RMSNorm over the last dimension.

    Args:
        x: ``(..., d)`` any float dtype, any strides.
        weight: ``(d,)`` or None.
        eps: added to the mean square inside the square root, > 0.
        upcast: compute the mean square and the normalization in at least fp32 (True) or in ``x.dtype``.

    Returns:
        ``(..., d)`` in ``x.dtype``.
    """
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32)) if upcast else x  # fp64 stays fp64
    rstd = torch.rsqrt((xs * xs).mean(-1, keepdim=True) + eps)
    y = (xs * rstd).to(dtype)
    if weight is not None:
        y = y * weight.to(dtype)
    return y


class NormBase(nn.Module):
    """Parameter layout shared by every implementation of one kind, so checkpoints move freely.

    ``weight``: ``(d,)`` initialised to ones when ``affine``; ``bias``: ``(d,)`` zeros when ``bias``.
    Both are None otherwise (registered as None, like ``nn.LayerNorm``).

    Raises:
        ValueError: ``bias=True`` for a kind without one (``takes_bias = False``: RMSNorm).
    """

    takes_bias: ClassVar[bool] = True

    def __init__(
        self, d: int, eps: float, affine: bool = True, bias: bool = False, upcast: bool = True
    ):
        if bias and not self.takes_bias:
            raise ValueError("RMSNorm has no bias")
        super().__init__()
        self.d, self.eps, self.upcast = d, float(eps), upcast
        self.register_parameter("weight", nn.Parameter(torch.ones(d)) if affine else None)
        self.register_parameter("bias", nn.Parameter(torch.zeros(d)) if (affine and bias) else None)

    def check_width(self, x: torch.Tensor) -> None:
        """Raise ValueError unless ``x`` is ``(..., d)`` (for kernels that would read out of bounds)."""
        if x.shape[-1] != self.d:
            raise ValueError(f"expected input (..., {self.d}), got {tuple(x.shape)}")

    def extra_repr(self) -> str:
        return (
            f"{self.d}, eps={self.eps:g}, affine={self.weight is not None}, "
            f"bias={self.bias is not None}, upcast={self.upcast}"
        )


class ReferenceLayerNorm(NormBase):
    """Eager LayerNorm with fp32 statistics; input and output ``(..., d)`` in the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_ref(x, self.weight, self.bias, self.eps, self.upcast)


class ReferenceRMSNorm(NormBase):
    """Eager RMSNorm with fp32 statistics; input and output ``(..., d)`` in the input dtype."""

    takes_bias = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_ref(x, self.weight, self.eps, self.upcast)
