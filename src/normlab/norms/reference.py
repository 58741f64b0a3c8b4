"""Readable eager LayerNorm and RMSNorm: the oracle every other implementation is tested against.

The dtype policy follows the seed documents and HF's ``LlamaRMSNorm``: upcast the input to fp32,
compute the statistics and normalize in fp32, cast back to the input dtype, then scale (and shift).
Those roundings shape the value only: the gradients are those of the unrounded fp32 chain (fp32
sums, cast once), so the reference is the most exact oracle for bf16 / fp16 gradients too.

``cast=after_weight`` (Gemma / OLMo) instead multiplies by the weight and adds the bias in fp32 and
rounds once. ``zero_centered``: the weight is stored as w and applied as the gain ``1 + w``, added
in fp32 (fp64 for fp64 parameters) whatever the parameter dtype (:meth:`NormBase.gain`); with
``before_weight`` that fp32 gain is then rounded to the input dtype like any weight.

Formulas (last dimension of size d, eps inside the square root):

* LayerNorm (Ba et al. 2016, arXiv:1607.06450):
  ``y = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias`` with the biased variance.
* RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467):
  ``y = x * rsqrt(mean(x^2) + eps) * weight``.
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
    """``y_hat * weight + bias`` (``y_hat`` in fp32, or fp64) returned in ``dtype``.

    Value: eager low-precision arithmetic, each step rounded to ``dtype`` (``y_hat``, the product,
    the sum), as ``y_hat.to(dtype) * weight.to(dtype) + bias.to(dtype)`` computes it. Gradient:
    that of the unrounded ``y_hat * weight + bias`` in ``y_hat.dtype``, so dx, dweight and dbias
    are fp32 sums (fp64 for fp64 input) cast once to the input / parameter dtype, never rounded to
    bf16 / fp16 on the way: the oracle the fused kernels are checked against is the most exact.
    ``rounded + (exact - exact)`` adds an exact zero to the value and the identity to the graph.
    ``after`` (``cast=after_weight``): the value is the exact chain rounded once to ``dtype``.
    """
    exact = y_hat
    exact = exact if weight is None else exact * weight.to(exact.dtype)
    exact = exact if bias is None else exact + bias.to(exact.dtype)
    if dtype == exact.dtype or after:
        return exact.to(dtype)
    with torch.no_grad():
        rounded = _affine_in_dtype(y_hat, weight, bias, dtype)
    return rounded + (exact - exact.detach()).to(dtype)


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
    """LayerNorm over the last dimension.

    Args:
        x: ``(..., d)`` any float dtype, any strides.
        weight, bias: ``(d,)`` or None.
        eps: added to the variance inside the square root, > 0.
        upcast: statistics, normalization and gradients in at least fp32 (True; bf16/fp16 values
            are rounded where eager ops round them, gradients are not) or all in ``x.dtype``.
        after: ``cast=after_weight``: the affine step in fp32, one rounding (needs ``upcast``).

    Returns:
        ``(..., d)`` in ``x.dtype``.
    """
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
    """RMSNorm over the last dimension.

    Args:
        x: ``(..., d)`` any float dtype, any strides.
        weight: ``(d,)`` or None.
        eps: added to the mean square inside the square root, > 0.
        upcast, after: as for :func:`layer_norm_ref`.

    Returns:
        ``(..., d)`` in ``x.dtype``.
    """
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
    """The float64 oracle of RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * w``.

    Raises:
        ValueError: a bias (RMSNorm has none).
    """
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
    """Call first in an ``autograd.Function.backward``: grad mode is on there only under
    ``create_graph=True``, which this backward cannot honour.

    Raises:
        RuntimeError: one line naming the implementation and the alternatives.
    """
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"norm.impl={impl} has no double backward (create_graph=True): its backward is a "
            "fused kernel; use norm.impl=reference, torch or compiled"
        )


class NormBase(nn.Module):
    """Parameter layout shared by every implementation of one kind, so checkpoints move freely.

    ``weight``: ``(d,)`` initialised to ones when ``affine`` (zeros when ``zero_centered``: it is
    applied as ``1 + w``, see :meth:`gain`); ``bias``: ``(d,)`` zeros when ``bias``.
    Both are None otherwise (registered as None, like ``nn.LayerNorm``). ``cast``: a
    :class:`~normlab.config.NormCast` (``after``: True for ``after_weight``).

    What the class may be asked for is the norm table's, looked up by the class itself (the
    ``(kind, impl)`` entry naming it): a bias only if ``Kind.bias``, the ``cast`` /
    ``zero_centered`` its ``Impl`` honours; ``forward_ad`` (the implementation computes
    forward-mode AD, plain differentiable torch ops) is ``JVP in Impl.autograd``, so that a kernel
    behind an ``autograd.Function`` refuses tangents in :meth:`check_input` instead of returning
    zeros. A class the table does not list (a test's) takes a bias and every option, and keeps its
    class attribute ``forward_ad``.

    Raises:
        ValueError: ``bias=True`` for a kind without one; a ``cast`` or ``zero_centered`` the
            class's implementation does not honour; ``zero_centered`` without ``affine``.
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
            self.forward_ad = JVP in IMPLS[impl].autograd
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
        parameters) when ``zero_centered`` (Gemma's ``1 + w.float()``: in bf16, 1 + 3.140625 would
        round to 4.125; in fp32 it is exactly 4.140625). None without ``affine``."""
        w = self.weight
        if w is None or not self.zero_centered:
            return w
        return 1.0 + w.to(torch.promote_types(w.dtype, torch.float32))

    def check_input(self, x: torch.Tensor) -> None:
        """Refuse what this implementation would compute wrongly.

        Raises:
            ValueError: ``x`` is not ``(..., d)``; or forward-mode tangents reach an
                implementation without forward AD (``forward_ad = False``).
        """
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
