"""The norm group: which kind, implementation, placement and eps every norm of the model uses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from normlab.config.base import DEFAULT_EPS, ConfigError, _require


class NormKind(Enum):
    """Which normalization: LayerNorm (Ba et al. 2016), RMSNorm (Zhang & Sennrich 2019) or DyT
    (Dynamic Tanh, Zhu et al. 2025: ``weight * tanh(alpha x) + bias``, no statistic)."""

    layer = "layer"
    rms = "rms"
    dyt = "dyt"


class NormCast(Enum):
    """Where the result is cast back to the input dtype: ``before_weight`` (Llama: normalize in
    fp32, cast, then multiply by the weight in the input dtype) or ``after_weight`` (Gemma / OLMo:
    multiply by the weight, add the bias, in fp32, then cast once)."""

    before_weight = "before_weight"
    after_weight = "after_weight"


class NormImpl(Enum):
    """How a norm is computed. ``auto`` is resolved to a concrete implementation before building."""

    torch = "torch"  # PyTorch's nn.LayerNorm / nn.RMSNorm
    reference = "reference"  # explicit eager math, statistics in fp32: the oracle
    compiled = "compiled"  # torch.compile of the reference
    triton = "triton"  # our fused Triton kernels (CUDA; CPU only under TRITON_INTERPRET=1)
    cpp = "cpp"  # our fused C++ kernels (CPU), built on first use
    auto = "auto"  # the fastest fused implementation for the device


#: Copies of facts of the norm table (``normlab.norms.table``), to validate without torch;
#: ``tests/test_norm_contract.py`` fails when they disagree with it.
KINDS_WITH_BIAS = frozenset({NormKind.layer, NormKind.dyt})
#: Kinds without a statistic (the table's ``Kind.statistic=False``): eps has no meaning for them.
KINDS_WITHOUT_EPS = frozenset({NormKind.dyt})
#: Kinds with a learnable ``alpha`` (``norm.alpha_init``), and its default: DyT's paper
#: (Zhu et al. 2025, arXiv:2503.10622, section 7 and its code) initialises alpha at 0.5.
KINDS_WITH_ALPHA = frozenset({NormKind.dyt})
DEFAULT_ALPHA_INIT = 0.5


IMPLS_WITH_UPCAST_FALSE = frozenset({NormImpl.reference})


class Placement(Enum):
    """Where the norm sits: ``pre`` (GPT-2, x + f(norm(x))) or ``post`` (norm(x + f(x)))."""

    pre = "pre"
    post = "post"


@dataclass
class NormConfig:
    """Every norm in the model (per block and final) is built from this by ``norms.build_norm``.

    ``eps`` is added to the variance (LayerNorm) or the mean square (RMSNorm) *inside* the square
    root; ``null`` means :data:`DEFAULT_EPS`. ``bias``: ``null`` is the kind's default (a bias for
    the kinds that take one, :data:`KINDS_WITH_BIAS`), resolved on construction. ``upcast``
    computes the statistics in fp32 whatever the input dtype; turning it off exists to reproduce
    low-precision failures.

    ``alpha_init`` (DyT only; null: :data:`DEFAULT_ALPHA_INIT`): the initial value of DyT's scalar
    alpha. ``zero_centered``: the weight is stored as w, initialised at 0, and applied as
    ``1 + w`` with the addition in fp32 (Gemma). ``cast``: :class:`NormCast`.
    """

    kind: NormKind = NormKind.layer
    impl: NormImpl = NormImpl.auto
    eps: float | None = None
    placement: Placement = Placement.pre
    affine: bool = True
    bias: bool | None = None
    upcast: bool = True
    # what each norm computes (norms12)
    alpha_init: float | None = None
    zero_centered: bool = False
    cast: NormCast = NormCast.before_weight

    def __post_init__(self) -> None:
        self._check_options()
        if self.eps is not None:
            _require(
                math.isfinite(self.eps) and self.eps > 0,
                "norm.eps",
                self.eps,
                "must be a finite number > 0 (or null for the default 1e-5)",
            )
        has_bias = self.kind in KINDS_WITH_BIAS
        if self.bias is None:
            self.bias = has_bias and self.affine
        _require(
            has_bias or not self.bias,
            "norm.bias",
            self.bias,
            f"norm.kind={self.kind.name} has no bias (use norm.bias=null or false)",
        )
        _require(self.affine or not self.bias, "norm.bias", True, "a bias needs norm.affine=true")
        # Kernels that accumulate in fp32 anyway would silently ignore upcast=false: refused.
        ok = ", ".join(i.name for i in IMPLS_WITH_UPCAST_FALSE)
        _require(
            self.upcast or self.impl in IMPLS_WITH_UPCAST_FALSE,
            "norm.upcast",
            False,
            f"upcast=false is only available for impl={ok}, not impl={self.impl.name}",
        )

    def _check_options(self) -> None:
        """alpha_init, zero_centered, cast and eps against the kind (one line each)."""
        name = self.kind.name
        _require(
            self.eps is None or self.kind not in KINDS_WITHOUT_EPS,
            "norm.eps",
            self.eps,
            f"norm.kind={name} has no statistic, so no eps (use norm.eps=null)",
        )
        if self.alpha_init is not None:
            _require(
                self.kind in KINDS_WITH_ALPHA,
                "norm.alpha_init",
                self.alpha_init,
                f"only norm.kind={'|'.join(k.name for k in KINDS_WITH_ALPHA)} has an alpha "
                f"(use norm.alpha_init=null with norm.kind={name})",
            )
            _require(
                math.isfinite(self.alpha_init) and self.alpha_init > 0,
                "norm.alpha_init",
                self.alpha_init,
                f"must be a finite number > 0 (or null for the default {DEFAULT_ALPHA_INIT})",
            )
        _require(
            self.affine or not self.zero_centered,
            "norm.zero_centered",
            True,
            "a zero-centred weight needs norm.affine=true",
        )
        if not self.upcast and self.cast != NormCast.before_weight:
            raise ConfigError(
                f"norm.cast={self.cast.name} is not allowed: it needs norm.upcast=true (with "
                "upcast=false nothing is computed in fp32; allowed: before_weight)"
            )

    @property
    def resolved_alpha_init(self) -> float | None:
        """DyT's initial alpha: ``alpha_init`` or :data:`DEFAULT_ALPHA_INIT`; None for kinds
        without an alpha."""
        if self.kind not in KINDS_WITH_ALPHA:
            return None
        return DEFAULT_ALPHA_INIT if self.alpha_init is None else float(self.alpha_init)

    @property
    def resolved_eps(self) -> float:
        """The eps actually used: ``eps`` or :data:`DEFAULT_EPS` when null."""
        return DEFAULT_EPS if self.eps is None else float(self.eps)
