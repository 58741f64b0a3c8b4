"""Which backend executes a norm module: the kernel family that runs it, for ``summary.json``'s
``kernels`` (a speed comparison between two backends is not a comparison of one design).

Backends: ``normlab_cpu`` (``impl=cpp``: normlab's C++ kernels), ``triton`` (``impl=triton``:
normlab's Triton kernels; ``triton-interpreter`` under ``TRITON_INTERPRET=1``), ``inductor``
(``impl=compiled``, or any eager implementation inside a model run with ``compile=true``),
``aten`` (``impl=torch`` and ``impl=reference``: PyTorch's eager operators) and ``quack``
(``impl=torch`` of RMSNorm on CUDA when PyTorch's bundled QuACK kernel may override
``F.rms_norm``: :func:`quack_rms_norm_available`). ``unknown`` for a class the norm table does not
list, nor any of its bases.

This is a detection by availability (what the installed packages and the device make PyTorch
dispatch to), not a trace of the kernels launched.
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
    """True when eager ``F.rms_norm`` on ``device`` may run PyTorch's bundled QuACK kernel instead
    of ATen's: a CUDA device of compute capability >= :data:`QUACK_CAPABILITY`, PyTorch >=
    :data:`QUACK_TORCH` and :data:`QUACK_MODULE` importable. ``F.layer_norm`` has no such override,
    and under ``torch.compile`` it does not fire. Detection by availability, not a trace."""
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
