"""The one registry of norm variants and the factory that builds every norm in the model.

Adding a variant: a member in ``config.NormImpl`` (or ``NormKind``), a class taking
``(d, eps, affine, bias, upcast)`` with parameters ``weight`` / ``bias``, one entry in
:data:`NORM_VARIANTS`, and the oracle tests pass for it. Classes are named as
``"module:attr"`` strings so a kernel module (Triton) is imported only when it is chosen.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os

from torch import nn

from normlab.config import ConfigError, NormConfig, NormImpl, NormKind

NORM_VARIANTS: dict[tuple[NormKind, NormImpl], str] = {
    (NormKind.layer, NormImpl.torch): "normlab.norms.torch_impl:TorchLayerNorm",
    (NormKind.rms, NormImpl.torch): "normlab.norms.torch_impl:TorchRMSNorm",
    (NormKind.layer, NormImpl.reference): "normlab.norms.reference:ReferenceLayerNorm",
    (NormKind.rms, NormImpl.reference): "normlab.norms.reference:ReferenceRMSNorm",
    (NormKind.layer, NormImpl.compiled): "normlab.norms.compiled:CompiledLayerNorm",
    (NormKind.rms, NormImpl.compiled): "normlab.norms.compiled:CompiledRMSNorm",
    (NormKind.layer, NormImpl.triton): "normlab.norms.triton_kernels:TritonLayerNorm",
    (NormKind.rms, NormImpl.triton): "normlab.norms.triton_kernels:TritonRMSNorm",
    (NormKind.layer, NormImpl.cpp): "normlab.norms.cpp_impl:CppLayerNorm",
    (NormKind.rms, NormImpl.cpp): "normlab.norms.cpp_impl:CppRMSNorm",
}

#: Implementations that ``auto`` may pick, by device type, best first.
AUTO_IMPL: dict[str, NormImpl] = {"cuda": NormImpl.triton, "cpu": NormImpl.cpp}


def triton_usable(device_type: str) -> bool:
    """True when the Triton kernels can run on ``device_type`` (CUDA, or CPU under the interpreter)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def available_impls(device_type: str) -> list[str]:
    """Names of the concrete implementations that run on ``device_type``, in registry order:
    torch, reference, compiled, then triton (CUDA, or CPU under TRITON_INTERPRET=1) and cpp (CPU)."""
    out = ["torch", "reference", "compiled"]
    if triton_usable(device_type):
        out.append("triton")
    if device_type == "cpu":
        out.append("cpp")
    return out


def _allowed(device_type: str) -> str:
    """The ``norm.impl`` values that run on ``device_type``, for error messages."""
    impls = available_impls(device_type)
    auto_runs = AUTO_IMPL.get(device_type, NormImpl.compiled).name in impls
    return ", ".join(impls + (["auto"] if auto_runs else []))


def resolve_norm(cfg: NormConfig, device_type: str) -> NormConfig:
    """Return ``cfg`` with ``impl=auto`` replaced by a concrete implementation and eps filled in.

    Raises:
        ConfigError: the implementation cannot run on ``device_type`` (never a silent fallback).
    """
    impl = cfg.impl
    if impl == NormImpl.auto:
        impl = AUTO_IMPL.get(device_type, NormImpl.compiled)
        if impl == NormImpl.triton and not triton_usable(device_type):
            raise ConfigError(
                "norm.impl=auto wants triton on cuda but triton is not installed: "
                "pip install 'normlab[triton]' or choose norm.impl=compiled"
            )
    if impl == NormImpl.triton and not triton_usable(device_type):
        raise ConfigError(
            f"norm.impl=triton cannot run on device {device_type!r}: it needs CUDA and the triton "
            f"package (on CPU only under TRITON_INTERPRET=1, for tests); allowed here: {_allowed(device_type)}"
        )
    if impl == NormImpl.cpp and device_type != "cpu":
        raise ConfigError(
            f"norm.impl=cpp runs on CPU only, not on device {device_type!r}; allowed here: {_allowed(device_type)}"
        )
    return dataclasses.replace(cfg, impl=impl, eps=cfg.resolved_eps)


def norm_class(kind: NormKind, impl: NormImpl) -> type[nn.Module]:
    """The module class registered for ``(kind, impl)``; ``impl`` must be concrete (not auto)."""
    try:
        target = NORM_VARIANTS[(kind, impl)]
    except KeyError:
        allowed = ", ".join(sorted({i.name for _, i in NORM_VARIANTS}))
        raise ConfigError(
            f"norm.impl={impl.name!r} is not a concrete implementation; allowed: {allowed}"
        ) from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def build_norm(cfg: NormConfig, d_model: int) -> nn.Module:
    """Build one norm layer for inputs ``(..., d_model)`` from a resolved :class:`NormConfig`."""
    cls = norm_class(cfg.kind, cfg.impl)
    return cls(d_model, cfg.resolved_eps, affine=cfg.affine, bias=cfg.bias, upcast=cfg.upcast)
