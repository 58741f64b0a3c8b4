"""The norm factory: every norm in the model is resolved and built here, from the norm table.

The table (``normlab.config.norm_table``, torch-free) names ``"module:attr"`` strings that
``norm_class``, ``oracle`` and ``table_entry`` import. ``available_impls``, ``auto``, the error
messages that list allowed values and the classes built all derive from it.

Why: docs/norms.md
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable
from enum import Enum

from torch import nn

from normlab.config import ConfigError, NormConfig, NormImpl, NormKind
from normlab.config.norm_table import AUTO, IMPLS, KINDS, Impl

log = logging.getLogger(__name__)

__all__ = [
    "auto_impl",
    "available_impls",
    "build_norm",
    "norm_class",
    "oracle",
    "resolve_norm",
    "table_entry",
    "triton_usable",
    "unavailable_reason",
]


def load(target: str):
    """The object a ``"module:attr"`` string names (importing the module)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def norm_class(kind: NormKind, impl: NormImpl) -> type[nn.Module]:
    """The module class the table names for ``(kind, impl)``; ConfigError if ``impl`` is auto or
    the kind has no such implementation."""
    try:
        target = KINDS[kind].impls[impl]
    except KeyError:
        allowed = ", ".join(i.name for i in KINDS[kind].impls)
        raise ConfigError(
            f"norm.impl={impl.name!r} is not a concrete norm.kind={kind.name} implementation; "
            f"allowed: {allowed}"
        ) from None
    return load(target)


def oracle(kind: NormKind) -> Callable:
    """The kind's float64 oracle ``(x, weight, bias, eps, *extra_params) -> y``, weight applied."""
    return load(KINDS[kind].oracle)


def table_entry(cls: type) -> tuple[NormKind | None, NormImpl | None]:
    """The ``(kind, impl)`` whose table entry names ``cls`` (``"module:Class"``), or
    ``(None, None)`` for a class the table does not list (a subclass in a test)."""
    target = f"{cls.__module__}:{cls.__qualname__}"
    for kind, spec in KINDS.items():
        for impl, named in spec.impls.items():
            if named == target:
                return kind, impl
    return None, None


def unavailable_reason(impl: NormImpl, device_type: str) -> str | None:
    """Why ``impl`` cannot run on ``device_type`` (its table entry: devices, interpreter variable,
    packages), or None; a compiler is checked when the kernels are first built."""
    spec: Impl = IMPLS[impl]
    missing = [p for p in spec.packages if importlib.util.find_spec(p) is None]
    if missing:
        return f"it needs the {', '.join(missing)} package (pip install 'normlab[{missing[0]}]')"
    if spec.devices is None or device_type in spec.devices:
        return None
    where = " or ".join(d.upper() for d in spec.devices)
    if spec.interpreter_env and device_type == "cpu":
        if os.environ.get(spec.interpreter_env) == "1":
            return None
        return f"it runs on {where} (on CPU only under {spec.interpreter_env}=1, for tests)"
    return f"it runs on {where} only"


def triton_usable(device_type: str) -> bool:
    """True when the Triton kernels can run on ``device_type`` (CUDA, or CPU interpreted)."""
    return unavailable_reason(NormImpl.triton, device_type) is None


def available_impls(device_type: str, kind: NormKind | None = None) -> list[str]:
    """Names of the concrete implementations of ``kind`` (None: of any kind) that run on
    ``device_type``, in the table's order (``IMPLS``)."""
    kinds = [KINDS[kind]] if kind is not None else list(KINDS.values())
    return [
        impl.name
        for impl in IMPLS
        if any(impl in k.impls for k in kinds) and unavailable_reason(impl, device_type) is None
    ]


def _allowed(kind: NormKind, device_type: str) -> str:
    """The ``norm.impl`` values for ``kind`` on ``device_type``, for error messages."""
    return ", ".join([*available_impls(device_type, kind), "auto"])


def _lacks(cfg: NormConfig, impl: NormImpl) -> str | None:
    """What of ``cfg`` ``impl`` does not compute (``"no kind=dyt"``, ``"zero_centered=true"``), or
    None when it is an implementation of ``cfg.kind`` that honours all its options."""
    if impl not in KINDS[cfg.kind].impls:
        return f"no kind={cfg.kind.name}"
    key, value = IMPLS[impl].unhonoured(cfg.upcast, cfg.cast, cfg.zero_centered)
    return f"{key}={_typed(value)}" if key else None


def _typed(value: object) -> str:
    """A value as the user types it: an Enum's name, a bool in lower case."""
    return value.name if isinstance(value, Enum) else str(value).lower()


def auto_impl(kind: NormKind, device_type: str, cfg: NormConfig | None = None) -> NormImpl:
    """``norm.impl=auto`` for ``kind`` on ``device_type``: the first of ``AUTO[device_type]`` (else
    ``AUTO["*"]``) that honours every norm of ``cfg`` inheriting auto; those passed over are logged.
    ConfigError if none does; whether it runs here is ``resolve_norm``'s check."""
    cfg = cfg or NormConfig(kind=kind)
    inheriting = [d for _, d in cfg.derived() if d.impl == NormImpl.auto]
    # one ranking for every kind: kinds swept with the same options get the same implementation
    prefs = AUTO.get(device_type, AUTO["*"])
    passed_over = []
    for impl in prefs:
        lacking = next((why for d in inheriting if (why := _lacks(d, impl))), None)
        if lacking is None:
            if passed_over:
                log.info(
                    "norm.impl=auto -> %s (passed over: %s)", impl.name, "; ".join(passed_over)
                )
            return impl
        passed_over.append(f"{impl.name}: {lacking}")
    raise ConfigError(
        f"norm.impl=auto: none of {', '.join(i.name for i in prefs)} computes every norm of this "
        f"model as asked ({'; '.join(passed_over)}); set norm.impl, or an impl per position"
    )


def _refusal(cfg: NormConfig, shown: str, device_type: str) -> str | None:
    """One line saying why ``cfg.impl`` (``shown`` as the user set it) cannot build ``cfg`` on
    ``device_type``, or None when it can."""
    if cfg.impl not in KINDS[cfg.kind].impls:
        return (
            f"{shown} has no norm.kind={cfg.kind.name} implementation; "
            f"allowed here: {_allowed(cfg.kind, device_type)}"
        )
    key, value = IMPLS[cfg.impl].unhonoured(cfg.upcast, cfg.cast, cfg.zero_centered)
    if key:
        allowed = ", ".join(i.name for i, spec in IMPLS.items() if spec.honours(key, value))
        return f"norm.{key}={_typed(value)} is not honoured by {shown}; only by: {allowed}"
    reason = unavailable_reason(cfg.impl, device_type)
    if reason is not None:
        return (
            f"{shown} cannot run on device {device_type!r}: {reason}; "
            f"allowed here: {_allowed(cfg.kind, device_type)}"
        )
    return None


def resolve_norm(cfg: NormConfig, device_type: str) -> NormConfig:
    """``cfg`` with a concrete impl (``auto_impl``) and eps filled in where the kind takes one;
    every derived norm checked (kind has the impl, options honoured, runs on the device).
    ConfigError: one line naming the value and the allowed ones; never a fallback."""
    impl = auto_impl(cfg.kind, device_type, cfg) if cfg.impl == NormImpl.auto else cfg.impl
    eps = cfg.resolved_eps if KINDS[cfg.kind].takes_eps else None  # eps only where it means one
    resolved = dataclasses.replace(cfg, impl=impl, eps=eps)
    arrow = f" (-> {impl.name})" if impl != cfg.impl else ""
    for (where, asked), (_, norm) in zip(cfg.derived(), resolved.derived(), strict=True):
        shown = f"norm.impl={asked.impl.name}" + (arrow if asked.impl == NormImpl.auto else "")
        reason = _refusal(norm, shown, device_type)
        if reason is not None:
            raise ConfigError(reason if where == "norm" else f"{where}: {reason}")
    return resolved


def build_norm(cfg: NormConfig, d_model: int) -> nn.Module:
    """One norm layer for inputs ``(..., d_model)`` from a resolved ``NormConfig``: the table's
    class with the shared options and the kind's own (``Kind.options``, as ``resolved_<name>``)."""
    cls = norm_class(cfg.kind, cfg.impl)
    own = {name: getattr(cfg, f"resolved_{name}") for name in KINDS[cfg.kind].options}
    return cls(
        d_model,
        cfg.resolved_eps,
        affine=cfg.affine,
        bias=cfg.bias,
        upcast=cfg.upcast,
        zero_centered=cfg.zero_centered,
        cast=cfg.cast,
        **own,
    )
