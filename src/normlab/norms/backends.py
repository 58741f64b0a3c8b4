"""Which backend executes a norm module, for ``summary.json``'s ``kernels``.

``normlab_cpu`` (impl=cpp), ``triton`` (impl=triton; ``triton-interpreter`` under
``TRITON_INTERPRET=1``), ``inductor`` (impl=compiled, or any eager impl under ``compile=true``),
``aten`` (impl=torch and reference), ``quack`` (impl=torch RMSNorm where
``quack_rms_norm_available``), ``unknown`` (a class the table does not list, nor its bases).
Detected by availability (packages, device), not by a trace of the kernels launched.

Why: docs/norms.md
"""

from __future__ import annotations

import importlib.util
import os
import re

import torch
from torch import nn

from normlab.config import NormImpl, NormKind
from normlab.config.norm_table import IMPLS
from normlab.norms import table_entry

#: The first PyTorch (major, minor) whose eager ``F.rms_norm`` may dispatch to QuACK on CUDA.
QUACK_TORCH = (2, 10)
#: The import name of ``nvidia-cutlass-dsl``, which the QuACK kernels are written in.
QUACK_MODULE = "cutlass"
#: The least CUDA compute capability the QuACK kernels run on (Hopper, sm90).
QUACK_CAPABILITY = (9, 0)


def _torch_version() -> tuple[int, int]:
    """``torch.__version__`` as ``(major, minor)`` (``"2.10.0+cu128"`` -> ``(2, 10)``)."""
    major, minor = re.findall(r"\d+", str(torch.__version__))[:2]
    return int(major), int(minor)


def quack_rms_norm_available(device: torch.device) -> bool:
    """True when eager ``F.rms_norm`` on ``device`` may run PyTorch's bundled QuACK kernel: CUDA
    capability >= ``QUACK_CAPABILITY``, torch >= ``QUACK_TORCH``, ``QUACK_MODULE`` importable.
    Never for ``F.layer_norm`` or under ``torch.compile``."""
    if device.type != "cuda" or _torch_version() < QUACK_TORCH:
        return False
    if importlib.util.find_spec(QUACK_MODULE) is None:
        return False
    return tuple(torch.cuda.get_device_capability(device)) >= QUACK_CAPABILITY


def _listed(cls: type) -> tuple[NormKind | None, NormImpl | None]:
    """The table's ``(kind, impl)`` of ``cls`` or of its nearest listed base class."""
    for c in cls.__mro__:
        kind, impl = table_entry(c)
        if impl is not None:
            return kind, impl
    return None, None


def kernel_backend(module: nn.Module, device: torch.device, compiled: bool) -> str:
    """The backend (module docstring) that executes norm ``module`` on ``device``; ``compiled``:
    the model runs under ``torch.compile`` (``compile=true``). Availability, not a trace."""
    kind, impl = _listed(type(module))
    if impl is None:
        return "unknown"
    if impl == NormImpl.cpp:  # a custom op: an extern call under torch.compile too
        return "normlab_cpu"
    if impl == NormImpl.triton:
        interpreted = os.environ.get(IMPLS[NormImpl.triton].interpreter_env or "") == "1"
        return "triton-interpreter" if interpreted else "triton"
    if impl == NormImpl.compiled or compiled:
        return "inductor"
    if impl == NormImpl.torch and kind == NormKind.rms and quack_rms_norm_available(device):
        return "quack"
    return "aten"


def impl_class(module: nn.Module) -> str:
    """``module``'s class as ``package.module.Class`` (``normlab.norms.cpp_impl.CppRMSNorm``)."""
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


__all__ = ["impl_class", "kernel_backend", "quack_rms_norm_available"]
