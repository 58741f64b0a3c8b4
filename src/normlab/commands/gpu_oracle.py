"""Step 1 of ``scripts/gpu_check.sh``: every norm implementation on a device against the float64
oracle of the norm table, forward and backward, at realistic shapes.

``python -m normlab.commands.gpu_oracle --device cuda --shapes 8192x768,4096x4097 --json out.json``
checks each kind x implementation that :func:`normlab.norms.available_impls` lists for the device
(Triton on CUDA is compiled, ``TRITON_INTERPRET`` unset; on CPU it runs only under
``TRITON_INTERPRET=1``, set before this process starts, since Triton reads it at import). The
contract tests (``tests/test_norm_contract.py``) pin the same semantics on CPU at width 48; this
is the device-side counterpart at model widths, where tiling and masking (4097 is odd) matter.

Tolerances, normwise ``max|got - oracle| / max|oracle|`` per tensor (output, dx, dweight, dbias):
fp32 ``1e-4`` (the contract's elementwise ``1e-5`` is loosened tenfold because dweight / dbias sum
8192 rows in fp32 here, not 15), bf16 ``2e-2`` (the contract's bound: about 10 units of bf16
roundoff 2^-9). A scalar parameter's gradient (DyT's dalpha) is one sum over every element of
the batch, where terms of both signs cancel: its bf16 bound is ``5e-2`` (:data:`SCALAR_TOLERANCE`;
the paper's plain-op DyT, ``impl=torch``, gives 2.8e-2 at 16 x 128 because its before_weight
backward multiplies dy by the bf16-rounded gain; the fused implementations 2e-6). Exit status 1
when a case exceeds its tolerance or raises, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from normlab.config import NormImpl, NormKind
from normlab.norms import available_impls, norm_class, oracle
from normlab.norms.table import KINDS
from normlab.studies.bench_norms import DTYPES, csv, parse_shape
from normlab.studies.bench_step import recompile_limit
from normlab.training.distributed import resolve_device
from normlab.training.peak import device_name

TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 4e-3}
#: Bounds for the gradient of a scalar parameter (``Kind.extra_params``), see the module docstring.
SCALAR_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}
EPS = 1e-5


def normwise_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max|got - want| / max|want|`` in float64; inf when ``got`` has a non-finite value.

    Raises:
        ValueError: the shapes differ.
    """
    if got.shape != want.shape:
        raise ValueError(f"shape {tuple(got.shape)} != oracle shape {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check_case(kind: NormKind, impl: NormImpl, dtype: str, shape, device: torch.device) -> dict:
    """One case: a ``(rows, d)`` input ``1.5 N(0,1) + 0.3`` in ``dtype`` through the table's class
    with weight ``1 + 0.4 N(0,1)`` (bias ``0.4 N(0,1)`` where the kind has one, extra parameters
    such as DyT's alpha ``0.5 + 0.4 N(0,1)``), backward with
    ``dy ~ N(0,1)``; returns the normwise error of each tensor against the kind's float64 oracle,
    the tolerance and ``ok``."""
    rows, d = shape
    g = torch.Generator(device=device).manual_seed(0)
    norm = norm_class(kind, impl)(d, EPS, affine=True, bias=KINDS[kind].bias, upcast=True)
    norm = norm.to(device)
    extra = KINDS[kind].extra_params  # DyT's alpha: drawn around 0.5, its paper's init
    with torch.no_grad():
        for name, p in norm.named_parameters():
            mean = 1.0 if name == "weight" else 0.5 if name in extra else 0.0
            p.copy_(mean + 0.4 * torch.randn(p.shape, generator=g, device=device))
    x = (1.5 * torch.randn(rows, d, generator=g, device=device) + 0.3).to(DTYPES[dtype])
    x.requires_grad_()
    y = norm(x)
    dy = torch.randn(y.shape, generator=g, device=device).to(y.dtype)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    params = {"weight": norm.weight, "bias": norm.bias} | {n: getattr(norm, n) for n in extra}
    p64 = {
        n: None if p is None else p.detach().double().requires_grad_() for n, p in params.items()
    }
    y64 = oracle(kind)(x64, p64["weight"], p64["bias"], EPS, *(p64[n] for n in extra))
    y64.backward(dy.double())
    pairs = {"output": (y.detach(), y64.detach()), "dx": (x.grad, x64.grad)}
    for name, p, p_64 in ((f"d{n}", params[n], p64[n]) for n in params):
        if p is not None:
            pairs[name] = (p.grad, p_64.grad)
    errors = {name: normwise_error(got, want) for name, (got, want) in pairs.items()}
    scalar = {f"d{n}" for n in extra}
    worst = max(e for n, e in errors.items() if n not in scalar)
    scalar_ok = all(errors[n] <= SCALAR_TOLERANCE[dtype] for n in scalar)
    # max_error: the tensors bounded by TOLERANCE; scalar gradients are listed in errors
    return {"errors": errors, "max_error": worst, "ok": worst <= TOLERANCE[dtype] and scalar_ok}


def run_checks(device: torch.device, impls: list[str] | None, dtypes, shapes) -> dict:
    """Every kind x implementation (``impls``, default every one the device runs) x dtype x shape;
    a case that raises is recorded as failed with its error, the others still run."""
    cases = []
    with recompile_limit():
        for kind in KINDS:
            for impl in impls or available_impls(device.type, kind):
                if NormImpl[impl] not in KINDS[kind].impls:
                    continue
                for dtype in dtypes:
                    for shape in shapes:
                        case = {"kind": kind.name, "impl": impl, "dtype": dtype, "shape": shape}
                        t0 = time.perf_counter()
                        try:
                            case |= check_case(kind, NormImpl[impl], dtype, shape, device)
                        except Exception as e:  # a failed case is a finding, not the end
                            case |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
                        case["tolerance"] = TOLERANCE[dtype]
                        case["seconds"] = time.perf_counter() - t0
                        cases.append(case)
    return {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cases": cases,
        "passed": sum(c["ok"] for c in cases),
        "failed": sum(not c["ok"] for c in cases),
    }


def format_checks(result: dict) -> str:
    """One line per case: kind, impl, dtype, shape, worst normwise error / tolerance, ok/FAIL."""
    lines = [
        f"norm oracle check on {result['device_name']}: {result['passed']} ok, "
        f"{result['failed']} failed"
    ]
    for c in result["cases"]:
        shape = "x".join(map(str, c["shape"]))
        what = c.get("error") or f"max error {c['max_error']:.2e} (tol {c['tolerance']:.0e})"
        mark = "ok" if c["ok"] else "FAIL"
        lines.append(f"{c['kind']:5} {c['impl']:9} {c['dtype']:4} {shape:>9}  {what}  {mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the checks, print the table, write ``--json``; exit status."""
    p = argparse.ArgumentParser(
        prog="python -m normlab.commands.gpu_oracle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--impls", type=csv, help="implementations (default: every one that runs)")
    p.add_argument("--dtypes", type=csv, default=["fp32", "bf16"], help="default: fp32,bf16")
    p.add_argument("--shapes", type=csv, default=["8192x768", "4096x4097"], help="ROWSxHIDDEN")
    p.add_argument("--json", default="gpu_oracle.json", help="where to write the results")
    args = p.parse_args(argv)
    if bad := [d for d in args.dtypes if d not in TOLERANCE]:
        p.error(f"unknown dtype {', '.join(bad)}; allowed: {', '.join(TOLERANCE)}")
    if bad := [i for i in args.impls or [] if i not in NormImpl.__members__ or i == "auto"]:
        p.error(
            f"unknown impl {', '.join(bad)}; allowed: {', '.join(available_impls('cpu'))}, triton"
        )
    try:
        shapes = [parse_shape(s) for s in args.shapes]
    except ValueError:
        p.error(f"--shapes {','.join(args.shapes)}: expected ROWSxHIDDEN, e.g. 8192x768")
    result = run_checks(resolve_device(args.device), args.impls, args.dtypes, shapes)
    print(format_checks(result))
    Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
