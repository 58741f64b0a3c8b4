"""The norm table mapped to code: the classes and oracles its ``"module:attr"`` strings name.

The table itself, the facts and nothing else, is :mod:`normlab.config.norm_table` (torch-free, so
that the config validates without torch); its names are re-exported here, the same objects, for
the code and the contract tests that read them next to the classes. A class or oracle module is
imported only when chosen (a Triton or C++ kernel module costs seconds to load or build).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from normlab.config import ConfigError, NormImpl, NormKind
from normlab.config.norm_table import (  # noqa: F401  (re-exported: normlab.norms.table.X)
    AUTO,
    AUTOGRAD_MODES,
    BACKWARD,
    DOUBLE_BACKWARD,
    IMPLS,
    JVP,
    KINDS,
    Impl,
    Kind,
)


def load(target: str):
    """The object a ``"module:attr"`` string names (importing the module)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


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
    return load(target)


def oracle(kind: NormKind) -> Callable:
    """The kind's float64 oracle ``(x, weight, bias, eps, *extra_params) -> y`` (float64), from
    the table; ``weight`` is the applied gain."""
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
