"""The norm table: every fact about the norm kinds and their implementations, written once.

No torch here, so the config validates (and ``auto`` resolves) before anything heavy loads.
``KINDS``: ``NormKind`` -> ``Kind`` (implementations as ``"module:Class"`` strings, imported only
when chosen, the float64 oracle, options, parameters); ``IMPLS``: ``NormImpl`` -> ``Impl``
(devices, packages, the options and autograd modes it honours); ``AUTO``: what ``norm.impl=auto``
ranks, by device. Config checks, ``normlab.norms`` and the contract tests all derive from it. A new
kind: a ``NormKind`` member, a reference class and oracle, a ``KINDS`` entry, a conf/norm/ file.

Why: docs/norms.md
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class NormKind(Enum):
    """Which normalization: LayerNorm (Ba et al. 2016), RMSNorm (Zhang & Sennrich 2019), DyT
    (Dynamic Tanh, Zhu et al. 2025: ``weight * tanh(alpha x) + bias``, no statistic), Derf
    (Dynamic erf, Chen et al. 2025: ``weight * erf(alpha x + s) + bias``, no statistic) or
    GatedNorm (Qiu et al. 2026: RMSNorm times an elementwise low-rank sigmoid gate)."""

    layer = "layer"
    rms = "rms"
    dyt = "dyt"
    derf = "derf"
    gated = "gated"


class NormCast(Enum):
    """Where the result is cast back to the input dtype: ``before_weight`` (Llama: normalize in
    fp32, cast, then multiply by the weight in the input dtype) or ``after_weight`` (Gemma / OLMo:
    multiply by the weight, add the bias, in fp32, then cast once)."""

    before_weight = "before_weight"
    after_weight = "after_weight"


class NormImpl(Enum):
    """How a norm is computed. ``auto`` is resolved to a concrete implementation before building:
    the first of ``AUTO`` for the device that the kind has and that honours every option asked."""

    torch = "torch"  # PyTorch's nn.LayerNorm / nn.RMSNorm
    reference = "reference"  # explicit eager math, statistics in fp32: the oracle
    compiled = "compiled"  # torch.compile of the reference
    triton = "triton"  # our fused Triton kernels (CUDA; CPU only under TRITON_INTERPRET=1)
    cpp = "cpp"  # our fused C++ kernels (CPU), built on first use
    auto = "auto"  # the fastest implementation for the device that honours the options


class Placement(Enum):
    """Where a block's norms sit around each branch f (attention, MLP); see ``normlab.model``."""

    pre = "pre"  # GPT-2: x + f(attn_in(x))
    post = "post"  # Vaswani et al. 2017: attn_out(x + f(x))
    peri = "peri"  # Peri-LN / sandwich (Kim et al. 2025; Gemma 2/3): x + attn_out(f(attn_in(x)))
    reordered = "reordered"  # OLMo-2 (arXiv:2501.00656): x + attn_out(f(x))
    # HybridNorm (arXiv:2503.04598): h = x + attn(x) with q, k and v normalized per head inside
    # attention (position qk); then z = mlp_in(h), x = z + mlp(z): the norm carries the stream
    hybrid = "hybrid"
    # DeepNorm (arXiv:2203.00555): post-norm attn_out(alpha x + f(x)), alpha = (2N)^(1/4), and the
    # value / output / MLP weights initialised x beta = (8N)^(-1/4) for N blocks
    deepnorm = "deepnorm"


class QKNorm(Enum):
    """A norm on queries and keys: ``head`` over head_dim of each head (nanochat, OLMo-2-style
    Qwen3), ``full`` over d_model before the split into heads (OLMo-2)."""

    none = "none"
    head = "head"
    full = "full"


#: The autograd modes the contract tests check, in the order they are reported.
BACKWARD, DOUBLE_BACKWARD, JVP = "backward", "double_backward", "jvp"
AUTOGRAD_MODES = (BACKWARD, DOUBLE_BACKWARD, JVP)

#: The initial alpha of DyT and Derf: DyT's paper (Zhu et al. 2025, arXiv:2503.10622, section 7
#: and its code) initialises alpha at 0.5.
DEFAULT_ALPHA_INIT = 0.5
#: GatedNorm's gate rank r: the paper's (Qiu et al. 2026, arXiv:2601.22966, section 3.4: r = 16).
DEFAULT_GATE_RANK = 16


@dataclass(frozen=True)
class Kind:
    """One norm kind. Each class of ``impls`` takes ``(d, eps, affine=, bias=, upcast=,
    zero_centered=, cast=)`` plus its ``options``; ``weight`` / ``bias``: ``(d,)`` or None."""

    impls: dict[NormImpl, str]  # implementation -> "module:Class"
    # "module:function": (x, weight, bias, eps, *extra_params) -> y in float64, the paper's
    # formula; weight is the applied gain (1 + w when zero-centred)
    oracle: str
    # the output is the input scaled by a per-row statistic with eps in a square root: norm.eps,
    # scale invariance and fp16 overflow of the statistic apply
    statistic: bool
    bias: bool  # takes a bias (norm.bias: null turns it on); the other kinds refuse one
    source: str = ""  # the paper, for docs and messages
    # parameters besides weight / bias, passed to the oracle after eps in this order (DyT: alpha)
    extra_params: tuple[str, ...] = ()
    # NormConfig fields only this kind reads (others refuse a non-null value), passed to the class
    # as keywords with their resolved_<name> value (DyT: alpha_init)
    options: tuple[str, ...] = ()
    eps: bool | None = None  # an eps without being a statistic kind (GatedNorm); None: statistic

    @property
    def takes_eps(self) -> bool:
        """True when ``norm.eps`` means something for this kind (``eps``, else ``statistic``)."""
        return self.statistic if self.eps is None else self.eps


@dataclass(frozen=True)
class Impl:
    """One implementation (of every kind that lists it); ``unhonoured`` names what it does not
    compute."""

    devices: tuple[str, ...] | None = None  # device types it runs on (None: any)
    interpreter_env: str | None = None  # set to 1, it runs on CPU too (Triton's interpreter)
    packages: tuple[str, ...] = ()  # import names it needs
    compiler: bool = False  # builds C++ on first use (g++ and ninja)
    upcast_false: bool = False  # honours norm.upcast=false (statistics in the input dtype)
    # the autograd modes it computes (the others raise one clear error)
    autograd: frozenset[str] = field(default_factory=lambda: frozenset(AUTOGRAD_MODES))
    float64: bool = True  # accepts fp64 input (gradcheck)
    casts: frozenset[NormCast] = frozenset(NormCast)  # the norm.cast orders it computes
    zero_centered: bool = True  # applies a weight stored as w as 1 + w added in fp32
    note: str = ""

    def honours(self, key: str, value: object) -> bool:
        """True when this implementation computes the norm option ``key`` set to ``value``
        (``upcast``, ``cast`` or ``zero_centered``; any value of another key)."""
        if key == "upcast":
            return bool(value) or self.upcast_false
        if key == "cast":
            return value in self.casts
        if key == "zero_centered":
            return not value or self.zero_centered
        return True

    def unhonoured(self, upcast: bool, cast: NormCast, zero_centered: bool) -> tuple[str, object]:
        """The first ``(key, value)`` as set that this implementation does not compute, or
        ``("", None)`` when it honours them all."""
        for key, value in (("upcast", upcast), ("cast", cast), ("zero_centered", zero_centered)):
            if not self.honours(key, value):
                return key, value
        return "", None


_REF = "normlab.norms.reference"

#: Kinds in the order studies list them (RMSNorm first, as the fp16 study always has).
KINDS: dict[NormKind, Kind] = {
    NormKind.rms: Kind(
        impls={
            NormImpl.torch: "normlab.norms.torch_impl:TorchRMSNorm",
            NormImpl.reference: f"{_REF}:ReferenceRMSNorm",
            NormImpl.compiled: "normlab.norms.compiled:CompiledRMSNorm",
            NormImpl.triton: "normlab.norms.triton_impl:TritonRMSNorm",
            NormImpl.cpp: "normlab.norms.cpp_impl:CppRMSNorm",
        },
        oracle=f"{_REF}:rms_norm_oracle",
        statistic=True,
        bias=False,
        source="Zhang & Sennrich 2019, arXiv:1910.07467",
    ),
    NormKind.layer: Kind(
        impls={
            NormImpl.torch: "normlab.norms.torch_impl:TorchLayerNorm",
            NormImpl.reference: f"{_REF}:ReferenceLayerNorm",
            NormImpl.compiled: "normlab.norms.compiled:CompiledLayerNorm",
            NormImpl.triton: "normlab.norms.triton_impl:TritonLayerNorm",
            NormImpl.cpp: "normlab.norms.cpp_impl:CppLayerNorm",
        },
        oracle=f"{_REF}:layer_norm_oracle",
        statistic=True,
        bias=True,
        source="Ba et al. 2016, arXiv:1607.06450",
    ),
    NormKind.dyt: Kind(
        impls={
            NormImpl.torch: "normlab.norms.dyt:TorchDyT",
            NormImpl.reference: "normlab.norms.dyt:ReferenceDyT",
            NormImpl.compiled: "normlab.norms.dyt:CompiledDyT",
            NormImpl.triton: "normlab.norms.triton_impl:TritonDyT",
        },
        oracle="normlab.norms.dyt:dyt_oracle",
        statistic=False,
        bias=True,
        source="Zhu et al. 2025, arXiv:2503.10622",
        extra_params=("alpha",),
        options=("alpha_init",),
    ),
    NormKind.derf: Kind(
        impls={
            NormImpl.reference: "normlab.norms.derf:ReferenceDerf",
            NormImpl.compiled: "normlab.norms.derf:CompiledDerf",
        },
        oracle="normlab.norms.derf:derf_oracle",
        statistic=False,
        bias=True,
        source="Chen et al. 2025, arXiv:2512.10938",
        extra_params=("alpha", "shift"),
        options=("alpha_init",),
    ),
    NormKind.gated: Kind(
        impls={
            NormImpl.reference: "normlab.norms.gated:ReferenceGatedNorm",
            NormImpl.compiled: "normlab.norms.gated:CompiledGatedNorm",
        },
        oracle="normlab.norms.gated:gated_oracle",
        statistic=False,  # the gate scales each element: not a row statistic's properties
        bias=False,
        source="Qiu et al. 2026, arXiv:2601.22966",
        extra_params=("gate_down", "gate_up"),
        options=("gate_rank",),
        eps=True,  # its RMSNorm's
    ),
}

_NO_JVP = frozenset({BACKWARD, DOUBLE_BACKWARD})

IMPLS: dict[NormImpl, Impl] = {
    NormImpl.torch: Impl(note="PyTorch's F.layer_norm / F.rms_norm"),
    NormImpl.reference: Impl(upcast_false=True, note="eager formula, statistics in fp32"),
    NormImpl.compiled: Impl(
        autograd=_NO_JVP,
        note="torch.compile of the reference; double backward through the reference formula",
    ),
    NormImpl.triton: Impl(
        devices=("cuda",),
        interpreter_env="TRITON_INTERPRET",
        packages=("triton",),
        autograd=frozenset({BACKWARD}),
        note="normlab's fused Triton kernels",
    ),
    NormImpl.cpp: Impl(
        devices=("cpu",),
        compiler=True,
        autograd=frozenset({BACKWARD}),
        casts=frozenset({NormCast.before_weight}),  # what the kernels compute
        zero_centered=False,
        note="normlab's fused C++ kernels, built on first use",
    ),
}

#: What ``norm.impl=auto`` picks, by device type ("*": any other), fastest first: the first that
#: the kind has and that honours every option asked for (``Impl.unhonoured``), one ranking for every
#: kind so that a kind-vs-kind comparison runs the same family of code wherever the kinds allow.
#: ``reference`` closes each list: the only one that honours ``upcast=false``. An implementation
#: that cannot run on the device is an error, not a fallback.
AUTO: dict[str, tuple[NormImpl, ...]] = {
    "cuda": (NormImpl.triton, NormImpl.compiled, NormImpl.reference),
    "cpu": (NormImpl.cpp, NormImpl.compiled, NormImpl.reference),
    "*": (NormImpl.compiled, NormImpl.reference),
}

#: The NormConfig keys that say where norms sit, not how one norm computes: a position override
#: (``norm.positions.<pos>``) cannot set them.
WHERE_KEYS = ("placement", "qk", "embedding", "depth_scale", "mix_ln", "blocks", "positions")

#: Positions each placement has inside a block (``qk`` comes from ``norm.qk``).
PLACEMENT_POSITIONS = {
    Placement.pre: ("attn_in", "mlp_in"),
    Placement.post: ("attn_out", "mlp_out"),
    Placement.peri: ("attn_in", "attn_out", "mlp_in", "mlp_out"),
    Placement.reordered: ("attn_out", "mlp_out"),
    Placement.hybrid: ("qk", "mlp_in"),  # qk: the q, k and v norms of the attention
    Placement.deepnorm: ("attn_out", "mlp_out"),
}

#: Placements whose block ends in a norm of the whole residual stream (``mlp_out`` after the
#: add): a model whose *last* block has one of these has no final norm (``normlab.model``).
STREAM_NORMED = frozenset({Placement.post, Placement.deepnorm})
