"""``norm.impl=triton``: fused Triton kernels, forward and backward, for LayerNorm, RMSNorm and DyT.

Imported only when ``norm.impl=triton`` is chosen; kernels launch on ``x.device``: CUDA, or CPU
with ``TRITON_INTERPRET=1`` set before import. Semantics and roundings are the reference's
(``reference.py``, ``dyt.py``): statistics, ``x_hat`` and tanh in fp32 (fp64 for fp64 input), then
the ``norm.cast`` order (``AFTER``: one rounding). Output and ``dx`` in ``x.dtype``; ``dw``, ``db``
and DyT's ``dalpha`` summed in fp32 partials per program, cast once to the parameter dtype.
A zero-centred weight arrives as its fp32 gain ``1 + w`` (``NormBase.gain``). Each launcher is an
opaque ``torch.library`` custom op (``normlab::triton_*``) with fresh outputs and autograd.

Why: docs/norms.md
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

from normlab.norms.dyt import ReferenceDyT
from normlab.norms.reference import NormBase, refuse_double_backward


@triton.jit
def _round_to(x, DTYPE: tl.constexpr):
    """``x`` (fp32/fp64) rounded to the nearest ``DTYPE`` value (ties to even), kept in x's dtype;
    NaN and infinities pass through."""
    if DTYPE == tl.bfloat16:  # integer ops: the CPU interpreter truncates fp32->bf16 casts
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # would turn a NaN into +-0
        r = tl.where(x != x, x, bits.to(tl.float32, bitcast=True).to(x.dtype))
    else:
        r = x.to(DTYPE).to(x.dtype)
    return r


@triton.jit
def _norm_fwd(
    X,
    Y,
    W,
    B,
    Mean,
    Rstd,
    stride_x,
    stride_y,
    n_rows,
    N,
    eps,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    AFTER: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program normalises BLOCK_M rows of X (n_rows, N); stores Y, Rstd (and Mean)."""
    IO: tl.constexpr = Y.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=mask, other=0.0).to(
        ACC
    )
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=1) / N
        tl.store(Mean + rows, mean, mask=row_ok)
        xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
    tl.store(Rstd + rows, rstd, mask=row_ok)
    if AFTER:  # cast=after_weight: the affine step in ACC, one rounding at the end
        y = xc * rstd[:, None]
        if HAS_W:
            y = y * tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
        if HAS_B:
            y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
        y = _round_to(y, IO)
    else:
        y = _round_to(xc * rstd[:, None], IO)
        if HAS_W:
            w = _round_to(tl.load(W + cols, mask=col_ok, other=0.0).to(ACC), IO)
            y = _round_to(y * w[None, :], IO)
        if HAS_B:
            b = _round_to(tl.load(B + cols, mask=col_ok, other=0.0).to(ACC), IO)
            y = _round_to(y + b[None, :], IO)
    tl.store(Y + rows[:, None].to(tl.int64) * stride_y + cols[None, :], y.to(IO), mask=mask)


@triton.jit
def _norm_bwd(
    X,
    DY,
    DX,
    W,
    Mean,
    Rstd,
    DW,
    DB,
    stride_x,
    stride_dy,
    stride_dx,
    n_rows,
    N,
    tiles_per_program,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    AFTER: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program p handles row tiles p, p + P, ... (P programs); stores DX and its ACC partial column
    sums DW[p, :], DB[p, :]. With g = dy w: dx = rstd (g - mean(g) - x_hat mean(g x_hat)) (RMS:
    no mean(g)), dw = sum_rows(dy x_hat), db = sum_rows(dy)."""
    IO: tl.constexpr = DX.dtype.element_ty
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)
        if not AFTER:
            w = _round_to(w, IO)
    dw = tl.zeros((BLOCK_N,), dtype=ACC)
    db = tl.zeros((BLOCK_N,), dtype=ACC)
    for i in range(0, tiles_per_program):
        rows = (pid + i * n_programs) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows[:, None].to(tl.int64)
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
        dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(ACC)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        if IS_RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_W:
            g = dy * w[None, :]
            if AFTER:
                dw += tl.sum(dy * xhat, axis=0)
            else:
                dw += tl.sum(dy * _round_to(xhat, IO), axis=0)
        else:
            g = dy
        if HAS_B:
            db += tl.sum(dy, axis=0)
        c1 = tl.sum(g * xhat, axis=1) / N
        if IS_RMS:
            dx = (g - xhat * c1[:, None]) * rstd[:, None]
        else:
            c2 = tl.sum(g, axis=1) / N
            dx = (g - c2[:, None] - xhat * c1[:, None]) * rstd[:, None]
        tl.store(DX + rows64 * stride_dx + cols[None, :], _round_to(dx, IO).to(IO), mask=mask)
    if HAS_W:
        tl.store(DW + pid * N + cols, dw, mask=col_ok)
    if HAS_B:
        tl.store(DB + pid * N + cols, db, mask=col_ok)


def _launch_config(n_rows: int, d: int, x: torch.Tensor) -> tuple[int, int, int]:
    """(BLOCK_M rows per tile, BLOCK_N >= d a power of two, num_warps) for ``(n_rows, d)``."""
    block_n = triton.next_power_of_2(d)
    if block_n * x.element_size() > 65536:
        max_d = 65536 // x.element_size()
        raise ValueError(f"hidden size {d} too large for the fused Triton norm (max {max_d})")
    # Tiles of ~4096 elements: one row per program for d >= 4096, up to 16 rows for small d. The
    # CPU interpreter pays per tile in Python, so it takes up to 64 rows (same code path).
    max_rows = 16 if x.is_cuda else 64
    block_m = max(1, min(4096 // block_n, max_rows, triton.next_power_of_2(n_rows)))
    num_warps = min(max(block_m * block_n // 256, 1), 16)
    return block_m, block_n, num_warps


def _device(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _acc(x: torch.Tensor):
    return tl.float64 if x.dtype == torch.float64 else tl.float32


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    """``(..., d)`` -> ``(rows, d)`` with unit column stride (copies only when needed)."""
    t = t.reshape(-1, d)
    return t if t.stride(-1) == 1 else t.contiguous()


def _meta(x, weight, bias, after: bool) -> dict:
    """The kernels' compile-time flags and launch sizes for ``x`` ``(rows, d)``: ``HAS_W``,
    ``HAS_B``, ``AFTER``, ``ACC``, ``BLOCK_M``, ``BLOCK_N``, ``num_warps``."""
    block_m, block_n, num_warps = _launch_config(x.shape[0], x.shape[1], x)
    flags = {"HAS_W": weight is not None, "HAS_B": bias is not None, "AFTER": after}
    return {**flags, "ACC": _acc(x), "BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps}


def _programs(n_tiles: int, x: torch.Tensor) -> int:
    """Backward programs: one per tile, at most 4 per streaming multiprocessor (1 on a CPU)."""
    n_sm = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    return min(n_tiles, 4 * n_sm)


def _unused(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A fresh 1-element tensor on x's device for a pointer argument the kernel never touches."""
    return torch.empty(1, dtype=dtype, device=x.device)


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def norm_fwd(x, weight, bias, eps: float, is_rms: bool, after: bool = False):
    """Forward on ``x2d`` ``(rows, d)`` (``after``: ``cast=after_weight``). Returns ``y``
    ``(rows, d)`` in x.dtype, ``mean`` (None for RMSNorm) and ``rstd``, both ``(rows,)`` fp32
    (fp64 for float64 x)."""
    n_rows, d = x.shape
    stat_dtype = _stat_dtype(x)
    y = torch.empty_like(x)
    rstd = torch.empty(n_rows, dtype=stat_dtype, device=x.device)
    mean = None if is_rms else torch.empty(n_rows, dtype=stat_dtype, device=x.device)
    if n_rows == 0:
        return y, mean, rstd
    meta = _meta(x, weight, bias, after)
    with _device(x):
        _norm_fwd[(triton.cdiv(n_rows, meta["BLOCK_M"]),)](
            x,
            y,
            _unused(x, x.dtype) if weight is None else weight,
            _unused(x, x.dtype) if bias is None else bias,
            _unused(x, stat_dtype) if mean is None else mean,
            rstd,
            x.stride(0),
            y.stride(0),
            n_rows,
            d,
            eps,
            IS_RMS=is_rms,
            **meta,
        )
    return y, mean, rstd


def norm_bwd(dy, x, weight, has_bias: bool, mean, rstd, is_rms: bool, after: bool = False):
    """Backward on ``(rows, d)`` tensors. Returns ``dx`` (x.dtype) and the fp32 (fp64 for float64 x)
    ``(d,)`` sums ``dw`` / ``db`` (None without weight / bias), not yet cast to the param dtype."""
    n_rows, d = x.shape
    dx = torch.empty_like(x)
    acc = rstd.dtype
    if n_rows == 0:
        dw, db = (
            torch.zeros(d, dtype=acc, device=x.device) if on else None
            for on in (weight is not None, has_bias)
        )
        return dx, dw, db
    meta = _meta(x, weight, x if has_bias else None, after)
    n_tiles = triton.cdiv(n_rows, meta["BLOCK_M"])
    programs = _programs(n_tiles, x)
    partial_dw = (
        torch.empty(programs, d, dtype=acc, device=x.device) if weight is not None else None
    )
    partial_db = torch.empty(programs, d, dtype=acc, device=x.device) if has_bias else None
    with _device(x):
        _norm_bwd[(programs,)](
            x,
            dy,
            dx,
            _unused(x, x.dtype) if weight is None else weight,
            _unused(x, acc) if mean is None else mean,
            rstd,
            _unused(x, acc) if partial_dw is None else partial_dw,
            _unused(x, acc) if partial_db is None else partial_db,
            x.stride(0),
            dy.stride(0),
            dx.stride(0),
            n_rows,
            d,
            triton.cdiv(n_tiles, programs),
            IS_RMS=is_rms,
            **meta,
        )
    dw = None if partial_dw is None else partial_dw.sum(0)
    db = None if partial_db is None else partial_db.sum(0)
    return dx, dw, db


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def _present(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``t``, or an empty tensor of like's dtype for an absent result (a custom op's outputs)."""
    return like.new_empty(0) if t is None else t


# custom_op, not triton_op: opaque to compile (no mutation analysis), traceable with the interpreter
@torch.library.custom_op("normlab::triton_norm_fwd", mutates_args=())
def _norm_fwd_op(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    is_rms: bool,
    after: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x (..., d)`` -> ``y`` (x's shape and dtype), ``mean`` and ``rstd`` ``(rows,)`` fp32 (fp64
    for float64 x; ``mean`` empty for RMSNorm). ValueError: d too large for one tile."""
    x2d = _rows(x, x.shape[-1])
    y, mean, rstd = norm_fwd(x2d, _contiguous(weight), _contiguous(bias), eps, is_rms, after)
    return y.view(x.shape), _present(mean, rstd), rstd


@_norm_fwd_op.register_fake
def _norm_fwd_fake(x, weight, bias, eps, is_rms, after):
    rows = math.prod(x.shape[:-1])
    rstd = x.new_empty(rows, dtype=_stat_dtype(x))
    return x.new_empty(x.shape), x.new_empty(0 if is_rms else rows, dtype=rstd.dtype), rstd


@torch.library.custom_op("normlab::triton_norm_bwd", mutates_args=())
def _norm_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    has_bias: bool,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    is_rms: bool,
    after: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dx`` (x's shape and dtype) and the ``(d,)`` sums ``dw`` / ``db`` in rstd's dtype (empty
    without weight / bias)."""
    d = x.shape[-1]
    w = _contiguous(weight)
    dx, dw, db = norm_bwd(_rows(dy, d), _rows(x, d), w, has_bias, mean, rstd, is_rms, after)
    return dx.view(x.shape), _present(dw, rstd), _present(db, rstd)


@_norm_bwd_op.register_fake
def _norm_bwd_fake(dy, x, weight, has_bias, mean, rstd, is_rms, after):
    d = x.shape[-1]
    dw = rstd.new_empty(0 if weight is None else d)
    return x.new_empty(x.shape), dw, rstd.new_empty(d if has_bias else 0)


def _norm_setup(ctx, inputs, output) -> None:
    x, weight, bias, _, is_rms, after = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, None if is_rms else mean, rstd)
    ctx.is_rms, ctx.bias_dtype, ctx.after = is_rms, None if bias is None else bias.dtype, after


def _norm_backward(ctx, dy, _dmean, _drstd):
    refuse_double_backward("triton")
    x, w, mean, rstd = ctx.saved_tensors
    has_bias = ctx.bias_dtype is not None
    dx, dw, db = _norm_bwd_op(dy, x, w, has_bias, mean, rstd, ctx.is_rms, ctx.after)
    need = ctx.needs_input_grad
    dw = None if w is None or not need[1] else dw.to(w.dtype)
    db = None if not has_bias or not need[2] else db.to(ctx.bias_dtype)
    return dx if need[0] else None, dw, db, None, None, None


_norm_fwd_op.register_autograd(_norm_backward, setup_context=_norm_setup)


class TritonLayerNorm(NormBase):
    """Fused Triton LayerNorm; ``(..., d)`` in, same shape and dtype out. ``upcast`` is stored but
    statistics are always fp32 (``config.NormConfig`` forbids ``upcast=false`` for triton)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return _norm_fwd_op(x, self.gain(), self.bias, self.eps, False, self.after)[0]


class TritonRMSNorm(NormBase):
    """Fused Triton RMSNorm; ``(..., d)`` in, same shape and dtype out; no bias. ``upcast`` is
    stored but statistics are always fp32."""

    takes_bias = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return _norm_fwd_op(x, self.gain(), None, self.eps, True, self.after)[0]


@triton.jit
def _tanh(z):  # sign(z) (1 - e) / (1 + e), e = exp(-2|z|): no overflow
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
    """Program p handles row tiles p, p + P, ...; stores DX and its ACC partial sums DA[p],
    DW[p, :], DB[p, :]. With g = dy w: dx = alpha g (1 - t^2), dalpha = sum(g x (1 - t^2))."""
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


def dyt_fwd(x, alpha, weight, bias, after: bool) -> torch.Tensor:
    """``x`` ``(rows, d)`` (unit column stride) -> ``y`` ``(rows, d)`` in x.dtype."""
    y = torch.empty_like(x)
    if x.shape[0] == 0:
        return y
    meta = _meta(x, weight, bias, after)
    grid = (triton.cdiv(x.shape[0], meta["BLOCK_M"]),)
    with _device(x):
        _dyt_fwd[grid](
            x,
            y,
            alpha,
            _unused(x, x.dtype) if weight is None else weight,
            _unused(x, x.dtype) if bias is None else bias,
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
    acc = _stat_dtype(x)
    dx = torch.empty_like(x)
    meta = _meta(x, weight, x if has_bias else None, after)
    n_tiles = max(1, triton.cdiv(n_rows, meta["BLOCK_M"]))
    programs = _programs(n_tiles, x)
    da = torch.zeros(programs, dtype=acc, device=x.device)
    dw = torch.zeros(programs, d, dtype=acc, device=x.device) if weight is not None else None
    db = torch.zeros(programs, d, dtype=acc, device=x.device) if has_bias else None
    if n_rows:
        with _device(x):
            _dyt_bwd[(programs,)](
                x,
                dy,
                dx,
                alpha,
                _unused(x, x.dtype) if weight is None else weight,
                da,
                _unused(x, acc) if dw is None else dw,
                _unused(x, acc) if db is None else db,
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


@torch.library.custom_op("normlab::triton_dyt_fwd", mutates_args=())
def _dyt_fwd_op(
    x: torch.Tensor,
    alpha: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    after: bool,
) -> torch.Tensor:
    """``x (..., d)``, ``alpha (1,)`` -> ``y`` (x's shape and dtype). ValueError: d too large."""
    x2d = _rows(x, x.shape[-1])
    return dyt_fwd(x2d, alpha, _contiguous(weight), _contiguous(bias), after).view(x.shape)


@_dyt_fwd_op.register_fake
def _dyt_fwd_fake(x, alpha, weight, bias, after):
    return x.new_empty(x.shape)


@torch.library.custom_op("normlab::triton_dyt_bwd", mutates_args=())
def _dyt_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    alpha: torch.Tensor,
    weight: torch.Tensor | None,
    has_bias: bool,
    after: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dx`` (x's shape and dtype), ``dalpha`` ``(1,)`` and the ``(d,)`` sums ``dw`` / ``db``
    (empty without weight / bias), fp32 (fp64 for float64 x)."""
    d = x.shape[-1]
    dx, da, dw, db = dyt_bwd(_rows(dy, d), _rows(x, d), alpha, _contiguous(weight), has_bias, after)
    return dx.view(x.shape), da, _present(dw, da), _present(db, da)


@_dyt_bwd_op.register_fake
def _dyt_bwd_fake(dy, x, alpha, weight, has_bias, after):
    d, acc = x.shape[-1], _stat_dtype(x)
    dw = x.new_empty(0 if weight is None else d, dtype=acc)
    return (
        x.new_empty(x.shape),
        x.new_empty(1, dtype=acc),
        dw,
        x.new_empty(d if has_bias else 0, dtype=acc),
    )


def _dyt_setup(ctx, inputs, output) -> None:
    x, alpha, weight, bias, after = inputs
    ctx.save_for_backward(x, alpha, weight)
    ctx.after, ctx.bias_dtype = after, None if bias is None else bias.dtype


def _dyt_backward(ctx, dy):
    refuse_double_backward("triton")
    x, alpha, w = ctx.saved_tensors
    has_bias = ctx.bias_dtype is not None
    dx, da, dw, db = _dyt_bwd_op(dy, x, alpha, w, has_bias, ctx.after)
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None,
        da.to(alpha.dtype) if need[1] else None,
        None if w is None or not need[2] else dw.to(w.dtype),
        None if not has_bias or not need[3] else db.to(ctx.bias_dtype),
        None,
    )


_dyt_fwd_op.register_autograd(_dyt_backward, setup_context=_dyt_setup)


class TritonDyT(ReferenceDyT):
    """Fused Triton DyT; ``(..., d)`` in, same shape and dtype out; tanh always in fp32
    (``config.NormConfig`` forbids ``upcast=false`` for triton)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return _dyt_fwd_op(x, self.alpha, self.gain(), self.bias, self.after)
