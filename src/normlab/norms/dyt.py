"""DyT, Dynamic Tanh (Zhu et al. 2025, arXiv:2503.10622): ``y = weight * tanh(alpha x) + bias``.

``alpha`` one learnable scalar ``(1,)`` (as the paper's code), ``weight`` / ``bias`` ``(d,)`` at
ones / zeros. No statistic, so no eps: the ``eps`` the table's signature passes is stored, unused.
``ReferenceDyT`` (eager, ``reference.py``'s dtype policy), ``CompiledDyT`` (compiled forward and
closed-form backward, as ``compiled.py``), ``TorchDyT`` (the paper's code in plain PyTorch ops).

Why: docs/norms.md
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.config import DEFAULT_ALPHA_INIT, NormCast
from normlab.norms.reference import NormBase, _affine, _affine_in_dtype


def dyt_ref(x, alpha, weight, bias, upcast: bool = True, after: bool = False) -> torch.Tensor:
    """DyT of ``x (..., d)``: ``weight * tanh(alpha x) + bias`` in ``x.dtype``; ``alpha`` ``(1,)``,
    ``weight``, ``bias`` ``(d,)`` or None; ``upcast``, ``after`` as for ``layer_norm_ref``."""
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32)) if upcast else x
    t = torch.tanh(alpha.to(xs.dtype) * xs)
    if not upcast:
        return _affine_in_dtype(t, weight, bias, dtype)
    return _affine(t, weight, bias, dtype, after)


def dyt_oracle(x, weight, bias, eps: float, alpha) -> torch.Tensor:
    """The float64 oracle of DyT (Zhu et al. 2025): ``tanh(alpha x) * w + b``, ``(..., d)`` float64;
    ``eps`` unused (the table's oracle signature)."""
    y = torch.tanh(alpha.double() * x.double())
    y = y if weight is None else y * weight.double()
    return y if bias is None else y + bias.double()


class ReferenceDyT(NormBase):
    """Eager DyT; ``(..., d)`` in, same shape and dtype out; parameters ``alpha`` ``(1,)`` (at
    ``alpha_init``, > 0), ``weight`` and ``bias`` as every norm."""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return dyt_ref(x, self.alpha, self.gain(), self.bias, self.upcast, self.after)

    def extra_repr(self) -> str:
        base = super().extra_repr().replace(f", eps={self.eps:g}", "")  # DyT has no eps
        return f"{base}, alpha={self.alpha.detach().flatten()[0].item():g}"


class TorchDyT(ReferenceDyT):
    """The paper's code (``tanh(alpha * x) * weight + bias``) in plain PyTorch ops, autograd through
    them: ``before_weight`` casts tanh to the input dtype first, ``after_weight`` casts once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        t = torch.tanh(self.alpha * x)
        gain, bias = self.gain(), self.bias
        if not self.after:  # t is fp32 (x times the fp32 alpha): round it first
            t, gain = t.to(x.dtype), None if gain is None else gain.to(x.dtype)
            bias = None if bias is None else bias.to(x.dtype)
        y = t if gain is None else t * gain
        return (y if bias is None else y + bias).to(x.dtype)


def _dyt_forward(x, alpha, weight, bias, after: bool):
    """(rows, d) -> ``dyt_ref`` (upcast) computed in one compiled sweep."""
    from normlab.norms.compiled import _scale

    xs = x.to(torch.promote_types(x.dtype, torch.float32))
    return _scale(torch.tanh(alpha.to(xs.dtype) * xs), weight, bias, x.dtype, after)


def _dyt_backward(dy, x, alpha, weight, need_dw: bool, bias_dtype):
    """dx = alpha g (1 - t^2), dalpha = sum(g x (1 - t^2)) ``(1,)``, dweight = sum_rows(dy t), dbias
    = sum_rows(dy) (None unless asked), g = dy weight; in at least fp32, cast once."""
    from normlab.norms.compiled import _col_sum

    ct = torch.promote_types(x.dtype, torch.float32)
    xs, dys, a = x.to(ct), dy.to(ct), alpha.to(ct)
    t = torch.tanh(a * xs)
    g = dys if weight is None else dys * weight.to(ct)
    dt = g * (1 - t * t)
    dx = (a * dt).to(x.dtype)
    dalpha = (dt * xs).sum().reshape(1).to(alpha.dtype)
    dw = _col_sum(dys * t).to(weight.dtype) if need_dw else None
    db = _col_sum(dys).to(bias_dtype) if bias_dtype is not None else None
    return dx, dalpha, dw, db


_EXACT_CASTS = {"emulate_precision_casts": True}  # before_weight's rounding kept (compiled.py)
_dyt_forward_c = torch.compile(_dyt_forward, dynamic=False, options=_EXACT_CASTS)
_dyt_backward_c = torch.compile(_dyt_backward, dynamic=False)
_dyt_ref_c = torch.compile(dyt_ref, dynamic=False)


class _DyTFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, weight, bias, after):
        ctx.save_for_backward(x, alpha, weight, bias)
        ctx.after = after
        rows = x.reshape(-1, x.shape[-1])
        return _dyt_forward_c(rows, alpha, weight, bias, after).view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        from normlab.norms.compiled import _graph_backward

        x, alpha, weight, bias = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():  # create_graph=True: through the reference formula
            fn = lambda x, a, w, b: dyt_ref(x, a, w, b, after=ctx.after)  # noqa: E731
            return *_graph_backward(fn, dy, (x, alpha, weight, bias), needs), None
        d = x.shape[-1]
        bias_dtype = bias.dtype if bias is not None and needs[3] else None
        dx, dalpha, dw, db = _dyt_backward_c(
            dy.reshape(-1, d),
            x.reshape(-1, d),
            alpha,
            weight,
            weight is not None and needs[2],
            bias_dtype,
        )
        return dx.view(dy.shape), dalpha if needs[1] else None, dw, db, None


class CompiledDyT(ReferenceDyT):
    """DyT with a compiled forward and a compiled closed-form backward; same parameters and results
    as ``ReferenceDyT`` (double backward through the reference formula, no forward AD)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if not self.upcast:
            return _dyt_ref_c(x, self.alpha, self.gain(), self.bias, self.upcast)
        return _DyTFn.apply(x, self.alpha, self.gain(), self.bias, self.after)
