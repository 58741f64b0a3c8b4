"""GatedNorm (Qiu et al. 2026, arXiv:2601.22966, section 3.4): RMSNorm, then a low-rank self-gate.

``y = x / sqrt(mean(x^2) + eps) * weight``, then ``y * 2 sigmoid(W_up silu(W_down y))`` with
``gate_down`` W_down ``(r, d)``, ``gate_up`` W_up ``(d, r)`` (``F.linear`` layout), r =
``norm.gate_rank``; no bias. ``gate_up`` starts at zero, so a fresh GatedNorm is RMSNorm;
``gate_down`` is N(0, 1/d) from a private generator (``reset_gate``). Dtypes as RMSNorm's, the gate
in >= fp32, the gated product rounded once. ``ReferenceGatedNorm`` (eager), ``CompiledGatedNorm``.

Why: docs/norms.md
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from normlab.config import NormCast
from normlab.config.norm_table import DEFAULT_GATE_RANK
from normlab.norms.compiled import _col_sum, _graph_backward, _scale
from normlab.norms.reference import NormBase, _affine_in_dtype, rms_norm_ref

#: The gate is ``GATE_SCALE * sigmoid(...)``: 1 at initialisation (``gate_up`` zero).
GATE_SCALE = 2.0
#: Seed of the generator a GatedNorm built on its own draws ``gate_down`` from (a model re-draws).
STANDALONE_GATE_SEED = 2601_22966


def _gate(y: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``2 sigmoid(up silu(down y))`` over ``(..., d)``, in ``y``'s dtype."""
    return GATE_SCALE * torch.sigmoid(F.linear(F.silu(F.linear(y, down)), up))


def gated_ref(x, weight, gate_down, gate_up, eps: float, upcast: bool = True, after: bool = False):
    """GatedNorm of ``x (..., d)`` in ``x.dtype``; ``weight`` ``(d,)`` or None, ``gate_down``
    ``(r, d)``, ``gate_up`` ``(d, r)``; ``upcast``, ``after`` as for ``rms_norm_ref``."""
    dtype = x.dtype
    if not upcast:
        y = rms_norm_ref(x, weight, eps, upcast=False)
        return y * _gate(y, gate_down.to(dtype), gate_up.to(dtype))
    ct = torch.promote_types(dtype, torch.float32)
    xs = x.to(ct)
    x_hat = xs * torch.rsqrt((xs * xs).mean(-1, keepdim=True) + eps)
    y = x_hat if weight is None else x_hat * weight.to(ct)
    if not after and dtype != ct:  # before_weight: y's value rounded as RMSNorm's, exact gradient
        with torch.no_grad():
            rounded = _affine_in_dtype(x_hat, weight, None, dtype).to(ct)
        y = rounded + (y - y.detach())
    return (y * _gate(y, gate_down.to(ct), gate_up.to(ct))).to(dtype)


def gated_oracle(x, weight, bias, eps: float, gate_down, gate_up) -> torch.Tensor:
    """The float64 oracle of GatedNorm (Qiu et al. 2026): ``y = x / sqrt(mean(x^2) + eps) * w``,
    ``y * 2 sigmoid(W_up swish(W_down y))``, ``(..., d)`` float64; ValueError for a bias."""
    if bias is not None:
        raise ValueError("GatedNorm has no bias")
    x = x.double()
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    y = y if weight is None else y * weight.double()
    z1 = y @ gate_down.double().T
    h = z1 * torch.sigmoid(z1)  # swish (SiLU)
    return y * (2.0 * torch.sigmoid(h @ gate_up.double().T))


class ReferenceGatedNorm(NormBase):
    """Eager GatedNorm; ``(..., d)`` in, same shape and dtype out; ``gate_down`` ``(gate_rank, d)``
    N(0, 1/d), ``gate_up`` ``(d, gate_rank)`` zeros; ValueError: ``gate_rank`` not an int >= 1."""

    def __init__(
        self,
        d: int,
        eps: float,
        affine: bool = True,
        bias: bool = False,
        upcast: bool = True,
        zero_centered: bool = False,
        cast: NormCast = NormCast.before_weight,
        gate_rank: int = DEFAULT_GATE_RANK,
    ):
        if isinstance(gate_rank, bool) or not isinstance(gate_rank, int) or gate_rank < 1:
            raise ValueError(f"{type(self).__name__}: gate_rank={gate_rank!r} must be an int >= 1")
        super().__init__(d, eps, affine, bias, upcast, zero_centered, cast)
        self.gate_down = nn.Parameter(torch.empty(gate_rank, d))
        self.gate_up = nn.Parameter(torch.zeros(d, gate_rank))
        self.reset_gate(torch.Generator().manual_seed(STANDALONE_GATE_SEED))

    def reset_gate(self, generator: torch.Generator) -> None:
        """Draw ``gate_down`` N(0, 1/d) from ``generator`` (a CPU generator, never the global
        RNG) and zero ``gate_up``: the gate is 1 again."""
        rank, d = self.gate_down.shape
        with torch.no_grad():
            drawn = torch.randn(rank, d, generator=generator) / math.sqrt(d)
            self.gate_down.copy_(drawn.to(self.gate_down.device))
            self.gate_up.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return gated_ref(
            x, self.gain(), self.gate_down, self.gate_up, self.eps, self.upcast, self.after
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gate_rank={self.gate_down.shape[0]}"


def _gated_forward(x, weight, down, up, eps: float, after: bool):
    """(rows, d) -> the value of ``gated_ref`` (upcast), in one compiled function."""
    dtype = x.dtype
    ct = torch.promote_types(dtype, torch.float32)
    xs = x.to(ct)
    x_hat = xs * torch.rsqrt((xs * xs).mean(-1, keepdim=True) + eps)
    if after or dtype == ct:
        y = x_hat if weight is None else x_hat * weight.to(ct)
    else:
        y = _scale(x_hat, weight, None, dtype, False).to(ct)
    return (y * _gate(y, down.to(ct), up.to(ct))).to(dtype)


def _gated_backward(dy, x, weight, down, up, eps: float, need_dw: bool):
    """dx, dweight (None unless ``need_dw``), dgate_down, dgate_up in closed form, in >= fp32 from
    the unrounded y, each cast once; s1 = sigmoid(z1), z1 = y W_down^T, h = z1 s1, s2 =
    sigmoid(h W_up^T); then RMSNorm's backward of d loss / d y."""
    ct = torch.promote_types(x.dtype, torch.float32)
    xs = x.to(ct)
    rstd = torch.rsqrt((xs * xs).mean(-1, keepdim=True) + eps)
    x_hat = xs * rstd
    w = None if weight is None else weight.to(ct)
    y = x_hat if w is None else x_hat * w
    dn, upc, dys = down.to(ct), up.to(ct), dy.to(ct)
    z1 = y @ dn.T  # (rows, r)
    s1 = torch.sigmoid(z1)
    h = z1 * s1
    s2 = torch.sigmoid(h @ upc.T)  # (rows, d)
    dz2 = dys * y * (GATE_SCALE * s2 * (1.0 - s2))
    dup = dz2.T @ h  # (d, r)
    dz1 = (dz2 @ upc) * (s1 * (1.0 + z1 * (1.0 - s1)))  # silu'(z1)
    ddown = dz1.T @ y  # (r, d)
    gy = dys * (GATE_SCALE * s2) + dz1 @ dn  # d loss / d y
    dw = _col_sum(gy * x_hat).to(weight.dtype) if need_dw else None
    g = gy if w is None else gy * w
    dx = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    return dx.to(x.dtype), dw, ddown.to(down.dtype), dup.to(up.dtype)


_EXACT_CASTS = {"emulate_precision_casts": True}  # before_weight's rounding kept (compiled.py)
_gated_forward_c = torch.compile(_gated_forward, dynamic=False, options=_EXACT_CASTS)
_gated_backward_c = torch.compile(_gated_backward, dynamic=False)
_gated_ref_c = torch.compile(gated_ref, dynamic=False)


class _GatedNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, down, up, eps, after):
        ctx.save_for_backward(x, weight, down, up)
        ctx.eps, ctx.after = eps, after
        rows = x.reshape(-1, x.shape[-1])
        return _gated_forward_c(rows, weight, down, up, eps, after).view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, down, up = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():  # create_graph=True: through the reference formula
            fn = lambda x, w, dn, up: gated_ref(x, w, dn, up, ctx.eps, after=ctx.after)  # noqa: E731
            return *_graph_backward(fn, dy, (x, weight, down, up), needs), None, None
        d = x.shape[-1]
        need_dw = weight is not None and needs[1]
        dx, dw, ddown, dup = _gated_backward_c(
            dy.reshape(-1, d), x.reshape(-1, d), weight, down, up, ctx.eps, need_dw
        )
        return (
            dx.view(dy.shape),
            dw,
            ddown if needs[2] else None,
            dup if needs[3] else None,
            None,
            None,
        )


class CompiledGatedNorm(ReferenceGatedNorm):
    """GatedNorm with a compiled forward and a compiled closed-form backward; same parameters and
    results as ``ReferenceGatedNorm`` (double backward through the reference formula, no forward
    AD)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        gain = self.gain()
        if not self.upcast:
            return _gated_ref_c(x, gain, self.gate_down, self.gate_up, self.eps, self.upcast)
        return _GatedNormFn.apply(x, gain, self.gate_down, self.gate_up, self.eps, self.after)
