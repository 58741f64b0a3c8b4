"""``torch.compile`` of the reference norms: inductor fuses them into one kernel on CPU and GPU.

The compiled function takes eps as a Python float, so dynamo guards on its value: a run (or a
multirun job in the same process) with another eps recompiles instead of reusing a stale kernel.
"""

from __future__ import annotations

import functools

import torch

from .reference import ReferenceLayerNorm, ReferenceRMSNorm, layer_norm_ref, rms_norm_ref


@functools.cache
def compiled_layer_norm():
    """The compiled :func:`layer_norm_ref` (built once per process, on first use)."""
    return torch.compile(layer_norm_ref, dynamic=False)


@functools.cache
def compiled_rms_norm():
    """The compiled :func:`rms_norm_ref` (built once per process, on first use)."""
    return torch.compile(rms_norm_ref, dynamic=False)


class CompiledLayerNorm(ReferenceLayerNorm):
    """Reference LayerNorm through ``torch.compile``; same parameters, same results."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return compiled_layer_norm()(x, self.weight, self.bias, self.eps, self.upcast)


class CompiledRMSNorm(ReferenceRMSNorm):
    """Reference RMSNorm through ``torch.compile``; same parameters, same results."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return compiled_rms_norm()(x, self.weight, self.eps, self.upcast)
