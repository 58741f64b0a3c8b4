"""A torch function mode that fails on any op whose tensors live on more than one device.

A CUDA device refuses ``cuda_tensor.add_(cpu_tensor)``; the CPU cannot see that mistake, and the
``meta`` device lets in-place ops through. Code under test is run on ``meta`` inside
:class:`OneDevice`, so a tensor made on the CPU that meets a device tensor fails here as it would
on a GPU. Explicit crossings (``to``, ``cpu``, ``cuda``, ``copy_``) are allowed, and so is a 0-dim
CPU tensor, which PyTorch treats as a scalar on every device.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree

#: The ops that move data between devices on purpose.
CROSSINGS = {
    torch.Tensor.to,
    torch.Tensor.cpu,
    torch.Tensor.cuda,
    torch.Tensor.copy_,
    torch._C.TensorBase.to,
    torch._C.TensorBase.copy_,
    torch._has_compatible_shallow_copy_type,  # Module.to asks it before replacing .data
}
#: Names of the same kind that have no stable object to compare (property setters).
CROSSING_NAMES = {"__set__"}


class MixedDevices(AssertionError):
    """An op got tensors on two devices (an AssertionError: no ``except RuntimeError`` hides it)."""


class OneDevice(TorchFunctionMode):
    """Raise :class:`MixedDevices` on any torch op (outside :data:`CROSSINGS`) whose tensor
    arguments, 0-dim CPU tensors aside, are on more than one device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in CROSSINGS and getattr(func, "__name__", "") not in CROSSING_NAMES:
            devices = {
                t.device
                for t in _pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.dim() == 0)
            }
            if len(devices) > 1:
                names = sorted(str(d) for d in devices)
                raise MixedDevices(f"{getattr(func, '__name__', func)} mixes devices {names}")
        return func(*args, **kwargs)
