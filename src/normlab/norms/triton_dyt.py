"""``norm.impl=triton`` for DyT (``dyt.py``): fused Triton forward and backward kernels, their
autograd function and the module. Imported only when chosen (``norms.table.KINDS``); kernels launch
on ``x.device``: CUDA, or CPU tensors when ``TRITON_INTERPRET=1`` was set before this module loaded.

Forward, per element, in fp32 (fp64 for float64 input): ``t = tanh(alpha x)``, then the
``norm.cast`` order of ``triton_kernels.py``: ``before_weight`` rounds t to the input dtype,
multiplies by the gain rounded to it (and adds the bias), each step rounded; ``after_weight``
computes ``t * gain + bias`` and rounds once. ``tanh(z) = sign(z) (1 - e) / (1 + e)`` with
``e = exp(-2|z|)`` (no overflow; absolute error ~1e-7 in fp32 near 0, where ``t ~ z``).

Backward with ``g = dy * gain`` (rounded as in the forward for ``before_weight``):
``dx = alpha g (1 - t^2)``, ``dalpha = sum(g x (1 - t^2))``, ``dweight = sum_rows(dy t)``,
``dbias = sum_rows(dy)``: each program keeps fp32 partial sums (a column row for dweight / dbias,
a scalar for dalpha) and torch sums the partials in fp32; only the results are cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from normlab.norms import triton_kernels as tk
from normlab.norms.dyt import ReferenceDyT
from normlab.norms.reference import refuse_double_backward
from normlab.norms.triton_kernels import _round_to


@triton.jit
def _tanh(z):
    e = tl.exp(-2.0 * tl.abs(z))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(z < 0, -t, t)


@triton.jit
def _dyt_fwd(
    X,
    Y,
    A,
    W,
    B,
    stride_x,
    stride_y,
    n_rows,
    N,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    AFTER: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program computes BLOCK_M rows of Y (n_rows, N)."""
    IO: tl.constexpr = Y.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    rows64 = rows[:, None].to(tl.int64)
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
    t = _tanh(tl.load(A).to(ACC) * x)
    if AFTER:
        y = t
        if HAS_W:
            y = y * tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
        if HAS_B:
            y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
        y = _round_to(y, IO)
    else:
        y = _round_to(t, IO)
        if HAS_W:
            w = _round_to(tl.load(W + cols, mask=col_ok, other=0.0).to(ACC), IO)
            y = _round_to(y * w[None, :], IO)
        if HAS_B:
            b = _round_to(tl.load(B + cols, mask=col_ok, other=0.0).to(ACC), IO)
            y = _round_to(y + b[None, :], IO)
    tl.store(Y + rows64 * stride_y + cols[None, :], y.to(IO), mask=mask)


@triton.jit
def _dyt_bwd(
    X,
    DY,
    DX,
    A,
    W,
    DA,
    DW,
    DB,
    stride_x,
    stride_dy,
    stride_dx,
    n_rows,
    N,
    tiles_per_program,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    AFTER: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program p handles row tiles p, p + P, ...; stores DX and its partial sums DA[p], DW[p, :],
    DB[p, :] (ACC)."""
    IO: tl.constexpr = DX.dtype.element_ty
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    a = tl.load(A).to(ACC)
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)
        if not AFTER:
            w = _round_to(w, IO)
    da = tl.zeros((BLOCK_N,), dtype=ACC)
    dw = tl.zeros((BLOCK_N,), dtype=ACC)
    db = tl.zeros((BLOCK_N,), dtype=ACC)
    for i in range(0, tiles_per_program):
        rows = (pid + i * n_programs) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        rows64 = rows[:, None].to(tl.int64)
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
        dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(ACC)
        t = _tanh(a * x)
        if HAS_W:
            g = dy * w[None, :]
            if AFTER:
                dw += tl.sum(dy * t, axis=0)
            else:
                dw += tl.sum(dy * _round_to(t, IO), axis=0)
        else:
            g = dy
        dt = g * (1.0 - t * t)
        da += tl.sum(dt * x, axis=0)
        if HAS_B:
            db += tl.sum(dy, axis=0)
        tl.store(DX + rows64 * stride_dx + cols[None, :], _round_to(a * dt, IO).to(IO), mask=mask)
    tl.store(DA + pid, tl.sum(da, axis=0))
    if HAS_W:
        tl.store(DW + pid * N + cols, dw, mask=col_ok)
    if HAS_B:
        tl.store(DB + pid * N + cols, db, mask=col_ok)


def _meta(x, weight, bias, after: bool) -> dict:
    block_m, block_n, num_warps = tk._launch_config(x.shape[0], x.shape[1], x)
    flags = {"HAS_W": weight is not None, "HAS_B": bias is not None, "AFTER": after}
    return {
        **flags,
        "ACC": tk._acc(x),
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "num_warps": num_warps,
    }


def dyt_fwd(x, alpha, weight, bias, after: bool) -> torch.Tensor:
    """``x`` ``(rows, d)`` (unit column stride) -> ``y`` ``(rows, d)`` in x.dtype."""
    y = torch.empty_like(x)
    if x.shape[0] == 0:
        return y
    meta = _meta(x, weight, bias, after)
    grid = (triton.cdiv(x.shape[0], meta["BLOCK_M"]),)
    with tk._device(x):
        _dyt_fwd[grid](
            x,
            y,
            alpha,
            x if weight is None else weight,
            x if bias is None else bias,
            x.stride(0),
            y.stride(0),
            x.shape[0],
            x.shape[1],
            **meta,
        )
    return y


def dyt_bwd(dy, x, alpha, weight, has_bias: bool, after: bool):
    """``(rows, d)`` tensors -> ``dx`` (x.dtype) and the fp32 (fp64 for float64 x) sums
    ``dalpha`` ``(1,)``, ``dweight`` / ``dbias`` ``(d,)`` (None without weight / bias)."""
    n_rows, d = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    dx = torch.empty_like(x)
    meta = _meta(x, weight, x if has_bias else None, after)
    n_tiles = max(1, triton.cdiv(n_rows, meta["BLOCK_M"]))
    n_sm = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    programs = min(n_tiles, 4 * n_sm)
    da = torch.zeros(programs, dtype=acc, device=x.device)
    dw = torch.zeros(programs, d, dtype=acc, device=x.device) if weight is not None else None
    db = torch.zeros(programs, d, dtype=acc, device=x.device) if has_bias else None
    if n_rows:
        with tk._device(x):
            _dyt_bwd[(programs,)](
                x,
                dy,
                dx,
                alpha,
                x if weight is None else weight,
                da,
                da if dw is None else dw,
                da if db is None else db,
                x.stride(0),
                dy.stride(0),
                dx.stride(0),
                n_rows,
                d,
                triton.cdiv(n_tiles, programs),
                **meta,
            )
    return (
        dx,
        da.sum(0, keepdim=True),
        None if dw is None else dw.sum(0),
        None if db is None else db.sum(0),
    )


class _TritonDyTFn(torch.autograd.Function):
    """``(x (..., d), alpha (1,), gain (d,)|None, bias (d,)|None, after) -> y (..., d)``."""

    @staticmethod
    def forward(ctx, x, alpha, weight, bias, after):
        x2d = tk._rows(x, x.shape[-1])
        w = None if weight is None else weight.contiguous()
        b = None if bias is None else bias.contiguous()
        ctx.save_for_backward(x2d, alpha, w)
        ctx.after, ctx.bias_dtype = after, None if bias is None else bias.dtype
        return dyt_fwd(x2d, alpha, w, b, after).view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        refuse_double_backward("triton")
        x2d, alpha, w = ctx.saved_tensors
        dy2d = tk._rows(dy, x2d.shape[1])
        dx, da, dw, db = dyt_bwd(dy2d, x2d, alpha, w, ctx.bias_dtype is not None, ctx.after)
        need = ctx.needs_input_grad
        return (
            dx.view(dy.shape) if need[0] else None,
            da.to(alpha.dtype) if need[1] else None,
            None if dw is None or not need[2] else dw.to(w.dtype),
            None if db is None or not need[3] else db.to(ctx.bias_dtype),
            None,
        )


class TritonDyT(ReferenceDyT):
    """Fused Triton DyT; ``(..., d)`` in, same shape and dtype out; tanh always in fp32
    (``config.NormConfig`` forbids ``upcast=false`` for triton)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return _TritonDyTFn.apply(x, self.alpha, self.gain(), self.bias, self.after)
