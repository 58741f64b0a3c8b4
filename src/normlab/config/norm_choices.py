"""The norm group's choices: kinds, implementations, cast orders, placements and QK-norm modes,
and the facts of the norm table that validation needs without torch."""

from __future__ import annotations

from enum import Enum


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
    """Where a block's norms sit around each branch f (attention, MLP); see ``normlab.model``."""

    pre = "pre"  # GPT-2: x + f(attn_in(x))
    post = "post"  # Vaswani et al. 2017: attn_out(x + f(x))
    peri = "peri"  # Peri-LN / sandwich (Kim et al. 2025; Gemma 2/3): x + attn_out(f(attn_in(x)))
    reordered = "reordered"  # OLMo-2 (arXiv:2501.00656): x + attn_out(f(x))


class QKNorm(Enum):
    """A norm on queries and keys: ``head`` over head_dim of each head (nanochat, OLMo-2-style
    Qwen3), ``full`` over d_model before the split into heads (OLMo-2)."""

    none = "none"
    head = "head"
    full = "full"


#: The NormConfig keys that say where norms sit, not how one norm computes: a position override
#: (``norm.positions.<pos>``) cannot set them.
WHERE_KEYS = ("placement", "qk", "embedding", "blocks", "positions")

#: Positions each placement has inside a block (``qk`` comes from ``norm.qk``).
PLACEMENT_POSITIONS = {
    Placement.pre: ("attn_in", "mlp_in"),
    Placement.post: ("attn_out", "mlp_out"),
    Placement.peri: ("attn_in", "attn_out", "mlp_in", "mlp_out"),
    Placement.reordered: ("attn_out", "mlp_out"),
}
