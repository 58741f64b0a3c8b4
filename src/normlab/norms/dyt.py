"""DyT, Dynamic Tanh (Zhu, Chen, He, LeCun & Liu, "Transformers without Normalization", CVPR
2025, arXiv:2503.10622): an elementwise replacement for a norm layer,
``y = weight * tanh(alpha x) + bias`` with ``alpha`` one learnable scalar (shape ``(1,)``, as the
paper's code) and ``weight`` / ``bias`` ``(d,)`` initialised at ones / zeros. No statistic, so no
eps: the ``eps`` the norm table's signature passes is stored and unused (``NormConfig`` refuses a
non-null ``norm.eps`` for ``kind=dyt``).

Initialisation of alpha (the paper, section 7): ``alpha_init = 0.5`` is its default and works for
the non-LLM models it trains; for LLMs it reports that alpha_init must be tuned, smaller for wider
models, and larger in the DyT before attention than in the other DyT layers (FFN input, final):
for LLaMA 7B 0.8 (attention) / 0.2 (other), 13B 0.6 / 0.15, 34B and 70B 0.2 / 0.05 (the values of
its LLaMA scripts, ``other_tasks/LLaMA`` in github.com/jiachenzhu/DyT, where DyT has no bias, as
RMSNorm: ``norm.bias=false``); it also adds a learnable scalar after the embedding (initialised at
sqrt(d_model) in that code). normlab's default is the paper's 0.5 (``norm.alpha_init``); set a
position's alpha through the model's per-position norm overrides.

Implementations: ``ReferenceDyT`` (eager, the dtype policy of ``reference.py``: tanh in at least
fp32, the ``norm.cast`` order for the affine step, fp32 gradients; the float64-able oracle's twin),
``CompiledDyT`` (compiled forward and closed-form compiled backward, as ``compiled.py``) and
``TorchDyT`` (the paper's code in plain PyTorch ops, autograd through them, output cast to the
input dtype). Backward, with ``t = tanh(alpha x)`` and ``g = dy * gain``:
``dx = alpha g (1 - t^2)``, ``dalpha = sum(g x (1 - t^2))``, ``dweight = sum_rows(dy t)``,
``dbias = sum_rows(dy)``.
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.config import DEFAULT_ALPHA_INIT, NormCast
from normlab.norms.reference import NormBase, _affine, _affine_in_dtype


def dyt_ref(x, alpha, weight, bias, upcast: bool = True, after: bool = False) -> torch.Tensor:
    """DyT over ``(..., d)``: ``weight * tanh(alpha x) + bias``.

    Args:
        x: ``(..., d)`` any float dtype. alpha: ``(1,)``. weight, bias: ``(d,)`` or None.
        upcast: tanh and the affine step in at least fp32 (values rounded as eager ops round them,
            gradients not) or all in ``x.dtype``. after: ``cast=after_weight`` (one rounding).

    Returns:
        ``(..., d)`` in ``x.dtype``.
    """
    dtype = x.dtype
    xs = x.to(torch.promote_types(dtype, torch.float32)) if upcast else x
    t = torch.tanh(alpha.to(xs.dtype) * xs)
    if not upcast:
        return _affine_in_dtype(t, weight, bias, dtype)
    return _affine(t, weight, bias, dtype, after)


def dyt_oracle(x, weight, bias, eps: float, alpha) -> torch.Tensor:
    """The float64 oracle of DyT (Zhu et al. 2025): ``tanh(alpha x) * w + b``, every input cast to
    float64, ``(..., d)`` float64 out. ``eps`` is unused (DyT has none; the table's oracle
    signature)."""
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
    """The paper's code (``tanh(alpha * x) * weight + bias``) in plain PyTorch ops, autograd
    through them. A bf16/fp16 x times the fp32 alpha is promoted to fp32: ``after_weight`` keeps
    the affine step there and casts once; ``before_weight`` casts ``tanh`` to the input dtype and
    multiplies (adds) there, gradients rounded with it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        t = torch.tanh(self.alpha * x)
        gain, bias = self.gain(), self.bias
        if not self.after:
            t, gain = t.to(x.dtype), None if gain is None else gain.to(x.dtype)
            bias = None if bias is None else bias.to(x.dtype)
        y = t if gain is None else t * gain
        return (y if bias is None else y + bias).to(x.dtype)


def _dyt_forward(x, alpha, weight, bias, after: bool):
    """(rows, d) -> :func:`dyt_ref` (upcast) computed in one compiled sweep."""
    from normlab.norms.compiled import _scale

    xs = x.to(torch.promote_types(x.dtype, torch.float32))
    return _scale(torch.tanh(alpha.to(xs.dtype) * xs), weight, bias, x.dtype, after)


def _dyt_backward(dy, x, alpha, weight, need_dw: bool, bias_dtype):
    """dx, dalpha ``(1,)``, dweight and dbias (None unless asked), in at least fp32, cast once."""
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
    as :class:`ReferenceDyT` (double backward through the reference formula, no forward AD)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if not self.upcast:
            return _dyt_ref_c(x, self.alpha, self.gain(), self.bias, self.upcast)
        return _DyTFn.apply(x, self.alpha, self.gain(), self.bias, self.after)
