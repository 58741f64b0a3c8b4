"""Preflight: before training, check the chosen norm implementation against the reference.

:func:`preflight` builds the norm that the run will use and the eager reference
(``normlab.norms.reference``) of the same kind with the same parameters, runs both forward and
backward on one random ``(64, d_model)`` input on the run's device and dtype, and compares the
output and the gradients dx, dweight and dbias.

Error measure, per tensor: normwise relative error ``max|got - ref| / max|ref|`` (elementwise
relative error is meaningless where values cancel to near zero). Tolerances, by the input dtype:

* fp32 (and fp64): 1e-5. Both sides compute the statistics in fp32 and differ only in the order of
  their sums; measured disagreement is ~1e-7 (outputs) to ~1e-6 (dweight summed over 64 rows).
* bf16: 3e-2, fp16: 1e-2. The implementations round intermediate values (``x_hat``, the product
  with the weight, the bias sum, ``dy * x_hat``) to the input dtype at different points; one
  rounding at the largest element is up to 2^-8 (bf16) or 2^-11 (fp16) of it. Worst measured
  (d 64-4096, 8 seeds, torch 2.13 CPU): bf16 1.7e-2 (torch LayerNorm dweight / dbias: its CPU
  backward accumulates them in bf16), 8e-3 otherwise; fp16 2e-3. A wrong formula (unbiased
  variance, eps outside the square root, a dropped term, a 1% scale error) is caught in fp32.

Pass the dtype the norms really receive (:func:`norm_input_dtypes`): in normlab's GPT the residual
stream stays fp32 under bf16/fp16 autocast (fp32 embeddings plus low-precision branch outputs
promote to fp32), so the norms on it see fp32 input whatever ``precision`` says; but a norm fed by a
matmul's output sees the autocast dtype: the QK norms (q and k come from ``c_attn``) and, with
``peri`` / ``reordered`` placement, the output norms ``attn_out`` / ``mlp_out`` (they normalize the
branch's output before it meets the stream). :func:`preflight_model` checks every distinct norm of
the model (position, block schedule, width) in the dtype it will see.

The input is drawn from a private generator (the global RNG, which seeds the model, is left
untouched) with a non-zero mean, and weight / bias are random, so every term of the gradients
matters. Every random tensor is drawn on the CPU (the same numbers on every device) and moved to
the run's device before it meets a tensor there: a device refuses an op that mixes devices.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from normlab.config import ConfigError, ModelConfig, NormConfig, NormImpl, Placement, QKNorm
from normlab.config.schedule import BLOCK_POSITIONS
from normlab.norms import build_norm, resolve_norm

#: Normwise relative tolerance by input dtype (module docstring).
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
    return diff / scale if scale > 0 else diff


def preflight(
    norm_cfg: NormConfig, d_model: int, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> dict:
    """Check ``norm_cfg``'s implementation against the reference, forward and backward.

    Args:
        norm_cfg: a resolved norm config (concrete ``impl``, as from ``norms.resolve_norm``).
        d_model: the hidden size the model will use.
        device: where training runs.
        dtype: the dtype of the norm's input (parameters stay fp32, as in the model); see above.

    Returns:
        ``{"impl", "kind", "dtype", "shape", "tolerance", "errors": {"output", "dx", "dweight",
        "dbias", "dalpha" (DyT)} (normwise relative errors, only for the tensors that exist),
        "max_error"}``.

    Raises:
        ConfigError: one line, ``norm.impl=X disagrees with the reference: max rel error E in T >
            tolerance TOL for DTYPE (...)``; also for an ``auto`` impl (resolve first).
    """
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


#: Positions fed by a matmul's output under ``placement``, besides ``qk`` (module docstring).
_BRANCH_OUTPUT = {
    Placement.peri: ("attn_out", "mlp_out"),
    Placement.reordered: ("attn_out", "mlp_out"),
}


def norm_input_dtypes(norm_cfg: NormConfig, autocast: torch.dtype) -> dict[str, torch.dtype]:
    """The dtype of the input each position of the model's norms receives under ``autocast`` (the
    forward's autocast dtype; fp32 for none): ``autocast`` for the QK norms and, under ``peri`` /
    ``reordered``, the branch-output norms; fp32 (the residual stream) for every other position.
    ``tests/norms/test_preflight.py`` checks this against the real model's forward."""
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
    """:func:`preflight` of every distinct norm of the model (kind, implementation and options of
    each position and block, its width) in the dtype it receives (:func:`norm_input_dtypes`).

    Returns:
        the worst check's :func:`preflight` result plus ``"checks"``: every check's result with its
        ``"position"`` (the first position and block that has it).

    Raises:
        ConfigError: the first norm that disagrees with its reference (:func:`preflight`).
    """
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
