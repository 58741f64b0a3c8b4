"""No Triton kernel launch of ``norm.impl=triton`` passes one tensor as two pointer arguments.

``torch.compile`` may treat every pointer argument of a user kernel as written; two arguments that
share memory (an input standing in for an unused pointer, one buffer for two results) are then
cloned apart and one write is lost. Each kernel of ``triton_impl`` is replaced by a recorder that
notes its tensor arguments by parameter name and then launches the real kernel (interpreted on a
CPU; on the GPU check's device, compiled).
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

from .conftest import triton_device

pytest.importorskip("triton")
DEVICE = triton_device()

import normlab.norms.triton_impl as tk  # noqa: E402
from normlab.config import NormCast  # noqa: E402

KERNELS = ("_norm_fwd", "_norm_bwd", "_dyt_fwd", "_dyt_bwd")
D = 32


class _Recorder:
    """``kernel[grid](*args, **kwargs)``: appends ``(kernel name, {parameter: tensor})`` to
    ``launches``, then launches the real kernel."""

    def __init__(self, name: str, kernel, launches: list):
        self.name, self.kernel, self.launches = name, kernel, launches
        self.params = list(inspect.signature(kernel.fn).parameters)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = {**dict(zip(self.params, args, strict=False)), **kwargs}
            tensors = {k: v for k, v in named.items() if isinstance(v, torch.Tensor)}
            self.launches.append((self.name, tensors))
            return self.kernel[grid](*args, **kwargs)

        return launch


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[start, end)`` that ``t`` can address."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _shared(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """How ``a`` and ``b`` share memory (one storage, or overlapping bytes), or None."""
    if a.numel() == 0 or b.numel() == 0:
        return None
    if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
        return "one storage"
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return "overlapping bytes" if a0 < b1 and b0 < a1 else None


def _cases() -> list:
    """``(class, affine, bias, zero_centered, cast)``: every option branch of the three kinds."""
    kinds = [("layer", tk.TritonLayerNorm, True), ("rms", tk.TritonRMSNorm, False)]
    kinds.append(("dyt", tk.TritonDyT, True))
    out = []
    for (kind, cls, has_bias), affine, bias, zc, cast in itertools.product(
        kinds, (True, False), (True, False), (False, True), NormCast
    ):
        if (bias and not (has_bias and affine)) or (zc and not affine):
            continue
        name = f"{kind}-triton-{'w' if affine else 'no_w'}-{'b' if bias else 'no_b'}"
        name += f"{'-zc' if zc else ''}-{cast.name}"
        out.append(pytest.param(cls, affine, bias, zc, cast, id=name))
    return out


@pytest.mark.device
@pytest.mark.parametrize(("cls", "affine", "bias", "zero_centered", "cast"), _cases())
def test_no_triton_launch_passes_one_tensor_as_two_arguments(
    monkeypatch, cls, affine, bias, zero_centered, cast
):
    launches: list = []
    for name in KERNELS:
        monkeypatch.setattr(tk, name, _Recorder(name, getattr(tk, name), launches))
    norm = cls(D, 1e-5, affine=affine, bias=bias, zero_centered=zero_centered, cast=cast)
    norm = norm.to(DEVICE)
    x = torch.randn(3, 5, D, device=DEVICE, requires_grad=True)
    y = norm(x)
    y.backward(torch.randn_like(y))

    prefix = "_dyt" if cls is tk.TritonDyT else "_norm"
    assert sorted(name for name, _ in launches) == [f"{prefix}_bwd", f"{prefix}_fwd"]
    shared = [
        f"{name}: {p} and {q} share {how}"
        for name, tensors in launches
        for (p, a), (q, b) in itertools.combinations(tensors.items(), 2)
        if (how := _shared(a, b))
    ]
    assert not shared, "a kernel launch passes one tensor as two arguments:\n" + "\n".join(shared)
