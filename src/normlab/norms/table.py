"""The norm table: which implementations each kind has, and what each implementation needs.

This module is data, no torch: :data:`KINDS` maps a :class:`~normlab.config.NormKind` to a
:class:`Kind` (its implementations as ``"module:Class"`` strings, imported only when chosen, its
float64 oracle, whether it is a *statistic* kind, whether it takes a bias) and :data:`IMPLS` maps a
:class:`~normlab.config.NormImpl` to an :class:`Impl` (devices, packages, environment, the options
and autograd modes it honours). ``normlab.norms`` derives from it ``available_impls``, ``auto``,
every error message that lists allowed values and the classes it builds; the contract tests
(``tests/test_norm_contract.py``) derive their parametrization from it. Nothing else lists
implementations by hand.

Adding a kind: an Enum member in ``config.NormKind``, a reference class and a float64 oracle in
``reference.py``, one :data:`KINDS` entry, one ``conf/norm/<kind>.yaml`` (and the kind in
``config.KINDS_WITH_BIAS`` if it takes a bias). The contract tests then cover it with no edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from normlab.config import NormCast, NormImpl, NormKind

#: The autograd modes the contract tests check, in the order they are reported.
BACKWARD, DOUBLE_BACKWARD, JVP = "backward", "double_backward", "jvp"
AUTOGRAD_MODES = (BACKWARD, DOUBLE_BACKWARD, JVP)


@dataclass(frozen=True)
class Kind:
    """One norm kind.

    ``impls``: implementation -> ``"module:Class"``; each class takes
    ``(d, eps, affine=, bias=, upcast=, zero_centered=, cast=)`` (plus the kind's ``options``) and
    has parameters ``weight`` / ``bias`` of shape ``(d,)`` (or None). ``oracle``:
    ``"module:function"``, ``(x, weight, bias, eps, *extra_params) -> y`` computed in float64 from
    the paper's formula, ``weight`` being the applied gain (``1 + w`` when zero-centred).
    ``statistic``: the output is the input scaled by a per-row statistic (mean / mean square) with
    eps inside a square root, so scale invariance, the eps placement and fp16 overflow of the
    statistic apply. ``bias``: the kind takes a bias, and ``norm.bias: null`` turns it on.
    ``extra_params``: names of the kind's parameters besides ``weight`` / ``bias``, passed to the
    oracle after eps in this order (DyT: ``alpha``). ``options``: ``NormConfig`` fields only this
    kind reads, passed to the class as keywords with their resolved value (``resolved_<name>``;
    DyT: ``alpha_init``). The :class:`Impl` says which ``cast`` / ``zero_centered`` it honours.
    """

    impls: dict[NormImpl, str]
    oracle: str
    statistic: bool
    bias: bool
    source: str = ""  # the paper, for docs and messages
    extra_params: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Impl:
    """One implementation (of every kind that lists it).

    ``devices``: device types it runs on (None: any). ``interpreter_env``: an environment variable
    that, set to 1, lets it run on CPU too (Triton's interpreter, for tests). ``packages``: import
    names it needs. ``compiler``: builds C++ on first use (g++ and ninja). ``upcast_false``: honours
    ``norm.upcast=false`` (statistics in the input dtype). ``autograd``: the modes it computes
    (the others raise one clear error). ``float64``: accepts fp64 input (gradcheck).
    ``casts``: the ``norm.cast`` orders it computes; ``zero_centered``: it applies a weight stored
    as w as ``1 + w`` added in fp32 (the others are refused by ``resolve_norm``, one line).
    """

    devices: tuple[str, ...] | None = None
    interpreter_env: str | None = None
    packages: tuple[str, ...] = ()
    compiler: bool = False
    upcast_false: bool = False
    autograd: frozenset[str] = field(default_factory=lambda: frozenset(AUTOGRAD_MODES))
    float64: bool = True
    casts: frozenset[NormCast] = frozenset(NormCast)
    zero_centered: bool = True
    note: str = ""


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
            NormImpl.triton: "normlab.norms.triton_dyt:TritonDyT",
        },
        oracle="normlab.norms.dyt:dyt_oracle",
        statistic=False,
        bias=True,
        source="Zhu et al. 2025, arXiv:2503.10622",
        extra_params=("alpha",),
        options=("alpha_init",),
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
        casts=frozenset({NormCast.before_weight}),  # what the kernels compute today
        zero_centered=False,
        note="normlab's fused C++ kernels, built on first use",
    ),
}

#: What ``norm.impl=auto`` picks, by device type, first match among the kind's implementations;
#: "*" for any other device. An implementation that cannot run there is an error, not a fallback.
AUTO: dict[str, tuple[NormImpl, ...]] = {
    "cuda": (NormImpl.triton, NormImpl.compiled),
    "cpu": (NormImpl.cpp, NormImpl.compiled),
    "*": (NormImpl.compiled,),
}
