"""The norm factory: every norm in the model is built here, from the norm table (``table.py``).

``available_impls``, ``auto``, the error messages that list allowed values and the classes built
are all derived from :data:`~normlab.norms.table.KINDS` and :data:`~normlab.norms.table.IMPLS`;
classes are named as ``"module:attr"`` strings so a kernel module (Triton, C++) is imported only
when it is chosen.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from collections.abc import Callable

from torch import nn

from normlab.config import ConfigError, NormConfig, NormImpl, NormKind
from normlab.norms.table import AUTO, IMPLS, KINDS, Impl


def _load(target: str):
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def unavailable_reason(impl: NormImpl, device_type: str) -> str | None:
    """Why ``impl`` cannot run on ``device_type`` (its :class:`~normlab.norms.table.Impl` entry:
    devices, interpreter variable, packages), or None when it can. The compiler an ``Impl`` with
    ``compiler=True`` needs is checked when its kernels are first built."""
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
    """True when the Triton kernels can run on ``device_type`` (the table: CUDA, or CPU under the
    interpreter)."""
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


def auto_impl(kind: NormKind, device_type: str) -> NormImpl:
    """What ``norm.impl=auto`` means for ``kind`` on ``device_type``: the first implementation of
    ``table.AUTO[device_type]`` (or ``AUTO["*"]``) that the kind has; it may still be unable to
    run there (``resolve_norm`` then refuses, never falls back)."""
    prefs = AUTO.get(device_type, AUTO["*"])
    return next((i for i in prefs if i in KINDS[kind].impls), next(iter(KINDS[kind].impls)))


def resolve_norm(cfg: NormConfig, device_type: str) -> NormConfig:
    """Return ``cfg`` with ``impl=auto`` replaced by a concrete implementation and eps filled in
    (statistic kinds; the others have none and keep ``eps=None``).

    Raises:
        ConfigError: the kind has no such implementation, or it cannot run on ``device_type``,
            or it does not honour ``norm.upcast`` / ``norm.cast`` / ``norm.zero_centered`` as
            set (``Impl`` flags); one line naming the value and the allowed ones, never a silent
            fallback.
    """
    impl = auto_impl(cfg.kind, device_type) if cfg.impl == NormImpl.auto else cfg.impl
    shown = f"norm.impl={cfg.impl.name}" + (f" (-> {impl.name})" if impl != cfg.impl else "")
    if impl not in KINDS[cfg.kind].impls:
        raise ConfigError(
            f"{shown} has no norm.kind={cfg.kind.name} implementation; "
            f"allowed here: {_allowed(cfg.kind, device_type)}"
        )
    if cfg.bias and not KINDS[cfg.kind].bias:
        raise ConfigError(f"norm.bias=true is not allowed: norm.kind={cfg.kind.name} has no bias")
    if not cfg.upcast and not IMPLS[impl].upcast_false:
        allowed = ", ".join(i.name for i, spec in IMPLS.items() if spec.upcast_false)
        raise ConfigError(f"norm.upcast=false is not honoured by {shown}; only by: {allowed}")
    _refuse_unhonoured(cfg, impl, shown)
    reason = unavailable_reason(impl, device_type)
    if reason is not None:
        raise ConfigError(
            f"{shown} cannot run on device {device_type!r}: {reason}; "
            f"allowed here: {_allowed(cfg.kind, device_type)}"
        )
    eps = cfg.resolved_eps if KINDS[cfg.kind].statistic else None  # eps only where it means one
    return dataclasses.replace(cfg, impl=impl, eps=eps)


def _refuse_unhonoured(cfg: NormConfig, impl: NormImpl, shown: str) -> None:
    """``norm.cast`` / ``norm.zero_centered`` the implementation does not compute (``Impl.casts``,
    ``Impl.zero_centered``): one line naming the implementations that do."""
    if cfg.cast not in IMPLS[impl].casts:
        allowed = ", ".join(i.name for i, spec in IMPLS.items() if cfg.cast in spec.casts)
        raise ConfigError(
            f"norm.cast={cfg.cast.name} is not honoured by {shown}; only by: {allowed}"
        )
    if cfg.zero_centered and not IMPLS[impl].zero_centered:
        allowed = ", ".join(i.name for i, spec in IMPLS.items() if spec.zero_centered)
        raise ConfigError(f"norm.zero_centered=true is not honoured by {shown}; only by: {allowed}")


def norm_class(kind: NormKind, impl: NormImpl) -> type[nn.Module]:
    """The module class the table names for ``(kind, impl)``; ``impl`` must be concrete.

    Raises:
        ConfigError: ``impl`` is auto, or the kind has no such implementation.
    """
    try:
        target = KINDS[kind].impls[impl]
    except KeyError:
        allowed = ", ".join(i.name for i in KINDS[kind].impls)
        raise ConfigError(
            f"norm.impl={impl.name!r} is not a concrete norm.kind={kind.name} implementation; "
            f"allowed: {allowed}"
        ) from None
    return _load(target)


def oracle(kind: NormKind) -> Callable:
    """The kind's float64 oracle ``(x, weight, bias, eps, *extra_params) -> y`` (float64), from
    the table; ``weight`` is the applied gain."""
    return _load(KINDS[kind].oracle)


def build_norm(cfg: NormConfig, d_model: int) -> nn.Module:
    """Build one norm layer for inputs ``(..., d_model)`` from a resolved :class:`NormConfig`:
    the table's class with the shared options and the kind's own (``Kind.options``, each as its
    ``resolved_<name>``)."""
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
