"""``diag/`` statistics of the residual stream, the norms and their gains, on diagnosed steps.

``ActivationRecorder.hooks`` records one forward pass: the stream entering each block and the
final norm, each branch's output, each norm's output and its exact-zero rows, and ``max_logit``;
``gain_stats`` and ``block_grad_norms`` add gains and gradient norms; ``first_nonfinite`` names
the module that first made inf or nan. Values are Python floats computed in fp32.

Why, and every key: docs/running.md
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from normlab.config.schedule import DIAG_BLOCK_NORMS


def rms_and_mean(x: torch.Tensor) -> tuple[float, float]:
    """``(sqrt(mean(x^2)), mean(x))`` over every element, computed in fp32."""
    x = x.detach().float()
    return math.sqrt(x.pow(2).mean().item()), x.mean().item()


def zero_rows(x: torch.Tensor, out: torch.Tensor) -> int:
    """How many rows (last dimension) of a norm's ``out`` are exactly zero where its input ``x``
    is not: an overflowed statistic (a zero input row gives a zero output rightly)."""
    x, out = x.detach(), out.detach()
    return int(((out == 0).all(-1) & (x != 0).any(-1)).sum())


ZERO_ROWS_SUFFIX = "_zero_rows"
#: Tensors with more elements than this get p99 and kurtosis on a subsample of this size.
TAIL_SAMPLE = 1 << 20
#: The suffixes ``tail_stats`` writes, in its order.
TAIL_SUFFIXES = ("_absmax", "_p99", "_kurtosis")


def sample_stride(numel: int, last_dim: int, size: int = TAIL_SAMPLE) -> int:
    """The smallest stride >= ``numel / size`` coprime with ``last_dim``: an even subsample of at
    most ``size`` elements that visits every feature of the last dimension."""
    stride = max(1, -(-numel // size))
    while math.gcd(stride, max(1, last_dim)) != 1:  # a feature carrying outliers is never skipped
        stride += 1
    return stride


def quantile_top(a: torch.Tensor, q: float) -> float:
    """``torch.quantile(a, q)`` (linear interpolation) of a 1-D tensor for a high ``q``, from its
    top ``(1 - q) * n`` values alone (``torch.topk``, not a full sort)."""
    n = a.numel()
    pos = q * (n - 1)
    lo = int(math.floor(pos))
    top = torch.topk(a, n - lo, sorted=True).values  # top[-1] is order statistic lo (0-based)
    v_lo = top[-1].item()
    v_hi = top[-2].item() if n - lo >= 2 else v_lo
    return v_lo + (pos - lo) * (v_hi - v_lo)


def tail_stats(x: torch.Tensor, size: int = TAIL_SAMPLE) -> tuple[float, float, float]:
    """``(exact abs-max, p99 of |x|, kurtosis E[(x - mu)^4] / var^2)`` of ``x`` (any shape, dtype),
    in fp32; p99 and kurtosis over a strided subsample beyond ``size`` elements; kurtosis nan if
    constant."""
    x = x.detach().reshape(-1, x.shape[-1] if x.dim() else 1)
    absmax = x.abs().max().float().item()
    flat = x.reshape(-1)
    if flat.numel() > size:  # deterministic: no random number drawn, training stays bit-identical
        flat = flat[:: sample_stride(flat.numel(), x.shape[-1], size)]
    v = flat.float()  # torch's pairwise sums: a relative error near 1e-6 at 2^20 elements
    p99 = quantile_top(v.abs(), 0.99)
    c2 = (v - v.mean()).square_()
    var = c2.mean().item()
    kurtosis = c2.square_().mean().item() / var**2 if var > 0 else math.nan
    return absmax, p99, kurtosis


def named_norms(model: nn.Module) -> list[tuple[str, str, nn.Module]]:
    """Every norm of a ``GPT`` in depth order as ``(diag name, module name, module)``:
    ``("block0/attn_in", "blocks.0.attn_in", m)``, ``block{i}/qk_q`` (``blocks.{i}.attn.q_norm``),
    ``embedding/norm``, ``final/norm``; only those the placement has."""
    out = []
    if getattr(model, "embedding", None) is not None:
        out.append(("embedding/norm", "embedding", model.embedding))
    for i, block in enumerate(model.blocks):
        for pos in DIAG_BLOCK_NORMS:
            sub = f"attn.{pos[-1]}_norm" if pos.startswith("qk_") else pos
            try:
                module = block.get_submodule(sub)
            except AttributeError:  # not in this placement / qk setting
                continue
            out.append((f"block{i}/{pos}", f"blocks.{i}.{sub}", module))
    if not isinstance(model.final, nn.Identity):
        out.append(("final/norm", "final", model.final))
    return out


@dataclass
class ActivationRecorder:
    """Collects the statistics of one forward pass of a ``GPT``."""

    stats: dict[str, float] = field(default_factory=dict)

    def _put(self, prefix: str, x: torch.Tensor) -> None:
        self.stats[f"{prefix}_rms"], self.stats[f"{prefix}_mean"] = rms_and_mean(x)

    def _put_tails(self, prefix: str, x: torch.Tensor) -> None:
        for suffix, value in zip(TAIL_SUFFIXES, tail_stats(x), strict=True):
            self.stats[prefix + suffix] = value

    def _put_resid(self, prefix: str, x: torch.Tensor) -> None:
        self._put(prefix, x)
        self._put_tails(prefix, x)

    def _put_norm(self, prefix: str, x: torch.Tensor, out: torch.Tensor) -> None:
        self._put(f"{prefix}_out", out)
        self.stats[prefix + ZERO_ROWS_SUFFIX] = zero_rows(x, out)

    @contextmanager
    def hooks(self, model: nn.Module):
        """Register the forward hooks for the duration of the ``with`` block, then remove them."""
        handles = []
        for i, block in enumerate(model.blocks):
            handles.append(
                block.register_forward_pre_hook(
                    lambda m, args, i=i: self._put_resid(f"diag/block{i}/resid", args[0])
                )
            )
            for branch in ("attn", "mlp"):  # the sublayers' outputs, before the residual add
                handles.append(
                    getattr(block, branch).register_forward_hook(
                        lambda m, a, out, n=f"diag/block{i}/{branch}": self._put_tails(n, out)
                    )
                )
        for name, _, norm in named_norms(model):
            handles.append(
                norm.register_forward_hook(
                    lambda m, a, out, n=name: self._put_norm(f"diag/{n}", a[0], out)
                )
            )
        handles.append(  # the stream entering the final norm (or the head: nn.Identity)
            model.final.register_forward_pre_hook(
                lambda m, args: self._put_resid("diag/final/resid", args[0])
            )
        )

        def max_logit(m, a, out):
            self.stats["diag/max_logit"] = out.detach().abs().max().float().item()

        handles.append(model.head.register_forward_hook(max_logit))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def gain_stats(model: nn.Module) -> dict[str, float]:
    """Mean, min and max of every norm's gain (``weight``), keyed by its ``named_norms`` name."""
    out: dict[str, float] = {}
    for key, _, norm in named_norms(model):
        w = getattr(norm, "weight", None)
        if w is None:
            continue
        w = w.detach().float()
        out[f"diag/{key}_gain_mean"] = w.mean().item()
        out[f"diag/{key}_gain_min"] = w.min().item()
        out[f"diag/{key}_gain_max"] = w.max().item()
    return out


def block_grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of each block's parameters (after backward and unscaling)."""
    out = {}
    for i, block in enumerate(model.blocks):
        sq = sum(
            p.grad.detach().float().pow(2).sum().item()
            for p in block.parameters()
            if p.grad is not None
        )
        out[f"diag/block{i}/grad_norm"] = math.sqrt(sq)
    return out


@dataclass(frozen=True)
class NonFinite:
    """Where non-finite values first appeared in a forward pass."""

    module: str  # qualified module name, e.g. "blocks.0.attn_in"
    kind: str  # "inf", "nan" or "inf+nan"
    input_finite: bool  # True when the module's own input was finite (the module made them)
    where: str = "output"  # "output", or "statistics": a norm's mean square / variance overflowed

    def __str__(self) -> str:
        origin = "made by this module" if self.input_finite else "already in its input"
        return (
            f"first non-finite values ({self.kind}) in the {self.where} of {self.module} ({origin})"
        )


def _kind(t: torch.Tensor) -> str:
    has_inf, has_nan = bool(torch.isinf(t).any()), bool(torch.isnan(t).any())
    return "+".join(k for k, flag in (("inf", has_inf), ("nan", has_nan)) if flag)


def norm_statistics_finite(norm: nn.Module, x: torch.Tensor) -> bool:
    """Whether a normlab norm's statistic ``mean(x^2)`` is finite in the dtype it computes it in
    (fp16 without ``upcast`` overflows past |x| > 255.9, and the output alone hides it)."""
    xs = x.detach().float() if getattr(norm, "upcast", True) else x.detach()
    return bool(torch.isfinite((xs * xs).mean(-1)).all())


def first_nonfinite(model: nn.Module, *inputs: torch.Tensor) -> NonFinite | None:
    """Run ``model(*inputs)`` and name the first leaf module, in execution order, that made
    non-finite values (for a norm, also in its statistics); None when all is finite."""
    found: list[NonFinite] = []
    handles = []
    for name, module in model.named_modules():
        if any(True for _ in module.children()):  # leaves only: a block's output is a leaf's
            continue

        def hook(m, args, out, name=name):
            if found or not isinstance(out, torch.Tensor) or not out.is_floating_point():
                return
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if (
                x is not None
                and hasattr(m, "eps")
                and hasattr(m, "upcast")
                and not norm_statistics_finite(m, x)
            ):
                found.append(
                    NonFinite(name, "inf", bool(torch.isfinite(x).all()), where="statistics")
                )
            elif not torch.isfinite(out).all():
                ins = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
                found.append(
                    NonFinite(name, _kind(out), all(bool(torch.isfinite(a).all()) for a in ins))
                )

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None
