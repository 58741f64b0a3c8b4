"""Preflight: before training, check the chosen norm implementation against the reference.

``preflight`` runs the run's norm and the eager reference of the same kind and parameters forward
and backward on one random ``(64, d_model)`` input (a private CPU generator, non-zero mean, random
weight and bias) on the run's device and dtype, and compares output, dx, dweight and dbias by the
normwise relative error ``max|got - ref| / max|ref|`` against ``TOLERANCES``. ``preflight_model``
checks every distinct norm of the model in the dtype it receives (``norm_input_dtypes``).

Why: docs/norms.md
"""

from __future__ import annotations

import dataclasses
import math

import torch

from normlab.config import ConfigError, ModelConfig, NormConfig, NormImpl, Placement, QKNorm
from normlab.config.schedule import BLOCK_POSITIONS
from normlab.norms import build_norm, resolve_norm

#: Normwise relative tolerance by input dtype. In fp32 the two sides differ only in the order of
#: their sums; in bf16 / fp16 they round intermediates at different points, and one rounding at the
#: largest element is up to 2^-8 (bf16) or 2^-11 (fp16) of it.
TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-5,
    torch.float32: 1e-5,
    torch.bfloat16: 3e-2,
    torch.float16: 1e-2,
}
_NAMES = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}
ROWS = 64


def _rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|got - ref| / max|ref|`` in float64; inf when ``got`` is not finite or shapes differ."""
    if got.shape != ref.shape or not torch.isfinite(got).all():
        return math.inf
    diff = (got.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    return diff / scale if scale > 0 else diff  # normwise: values that cancel stay meaningful


def preflight(
    norm_cfg: NormConfig, d_model: int, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> dict:
    """Check resolved ``norm_cfg``'s implementation against the reference on a ``(64, d_model)``
    input of ``dtype`` (parameters fp32): ``{impl, kind, dtype, shape, tolerance, errors (output,
    dx, d<param>), max_error}``. ConfigError (one line) beyond tolerance or for an ``auto`` impl."""
    if norm_cfg.impl == NormImpl.auto:
        raise ConfigError(
            "norm.impl=auto: preflight needs the resolved implementation (norms.resolve_norm)"
        )
    tol = TOLERANCES.get(dtype, 1e-2)
    impl = build_norm(norm_cfg, d_model).to(device)
    ref = build_norm(dataclasses.replace(norm_cfg, impl=NormImpl.reference), d_model).to(device)
    g = torch.Generator().manual_seed(seed)  # on the CPU: drawn there, moved to the device
    with torch.no_grad():
        for p in impl.parameters():  # non-trivial gain, shift (DyT: alpha), shared by both
            p.add_((0.5 * torch.randn(p.shape, generator=g)).to(p.device))
        ref.load_state_dict(impl.state_dict())
    x = (1.5 * torch.randn(ROWS, d_model, generator=g) + 0.3).to(device=device, dtype=dtype)
    dy = torch.randn(ROWS, d_model, generator=g).to(device=device, dtype=dtype)

    def run(norm: torch.nn.Module) -> dict[str, torch.Tensor]:
        xi = x.clone().requires_grad_()
        with torch.enable_grad():
            y = norm(xi)
            params = {f"d{name}": p for name, p in norm.named_parameters(recurse=False)}
            grads = torch.autograd.grad(y, [xi, *params.values()], dy)
        return {"output": y.detach(), "dx": grads[0], **dict(zip(params, grads[1:], strict=True))}

    got, want = run(impl), run(ref)
    errors = {k: _rel_error(got[k], want[k]) for k in want}
    worst = max(errors, key=errors.get)
    dtype_name = _NAMES.get(dtype, str(dtype).removeprefix("torch."))
    result = {
        "impl": norm_cfg.impl.name,
        "kind": norm_cfg.kind.name,
        "dtype": dtype_name,
        "shape": [ROWS, d_model],
        "tolerance": tol,
        "errors": errors,
        "max_error": errors[worst],
    }
    if not errors[worst] <= tol:  # also catches nan
        raise ConfigError(
            f"norm.impl={norm_cfg.impl.name} disagrees with the reference: "
            f"max rel error {errors[worst]:.1e} "
            f"in {worst} > tolerance {tol:.0e} for {dtype_name} "
            f"(norm.kind={norm_cfg.kind.name}, d_model={d_model}, device {device})"
        )
    return result


#: Positions fed by a matmul's output under ``placement``, besides ``qk``: they normalize the
#: branch's output before it meets the stream.
_BRANCH_OUTPUT = {
    Placement.peri: ("attn_out", "mlp_out"),
    Placement.reordered: ("attn_out", "mlp_out"),
}


def norm_input_dtypes(norm_cfg: NormConfig, autocast: torch.dtype) -> dict[str, torch.dtype]:
    """The input dtype of each norm position under ``autocast`` (fp32 for none): ``autocast`` for
    the QK norms and, under peri / reordered, the branch-output norms; fp32 for the rest."""
    # the residual stream stays fp32 under autocast: fp32 embeddings + low-precision branches
    low = {"qk", *_BRANCH_OUTPUT.get(norm_cfg.placement, ())}
    return {p: autocast if p in low else torch.float32 for p in norm_cfg.used_positions()}


def _norms_of_model(norm_cfg: NormConfig, model: ModelConfig, device_type: str):
    """``(position, block, resolved config, width)`` of every norm the GPT builds."""
    for pos in norm_cfg.used_positions():
        blocks = range(model.n_layer) if pos in BLOCK_POSITIONS else [None]
        for block in blocks:
            width = model.d_model
            if pos == "qk" and norm_cfg.qk == QKNorm.head:
                width = model.d_model // model.n_head
            yield pos, block, resolve_norm(norm_cfg.at(pos, block), device_type), width


def preflight_model(
    norm_cfg: NormConfig, model: ModelConfig, device: torch.device, autocast: torch.dtype
) -> dict:
    """``preflight`` of every distinct norm of the model (config, width) in the dtype it receives:
    the worst result plus ``"checks"`` (each with the first ``"position"`` that has it).
    ConfigError: the first norm that disagrees with its reference."""
    dtypes = norm_input_dtypes(norm_cfg, autocast)
    checks, seen = [], set()
    for pos, block, cfg, width in _norms_of_model(norm_cfg, model, device.type):
        key = (repr(cfg), width, dtypes[pos])
        if key in seen:
            continue
        seen.add(key)
        where = pos if block is None else f"{pos} (block {block})"
        checks.append({"position": where, **preflight(cfg, width, device, dtypes[pos])})
    worst = max(checks, key=lambda c: c["max_error"] / c["tolerance"])
    return {**{k: v for k, v in worst.items() if k != "position"}, "checks": checks}


__all__ = ["TOLERANCES", "norm_input_dtypes", "preflight", "preflight_model"]
