"""``norm.impl=triton``: the autograd function and the LayerNorm / RMSNorm modules over the fused
kernels of ``triton_kernels.py`` (semantics, dtype policy and backward formulas are documented
there). The kernels are looked up on their module at call time, so a test that reloads
``triton_kernels`` under ``TRITON_INTERPRET=1`` changes what these modules run.
"""

from __future__ import annotations

import torch

from normlab.norms import triton_kernels as tk
from normlab.norms.reference import NormBase, refuse_double_backward


class _TritonNormFn(torch.autograd.Function):
    """``(x (..., d), gain (d,)|None, bias (d,)|None, eps, is_rms, after) -> y (..., d)`` in
    x.dtype (``after``: ``cast=after_weight``; the gain is the weight, or its fp32 ``1 + w``).

    Saved for backward: the ``(rows, d)`` input, the weight, ``mean`` (LayerNorm only) and ``rstd``,
    both ``(rows,)`` fp32 (fp64 for float64 input).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps, is_rms, after):
        shape, d = x.shape, x.shape[-1]
        x2d = tk._rows(x, d)
        w = None if weight is None else weight.contiguous()
        b = None if bias is None else bias.contiguous()
        y, mean, rstd = tk.norm_fwd(x2d, w, b, eps, is_rms, after)
        ctx.save_for_backward(x2d, w, mean, rstd)
        ctx.is_rms, ctx.bias_dtype, ctx.after = is_rms, None if bias is None else bias.dtype, after
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        refuse_double_backward("triton")
        x2d, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = tk.norm_bwd(
            tk._rows(dy, x2d.shape[1]),
            x2d,
            w,
            ctx.bias_dtype is not None,
            mean,
            rstd,
            ctx.is_rms,
            ctx.after,
        )
        dx = dx.view(dy.shape)
        dw = None if dw is None or not ctx.needs_input_grad[1] else dw.to(w.dtype)
        db = None if db is None or not ctx.needs_input_grad[2] else db.to(ctx.bias_dtype)
        return dx if ctx.needs_input_grad[0] else None, dw, db, None, None, None


class TritonLayerNorm(NormBase):
    """Fused Triton LayerNorm; ``(..., d)`` in, same shape and dtype out. ``upcast`` is stored but
    statistics are always fp32 (``config.NormConfig`` forbids ``upcast=false`` for triton)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return _TritonNormFn.apply(x, self.gain(), self.bias, self.eps, False, self.after)


class TritonRMSNorm(NormBase):
    """Fused Triton RMSNorm; ``(..., d)`` in, same shape and dtype out; no bias. ``upcast`` is
    stored but statistics are always fp32."""

    takes_bias = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return _TritonNormFn.apply(x, self.gain(), None, self.eps, True, self.after)
