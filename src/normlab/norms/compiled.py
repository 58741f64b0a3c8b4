"""``torch.compile`` of the reference norms, forward and backward each one compiled function.

An ``autograd.Function`` runs a compiled forward (the reference's arithmetic, also returning the
row sums behind the statistics, saved for the backward) and a compiled closed-form backward in the
statistics dtype (fp32, fp64 for fp64 input) that sums ``dweight`` / ``dbias`` in blocks of
``ROW_BLOCK`` rows. The forward compiles with ``emulate_precision_casts``, so ``before_weight``
rounds ``x_hat`` as the eager reference does. ``upcast=False`` compiles the whole reference.
eps is a Python float dynamo guards on: a new eps, shape or dtype recompiles (``dynamic=False``).

Why: docs/norms.md
"""

from __future__ import annotations

import torch

from normlab.norms.reference import (
    ReferenceLayerNorm,
    ReferenceRMSNorm,
    layer_norm_ref,
    rms_norm_ref,
)

#: Rows per block in the dweight / dbias reductions: each block's partial column sums stay in
#: vector registers while its rows stream through.
ROW_BLOCK = 16


def _col_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``(rows, d)`` over rows: partial sums of ``ROW_BLOCK`` rows, then over the partials
    (plus the rows left over when ``rows`` is not a multiple of ``ROW_BLOCK``)."""
    rows, d = t.shape
    main = rows - rows % ROW_BLOCK
    if main == 0:
        return t.sum(0)
    total = t[:main].view(-1, ROW_BLOCK, d).sum(1).sum(0)
    return total if main == rows else total + t[main:].sum(0)


def _scale(y_hat, weight, bias, dtype, after: bool):
    """The affine step of the reference (``reference._affine``'s value): ``before_weight`` rounds
    ``y_hat`` to ``dtype`` and multiplies (adds) there; ``after`` computes in ``y_hat``'s dtype and
    rounds once."""
    if after:
        y = y_hat if weight is None else y_hat * weight.to(y_hat.dtype)
        return (y if bias is None else y + bias.to(y_hat.dtype)).to(dtype)
    y = y_hat.to(dtype)
    y = y if weight is None else y * weight.to(dtype)
    return y if bias is None else y + bias.to(dtype)


def _rms_forward(x, weight, eps: float, after: bool = False):
    """(rows, d) -> ``rms_norm_ref(x, weight, eps)`` and the row sums of squares ``(rows, 1)``."""
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32))
    sum_sq = (xs * xs).sum(-1, keepdim=True)  # saved raw, not as rstd: one inductor sweep
    y_hat = xs * torch.rsqrt(sum_sq / x.shape[-1] + eps)  # rsqrt(mean(x^2) + eps)
    return _scale(y_hat, weight, None, dtype, after), sum_sq


def _rms_backward(dy, x, weight, sum_sq, eps: float, need_dw: bool):
    """dx = rstd (g - x_hat mean(g x_hat)) with g = dy * weight; dweight = sum over rows of
    dy x_hat."""
    ct = sum_sq.dtype
    rstd = torch.rsqrt(sum_sq / x.shape[-1] + eps)
    x_hat = x.to(ct) * rstd
    g = dy.to(ct) if weight is None else dy.to(ct) * weight.to(ct)
    dx = (rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))).to(x.dtype)
    dw = _col_sum(dy.to(ct) * x_hat).to(weight.dtype) if need_dw else None
    return dx, dw


def _layer_forward(x, weight, bias, eps: float, after: bool = False):
    """(rows, d) -> ``layer_norm_ref(x, weight, bias, eps)``, the row sums of x and of
    (x - mean)^2."""
    dtype = x.dtype
    d = x.shape[-1]
    xs = x.to(torch.promote_types(dtype, torch.float32))
    sum_x = xs.sum(-1, keepdim=True)
    xc = xs - sum_x / d
    sum_sq = (xc * xc).sum(-1, keepdim=True)
    y_hat = xc * torch.rsqrt(sum_sq / d + eps)  # (x - mean) rsqrt(var + eps)
    return _scale(y_hat, weight, bias, dtype, after), sum_x, sum_sq


def _layer_backward(
    dy, x, weight, sum_x, sum_sq, eps: float, need_dw: bool, bias_dtype: torch.dtype | None
):
    """dx = rstd (g - mean(g) - x_hat mean(g x_hat)); dweight = sum dy x_hat; dbias = sum dy."""
    ct = sum_sq.dtype
    d = x.shape[-1]
    rstd = torch.rsqrt(sum_sq / d + eps)
    x_hat = (x.to(ct) - sum_x / d) * rstd
    g = dy.to(ct) if weight is None else dy.to(ct) * weight.to(ct)
    dx = (rstd * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))).to(
        x.dtype
    )
    dw = _col_sum(dy.to(ct) * x_hat).to(weight.dtype) if need_dw else None
    db = _col_sum(dy.to(ct)).to(bias_dtype) if bias_dtype is not None else None
    return dx, dw, db


# Built at import (compilation itself happens on first call); this module is imported only when
# impl=compiled is chosen. Module-level callables, not a cache, so that dynamo can trace through
# them when the whole model is compiled too (``compile=true``).
_EXACT_CASTS = {"emulate_precision_casts": True}  # before_weight's rounding is kept (see above)
_rms_forward_c = torch.compile(_rms_forward, dynamic=False, options=_EXACT_CASTS)
_rms_backward_c = torch.compile(_rms_backward, dynamic=False)
_layer_forward_c = torch.compile(_layer_forward, dynamic=False, options=_EXACT_CASTS)
_layer_backward_c = torch.compile(_layer_backward, dynamic=False)
_rms_ref_c = torch.compile(rms_norm_ref, dynamic=False)
_layer_ref_c = torch.compile(layer_norm_ref, dynamic=False)


def compiled_layer_norm():
    """The compiled ``layer_norm_ref`` (autograd through it; used for ``upcast=False``)."""
    return _layer_ref_c


def compiled_rms_norm():
    """The compiled ``rms_norm_ref`` (autograd through it; used for ``upcast=False``)."""
    return _rms_ref_c


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _graph_backward(fn, dy, inputs, needs) -> list:
    """``create_graph=True``: the vector-Jacobian product of ``fn`` (the reference formula) at
    ``inputs``, a graph in the inputs and ``dy``; None where an input is None or needs no grad."""
    # not the compiled backward: its saved row sums are constants to autograd
    live = [t for t, need in zip(inputs, needs, strict=True) if t is not None and need]
    with torch.enable_grad():
        grads = iter(torch.autograd.grad(fn(*inputs), live, dy, create_graph=True))
    return [
        next(grads) if t is not None and need else None
        for t, need in zip(inputs, needs, strict=True)
    ]


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, after):
        y, sum_sq = _rms_forward_c(_rows(x), weight, eps, after)
        ctx.save_for_backward(x, weight, sum_sq)  # x itself: double backward differentiates in x
        ctx.eps, ctx.after = eps, after
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, sum_sq = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            fn = lambda x, w: rms_norm_ref(x, w, ctx.eps, after=ctx.after)  # noqa: E731
            return *_graph_backward(fn, dy, (x, weight), ctx.needs_input_grad[:2]), None, None
        need_dw = weight is not None and ctx.needs_input_grad[1]
        dx, dw = _rms_backward_c(_rows(dy), _rows(x), weight, sum_sq, ctx.eps, need_dw)
        return dx.view(dy.shape), dw, None, None


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, after):
        y, sum_x, sum_sq = _layer_forward_c(_rows(x), weight, bias, eps, after)
        ctx.save_for_backward(x, weight, bias, sum_x, sum_sq)
        ctx.eps, ctx.after = eps, after
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, sum_x, sum_sq = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            fn = lambda x, w, b: layer_norm_ref(x, w, b, ctx.eps, after=ctx.after)  # noqa: E731
            grads = _graph_backward(fn, dy, (x, weight, bias), ctx.needs_input_grad[:3])
            return *grads, None, None
        need_dw = weight is not None and ctx.needs_input_grad[1]
        bias_dtype = bias.dtype if bias is not None and ctx.needs_input_grad[2] else None
        dx, dw, db = _layer_backward_c(
            _rows(dy), _rows(x), weight, sum_x, sum_sq, ctx.eps, need_dw, bias_dtype
        )
        return dx.view(dy.shape), dw, db, None, None


class CompiledLayerNorm(ReferenceLayerNorm):
    """Reference LayerNorm, forward and backward compiled; same parameters, same results."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if not self.upcast:
            return compiled_layer_norm()(x, self.gain(), self.bias, self.eps, self.upcast)
        return _LayerNormFn.apply(x, self.gain(), self.bias, self.eps, self.after)


class CompiledRMSNorm(ReferenceRMSNorm):
    """Reference RMSNorm, forward and backward compiled; same parameters, same results."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if not self.upcast:
            return compiled_rms_norm()(x, self.gain(), self.eps, self.upcast)
        return _RMSNormFn.apply(x, self.gain(), self.eps, self.after)
