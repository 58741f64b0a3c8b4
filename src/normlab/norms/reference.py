"""Readable eager LayerNorm and RMSNorm: the oracle every other implementation is tested against.

LayerNorm (Ba et al. 2016): ``(x - mean(x)) * rsqrt(var(x) + eps) * weight + bias``, biased var;
RMSNorm (Zhang & Sennrich 2019): ``x * rsqrt(mean(x^2) + eps) * weight``; over the last dim.
Dtypes as HF's ``LlamaRMSNorm``: statistics and normalization in fp32, cast back, then scale;
``cast=after_weight`` (Gemma / OLMo) scales in fp32 and rounds once; a ``zero_centered`` gain
``1 + w`` is added in fp32. Values round as eager ops round them; gradients are the unrounded
fp32 chain's (fp32 sums, cast once).

Why: docs/norms.md
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.autograd.forward_ad as fwAD
from torch import nn

from normlab.config import NormCast
from normlab.config.norm_table import IMPLS, JVP, KINDS
from normlab.norms import table_entry


def _affine(y_hat, weight, bias, dtype, after: bool = False):
    """``y_hat * weight + bias`` (``y_hat`` fp32 or fp64) in ``dtype``: the value rounded at each
    step as eager ops in ``dtype`` round it (once with ``after``); the gradient unrounded."""
    exact = y_hat
    exact = exact if weight is None else exact * weight.to(exact.dtype)
    exact = exact if bias is None else exact + bias.to(exact.dtype)
    if dtype == exact.dtype or after:
        return exact.to(dtype)
    with torch.no_grad():
        rounded = _affine_in_dtype(y_hat, weight, bias, dtype)
    return rounded + (exact - exact.detach()).to(dtype)  # value + exact 0; the graph of `exact`


def _affine_in_dtype(y_hat, weight, bias, dtype):
    """``upcast=False``: every step in ``dtype``, the gradients too (reproduces low precision)."""
    y = y_hat.to(dtype)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    return y


def layer_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    upcast: bool = True,
    after: bool = False,
) -> torch.Tensor:
    """LayerNorm of ``x (..., d)`` (any float dtype, strides) over the last dim, in ``x.dtype``;
    ``weight``, ``bias`` ``(d,)`` or None; ``upcast``: statistics and gradients in >= fp32, else all
    in ``x.dtype``; ``after``: ``cast=after_weight``, one rounding (needs ``upcast``)."""
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32)) if upcast else x  # fp64 stays fp64
    mean = xs.mean(-1, keepdim=True)
    xc = xs - mean
    var = (xc * xc).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    if not upcast:
        return _affine_in_dtype(xc * rstd, weight, bias, dtype)
    return _affine(xc * rstd, weight, bias, dtype, after)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    upcast: bool = True,
    after: bool = False,
) -> torch.Tensor:
    """RMSNorm of ``x (..., d)`` over the last dim, in ``x.dtype``; ``weight`` ``(d,)`` or None;
    ``upcast``, ``after`` as for ``layer_norm_ref``."""
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32)) if upcast else x  # fp64 stays fp64
    rstd = torch.rsqrt((xs * xs).mean(-1, keepdim=True) + eps)
    if not upcast:
        return _affine_in_dtype(xs * rstd, weight, None, dtype)
    return _affine(xs * rstd, weight, None, dtype, after)


def layer_norm_oracle(x, weight, bias, eps: float) -> torch.Tensor:
    """The float64 oracle of LayerNorm (Ba et al. 2016): ``(x - mean) / sqrt(var + eps) * w + b``,
    biased variance, over the last dimension; every input cast to float64, ``(..., d)`` float64
    out."""
    x = x.double()
    xc = x - x.mean(-1, keepdim=True)
    y = xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + eps)
    y = y if weight is None else y * weight.double()
    return y if bias is None else y + bias.double()


def rms_norm_oracle(x, weight, bias, eps: float) -> torch.Tensor:
    """The float64 oracle of RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * w``;
    ValueError for a bias."""
    if bias is not None:
        raise ValueError("RMSNorm has no bias")
    x = x.double()
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.double()


def forward_ad_active(*tensors: torch.Tensor | None) -> bool:
    """True when a tensor carries a forward-mode tangent (``torch.func.jvp`` or another functorch
    transform wraps it, or ``torch.autograd.forward_ad`` made it dual). False while compiling."""
    if torch.compiler.is_compiling():
        return False
    live = [t for t in tensors if t is not None]
    if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in live):
        return True
    return fwAD._current_level >= 0 and any(fwAD.unpack_dual(t).tangent is not None for t in live)


def refuse_double_backward(impl: str) -> None:
    """Call first in an ``autograd.Function.backward``: a one-line RuntimeError when grad mode is
    on there (only under ``create_graph=True``, which a fused backward cannot honour)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"norm.impl={impl} has no double backward (create_graph=True): its backward is a "
            "fused kernel; use norm.impl=reference, torch or compiled"
        )


class NormBase(nn.Module):
    """Parameter layout shared by every implementation of one kind, so checkpoints move freely.

    ``weight`` ``(d,)`` ones when ``affine`` (zeros, applied as ``1 + w``, when ``zero_centered``),
    ``bias`` ``(d,)`` zeros when ``bias``, else None. The class's table entry says which options it
    takes and ``forward_ad``; a class the table does not list takes every option. ValueError: a
    bias the kind lacks, an option the impl does not honour, ``zero_centered`` without ``affine``.
    """

    forward_ad: ClassVar[bool] = False  # for a class the table does not list

    def __init__(
        self,
        d: int,
        eps: float,
        affine: bool = True,
        bias: bool = False,
        upcast: bool = True,
        zero_centered: bool = False,
        cast: NormCast = NormCast.before_weight,
    ):
        self._refuse_options(bias, NormCast(cast), zero_centered, affine)
        super().__init__()
        _, impl = table_entry(type(self))
        if impl is not None:
            self.forward_ad = JVP in IMPLS[impl].autograd  # else check_input refuses tangents
        self.d, self.eps, self.upcast = d, float(eps), upcast
        self.zero_centered, self.cast = zero_centered, NormCast(cast)
        self.after = self.cast == NormCast.after_weight
        init = torch.zeros(d) if zero_centered else torch.ones(d)
        self.register_parameter("weight", nn.Parameter(init) if affine else None)
        self.register_parameter("bias", nn.Parameter(torch.zeros(d)) if (affine and bias) else None)

    def _refuse_options(
        self, bias: bool, cast: NormCast, zero_centered: bool, affine: bool
    ) -> None:
        name = type(self).__name__
        if zero_centered and not affine:
            raise ValueError(f"{name}: zero_centered needs affine=True (a weight to centre)")
        kind, impl = table_entry(type(self))
        if kind is None:
            return
        if bias and not KINDS[kind].bias:
            raise ValueError(f"{name} takes no bias (norm.kind={kind.name} has none)")
        for key, value in (("cast", cast), ("zero_centered", zero_centered)):
            if not IMPLS[impl].honours(key, value):
                shown = value.name if key == "cast" else "true"
                raise ValueError(f"{name} (impl={impl.name}) does not honour {key}={shown}")

    def gain(self) -> torch.Tensor | None:
        """The applied weight ``(d,)``: ``weight``, or ``1 + weight`` added in fp32 (fp64 for fp64
        parameters) when ``zero_centered`` (Gemma); None without ``affine``."""
        w = self.weight
        if w is None or not self.zero_centered:
            return w
        return 1.0 + w.to(torch.promote_types(w.dtype, torch.float32))

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError when ``x`` is not ``(..., d)`` or forward-mode tangents reach an
        implementation without forward AD (``forward_ad`` False)."""
        if x.shape[-1] != self.d:
            raise ValueError(
                f"{type(self).__name__}({self.d}) expects input (..., {self.d}), "
                f"got {tuple(x.shape)}"
            )
        if not self.forward_ad and forward_ad_active(x, self.weight, self.bias):
            raise ValueError(
                f"{type(self).__name__} has no forward-mode AD (torch.func.jvp, forward_ad dual "
                "tensors); use norm.impl=reference or torch"
            )

    def extra_repr(self) -> str:
        centred = ", zero_centered=True" if self.zero_centered else ""
        return (
            f"{self.d}, eps={self.eps:g}, affine={self.weight is not None}, "
            f"bias={self.bias is not None}, upcast={self.upcast}, cast={self.cast.name}{centred}"
        )


class ReferenceLayerNorm(NormBase):
    """Eager LayerNorm with fp32 statistics; input and output ``(..., d)`` in the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return layer_norm_ref(x, self.gain(), self.bias, self.eps, self.upcast, self.after)


class ReferenceRMSNorm(NormBase):
    """Eager RMSNorm with fp32 statistics; input and output ``(..., d)`` in the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return rms_norm_ref(x, self.gain(), self.eps, self.upcast, self.after)
