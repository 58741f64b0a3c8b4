"""Derf, Dynamic erf (Chen et al. 2025, arXiv:2512.10938): ``weight * erf(alpha x + s) + bias``.

``alpha`` (at ``norm.alpha_init``) and ``s`` (at 0) learnable scalars ``(1,)``, ``weight`` /
``bias`` ``(d,)`` at ones / zeros. No statistic, so no eps. ``ReferenceDerf`` (eager,
``reference.py``'s dtype policy) and ``CompiledDerf`` (compiled forward and closed-form backward,
as ``compiled.py``); no ``torch`` implementation.

Why: docs/norms.md
"""

from __future__ import annotations

import math

import torch
from torch import nn

from normlab.config import DEFAULT_ALPHA_INIT, NormCast
from normlab.norms.compiled import _col_sum, _graph_backward, _scale
from normlab.norms.reference import NormBase, _affine, _affine_in_dtype

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def derf_ref(x, alpha, shift, weight, bias, upcast: bool = True, after: bool = False):
    """Derf of ``x (..., d)``: ``weight * erf(alpha x + shift) + bias`` in ``x.dtype``; ``alpha``,
    ``shift`` ``(1,)``; ``weight``, ``bias`` ``(d,)`` or None; ``upcast``, ``after`` as DyT's."""
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32)) if upcast else x
    t = torch.erf(alpha.to(xs.dtype) * xs + shift.to(xs.dtype))
    if not upcast:
        return _affine_in_dtype(t, weight, bias, dtype)
    return _affine(t, weight, bias, dtype, after)


def derf_oracle(x, weight, bias, eps: float, alpha, shift) -> torch.Tensor:
    """The float64 oracle of Derf (Chen et al. 2025): ``erf(alpha x + s) * w + b``, ``(..., d)``
    float64; ``eps`` unused (the table's oracle signature)."""
    y = torch.erf(alpha.double() * x.double() + shift.double())
    y = y if weight is None else y * weight.double()
    return y if bias is None else y + bias.double()


class ReferenceDerf(NormBase):
    """Eager Derf; ``(..., d)`` in, same shape and dtype out; parameters ``alpha`` ``(1,)`` (at
    ``alpha_init``, > 0), ``shift`` ``(1,)`` (at 0), ``weight`` and ``bias`` as every norm."""

    def __init__(
        self,
        d: int,
        eps: float,
        affine: bool = True,
        bias: bool = False,
        upcast: bool = True,
        zero_centered: bool = False,
        cast: NormCast = NormCast.before_weight,
        alpha_init: float = DEFAULT_ALPHA_INIT,
    ):
        if not alpha_init > 0:
            raise ValueError(f"{type(self).__name__}: alpha_init={alpha_init!r} must be > 0")
        super().__init__(d, eps, affine, bias, upcast, zero_centered, cast)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.shift = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return derf_ref(x, self.alpha, self.shift, self.gain(), self.bias, self.upcast, self.after)

    def extra_repr(self) -> str:
        base = super().extra_repr().replace(f", eps={self.eps:g}", "")  # Derf has no eps
        a, s = self.alpha.detach().flatten()[0].item(), self.shift.detach().flatten()[0].item()
        return f"{base}, alpha={a:g}, shift={s:g}"


def _derf_forward(x, alpha, shift, weight, bias, after: bool):
    """(rows, d) -> ``derf_ref`` (upcast) computed in one compiled sweep."""
    xs = x.to(torch.promote_types(x.dtype, torch.float32))
    t = torch.erf(alpha.to(xs.dtype) * xs + shift.to(xs.dtype))
    return _scale(t, weight, bias, x.dtype, after)


def _derf_backward(dy, x, alpha, shift, weight, need_dw: bool, bias_dtype):
    """z = alpha x + s, dz = dy w 2/sqrt(pi) exp(-z^2): dx = alpha dz, dalpha = sum(dz x), ds =
    sum(dz) ``(1,)``, dweight = sum_rows(dy erf(z)), dbias (None unless asked); >= fp32, cast."""
    ct = torch.promote_types(x.dtype, torch.float32)
    xs, dys, a = x.to(ct), dy.to(ct), alpha.to(ct)
    z = a * xs + shift.to(ct)
    g = dys if weight is None else dys * weight.to(ct)
    dz = g * _TWO_OVER_SQRT_PI * torch.exp(-z * z)
    dx = (a * dz).to(x.dtype)
    dalpha = (dz * xs).sum().reshape(1).to(alpha.dtype)
    dshift = dz.sum().reshape(1).to(shift.dtype)
    dw = _col_sum(dys * torch.erf(z)).to(weight.dtype) if need_dw else None
    db = _col_sum(dys).to(bias_dtype) if bias_dtype is not None else None
    return dx, dalpha, dshift, dw, db


_EXACT_CASTS = {"emulate_precision_casts": True}  # before_weight's rounding kept (compiled.py)
_derf_forward_c = torch.compile(_derf_forward, dynamic=False, options=_EXACT_CASTS)
_derf_backward_c = torch.compile(_derf_backward, dynamic=False)
_derf_ref_c = torch.compile(derf_ref, dynamic=False)


class _DerfFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, shift, weight, bias, after):
        ctx.save_for_backward(x, alpha, shift, weight, bias)
        ctx.after = after
        rows = x.reshape(-1, x.shape[-1])
        return _derf_forward_c(rows, alpha, shift, weight, bias, after).view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, alpha, shift, weight, bias = ctx.saved_tensors
        needs = ctx.needs_input_grad[:5]
        if torch.is_grad_enabled():  # create_graph=True: through the reference formula
            fn = lambda x, a, s, w, b: derf_ref(x, a, s, w, b, after=ctx.after)  # noqa: E731
            return *_graph_backward(fn, dy, (x, alpha, shift, weight, bias), needs), None
        d = x.shape[-1]
        bias_dtype = bias.dtype if bias is not None and needs[4] else None
        need_dw = weight is not None and needs[3]
        dx, dalpha, dshift, dw, db = _derf_backward_c(
            dy.reshape(-1, d), x.reshape(-1, d), alpha, shift, weight, need_dw, bias_dtype
        )
        return (
            dx.view(dy.shape),
            dalpha if needs[1] else None,
            dshift if needs[2] else None,
            dw,
            db,
            None,
        )


class CompiledDerf(ReferenceDerf):
    """Derf with a compiled forward and a compiled closed-form backward; same parameters and
    results as ``ReferenceDerf`` (double backward through the reference formula, no forward AD)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        gain = self.gain()
        if not self.upcast:
            return _derf_ref_c(x, self.alpha, self.shift, gain, self.bias, self.upcast)
        return _DerfFn.apply(x, self.alpha, self.shift, gain, self.bias, self.after)
