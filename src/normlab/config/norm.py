"""The norm group: which kind, implementation, placement and eps every norm of the model uses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from normlab.config.base import DEFAULT_EPS, _require


class NormKind(Enum):
    """Which normalization: LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019)."""

    layer = "layer"
    rms = "rms"


class NormImpl(Enum):
    """How a norm is computed. ``auto`` is resolved to a concrete implementation before building."""

    torch = "torch"  # PyTorch's nn.LayerNorm / nn.RMSNorm
    reference = "reference"  # explicit eager math, statistics in fp32: the oracle
    compiled = "compiled"  # torch.compile of the reference
    triton = "triton"  # our fused Triton kernels (CUDA; CPU only under TRITON_INTERPRET=1)
    cpp = "cpp"  # our fused C++ kernels (CPU), built on first use
    auto = "auto"  # the fastest fused implementation for the device


#: Copies of two facts of the norm table (``normlab.norms.table``), to validate without torch;
#: ``tests/test_norm_contract.py`` fails when they disagree with it.
KINDS_WITH_BIAS = frozenset({NormKind.layer})


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
    """

    kind: NormKind = NormKind.layer
    impl: NormImpl = NormImpl.auto
    eps: float | None = None
    placement: Placement = Placement.pre
    affine: bool = True
    bias: bool | None = None
    upcast: bool = True

    def __post_init__(self) -> None:
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

    @property
    def resolved_eps(self) -> float:
        """The eps actually used: ``eps`` or :data:`DEFAULT_EPS` when null."""
        return DEFAULT_EPS if self.eps is None else float(self.eps)
