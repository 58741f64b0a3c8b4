"""The norm contract, parametrized from the norm table (``normlab.config.norm_table``).

Every kind x every implementation that runs on this CPU (triton under ``TRITON_INTERPRET=1``) is
checked against the kind's float64 oracle (forward and backward, fp32 and bf16), by float64
gradcheck where the implementation takes fp64, for its parameter layout, its width check, the
preflight, and exactly the autograd modes the table says it supports (supported: matches the
oracle; unsupported: one clear error). Statistic kinds also get the statistic properties. A new
kind or implementation added to the table is covered with no edit here: the meta-tests at the
end register a fake implementation with a wrong backward and a toy kind, monkeypatched into the
table, and show the same helpers catch the first and pick up the second.

The device: ``NORMLAB_TEST_DEVICE`` (default ``cpu``; ``cuda`` on a GPU, where Triton is compiled
and not interpreted). The tests marked ``device`` (the oracle, its model widths, non-finite inputs,
the preflight) run there; ``scripts/gpu_check.sh`` runs them with ``-m device`` on CUDA, one JSON
line per case (``NORMLAB_CASES_JSONL``, ``tests/norms/conftest.py``). The others are CPU facts.

Tolerances (``assert_matches``): fp32 elementwise ``rtol 1e-5, atol 1e-5 * max(1, max|oracle|)``
(dweight / dbias sum over rows, so atol scales with them); bf16 normwise ``max|got - oracle| <=
2e-2 max|oracle|`` (about 10 units of roundoff 2^-9: the implementations round x_hat, the product
with the weight and the bias sum to bf16; worst measured 8e-3, see ``test_norms_oracle.py``).
"""

from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import jvp

import normlab.norms as norms
from normlab.config import ConfigError, NormCast, NormConfig, NormImpl, NormKind
from normlab.config import norm_table as table
from normlab.config.norm_table import (
    AUTOGRAD_MODES,
    BACKWARD,
    DOUBLE_BACKWARD,
    IMPLS,
    JVP,
    KINDS,
    Impl,
    Kind,
)
from normlab.norms.preflight import TOLERANCES, preflight
from normlab.norms.reference import NormBase

#: Where the ``device``-marked tests run (module docstring).
DEVICE_NAME = os.environ.get("NORMLAB_TEST_DEVICE", "cpu")
#: Triton runs interpreted on a CPU, compiled on a GPU.
INTERPRET = DEVICE_NAME == "cpu"
DEVICE = torch.device(DEVICE_NAME)
CONF = Path(__file__).resolve().parents[2] / "conf" / "norm"
D = 48  # one width (and few shapes) everywhere: compiled recompiles per shape, triton interprets
LOW_PRECISION_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    """Triton on CPU needs the interpreter; dynamo's recompile limit (8) is below this grid's
    count of shapes, so raise it to really run compiled (never a silent eager fallback)."""
    if INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    with torch._dynamo.config.patch(recompile_limit=64):
        yield


# ----------------------------------------------------------------- parametrization helpers


def runnable_here(impl) -> bool:
    """The implementation runs on :data:`DEVICE` (triton on a CPU: under the interpreter, if
    installed; ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` for a CPU session)."""
    return norms.unavailable_reason(impl, DEVICE.type) is None


def contract_cases(statistic_only: bool = False) -> list[tuple]:
    """``(kind, impl)`` for every kind of the table (statistic kinds only if asked) and every
    implementation of it that runs on this CPU."""
    return [
        (kind, impl)
        for kind, spec in KINDS.items()
        if spec.statistic or not statistic_only
        for impl in spec.impls
        if runnable_here(impl)
    ]


def layouts(kind) -> list[tuple[bool, bool]]:
    """``(affine, bias)`` for every parameter layout the kind has."""
    return [(True, True)] * KINDS[kind].bias + [(True, False), (False, False)]


def params(cases) -> list:
    return [pytest.param(k, i, id=f"{k.name}-{i.name}") for k, i in cases]


CASES = params(contract_cases())
STATISTIC_CASES = params(contract_cases(statistic_only=True))


def option_cases(slow_interpreted: bool = False) -> list:
    """``(kind, impl, zero_centered, cast)`` for every contract case and every option combination
    its implementation honours (``Impl.zero_centered``, ``Impl.casts``) except the default one,
    which the plain contract cases cover. ``slow_interpreted``: mark the cases of implementations
    that run interpreted on CPU (``Impl.interpreter_env``: Triton, ~10 s per float64 gradcheck)
    slow."""
    default = NormConfig()
    slow = lambda i: slow_interpreted and IMPLS[i].interpreter_env is not None  # noqa: E731
    return [
        pytest.param(
            k,
            i,
            zc,
            cast,
            id=f"{k.name}-{i.name}-{'zc' if zc else 'w'}-{cast.name}",
            marks=pytest.mark.slow if slow(i) else (),
        )
        for k, i in contract_cases()
        for zc in (False, True)
        if IMPLS[i].zero_centered or not zc
        for cast in NormCast
        if cast in IMPLS[i].casts and (zc, cast) != (default.zero_centered, default.cast)
    ]


def refused_options() -> list:
    """``(kind, impl, option, value)`` for every option an implementation does not honour."""
    out = []
    for k, i in contract_cases():
        spec = IMPLS[i]
        out += [
            pytest.param(k, i, "cast", c, id=f"{k.name}-{i.name}-{c.name}")
            for c in NormCast
            if c not in spec.casts
        ]
        if not spec.zero_centered:
            out.append(pytest.param(k, i, "zero_centered", True, id=f"{k.name}-{i.name}-zc"))
    return out


OPTION_CASES = option_cases()
OPTION_GRADCHECK_CASES = option_cases(slow_interpreted=True)
REFUSED_OPTIONS = refused_options()


# ------------------------------------------------------------------------- check helpers


def make(kind, impl, d=D, *, affine=True, bias=False, eps=1e-5, upcast=True, seed=0, **options):
    """The table's class for ``(kind, impl)`` with non-trivial parameter values (each its initial
    value plus noise: a gain around 1, a zero-centred weight around 0, DyT's alpha around 0.5);
    ``options``: ``zero_centered``, ``cast``. On :data:`DEVICE`; the noise is drawn on the CPU
    (the same values on every device)."""
    norm = norms.norm_class(kind, impl)(d, eps, affine=affine, bias=bias, upcast=upcast, **options)
    norm = norm.to(DEVICE)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_((0.4 * torch.randn(p.shape, generator=g)).to(DEVICE))
    return norm


def extras(kind, norm) -> list:
    """The kind's extra parameters (``Kind.extra_params``: DyT's alpha), in the oracle's order."""
    return [getattr(norm, name) for name in KINDS[kind].extra_params]


def applied(norm, weight):
    """The gain the oracle takes: ``weight``, or ``1 + weight`` for a zero-centred norm."""
    return weight if weight is None or not norm.zero_centered else 1 + weight


def assert_matches(got, want, dtype, what: str) -> None:
    """fp32/fp64: elementwise rtol 1e-5, atol 1e-5 * max(1, max|want|); bf16/fp16: normwise."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    if dtype in LOW_PRECISION_TOL:
        err = ((got.double() - want).abs().max() / want.abs().max()).item()
        assert err <= LOW_PRECISION_TOL[dtype], f"{what}: normwise relative error {err:.3g}"
    else:
        atol = 1e-5 * max(1.0, want.abs().max().item())
        torch.testing.assert_close(
            got.double(), want, rtol=1e-5, atol=atol, msg=lambda m: f"{what}: {m}"
        )


def oracle_grads(kind, x, norm, dy):
    """The oracle's output and its gradients in x, weight, bias and the extra parameters
    (float64)."""
    x64 = x.detach().double().requires_grad_()
    ps = [
        None if p is None else p.detach().double().requires_grad_()
        for p in (norm.weight, norm.bias, *extras(kind, norm))
    ]
    y64 = norms.oracle(kind)(x64, applied(norm, ps[0]), ps[1], norm.eps, *ps[2:])
    y64.backward(dy.double())
    return y64, x64.grad, [None if p is None else p.grad for p in ps]


def check_oracle(
    kind,
    impl,
    dtype=torch.float32,
    lead=(3, 5),
    affine=True,
    bias=False,
    d=D,
    check=None,
    **options,
) -> None:
    """Forward output and the x / weight / bias (/ extra) gradients against the kind's float64
    oracle, on :data:`DEVICE`; ``options``: ``zero_centered``, ``cast``; ``check(got, want, dtype,
    what)``: the comparison (default :func:`assert_matches`).

    Raises:
        AssertionError: naming the tensor and the error.
    """
    check = check or assert_matches
    norm = make(kind, impl, d, affine=affine, bias=bias, **options)
    g = torch.Generator().manual_seed(1)
    x = (1.5 * torch.randn(*lead, d, generator=g) + 0.3).to(DEVICE, dtype).requires_grad_()
    y = norm(x)
    assert y.dtype == dtype, f"output dtype {y.dtype} != input dtype {dtype}"
    dy = torch.randn(y.shape, generator=g).to(DEVICE, dtype)
    y.backward(dy)
    y64, dx64, grads64 = oracle_grads(kind, x, norm, dy)
    check(y.detach(), y64, dtype, "output")
    check(x.grad, dx64, dtype, "grad input")
    names = ("weight", "bias", *KINDS[kind].extra_params)
    ps = (norm.weight, norm.bias, *extras(kind, norm))
    for name, p, want in zip(names, ps, grads64, strict=True):
        if p is not None:
            scalar = name in KINDS[kind].extra_params
            check(p.grad, want, dtype, f"grad {name}" + (" (scalar)" if scalar else ""))


def _grads(out, inputs):
    """Gradients of ``out``; zeros where an input is unused (a kind linear in x has d2/dx2 = 0)."""
    gs = torch.autograd.grad(out, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(gs, inputs, strict=True)]


def check_double_backward(kind, impl) -> None:
    """d/dx of <dx, v> (and d/dweight) with ``create_graph=True`` against the oracle's."""
    norm = make(kind, impl, bias=KINDS[kind].bias)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, D, generator=g, requires_grad=True)
    dy, v = torch.randn(4, D, generator=g), torch.randn(4, D, generator=g)
    (dx,) = torch.autograd.grad(norm(x), x, dy, create_graph=True)
    got = _grads((dx * v).sum(), [x, norm.weight])

    x64 = x.detach().double().requires_grad_()
    w64 = norm.weight.detach().double().requires_grad_()
    b64 = None if norm.bias is None else norm.bias.detach().double()
    more = [p.detach().double() for p in extras(kind, norm)]
    y64 = norms.oracle(kind)(x64, applied(norm, w64), b64, norm.eps, *more)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double(), create_graph=True)
    want = _grads((dx64 * v.double()).sum(), [x64, w64])
    assert_matches(got[0], want[0], torch.float32, "double backward d/dx")
    assert_matches(got[1], want[1], torch.float32, "double backward d/dweight")


def check_jvp(kind, impl) -> None:
    """``torch.func.jvp`` in x against the oracle's tangent (float32)."""
    norm = make(kind, impl, bias=KINDS[kind].bias)
    g = torch.Generator().manual_seed(3)
    x, t = torch.randn(4, D, generator=g), torch.randn(4, D, generator=g)
    _, tangent = jvp(norm, (x,), (t,))
    w, b = (None if p is None else p.detach().double() for p in (norm.weight, norm.bias))
    more = [p.detach().double() for p in extras(kind, norm)]
    fn = lambda x: norms.oracle(kind)(x, applied(norm, w), b, norm.eps, *more)  # noqa: E731
    _, want = jvp(fn, (x.double(),), (t.double(),))
    assert_matches(tangent, want, torch.float32, "jvp tangent")


MODE_CHECKS = {BACKWARD: check_oracle, DOUBLE_BACKWARD: check_double_backward, JVP: check_jvp}
#: What an unsupported mode must say: one line naming the limitation.
MODE_ERRORS = {DOUBLE_BACKWARD: "has no double backward", JVP: "has no forward-mode AD"}


# ------------------------------------------------------------------- the contract, per case


@pytest.mark.device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_matches_the_float64_oracle_in_every_parameter_layout(kind, impl, dtype):
    for affine, bias in layouts(kind):
        check_oracle(kind, impl, dtype, affine=affine, bias=bias)


#: ``(rows, d)`` at model widths on a GPU, where tiling and masking matter (4097 is odd); small
#: shapes of the same kinds (a partial tile, an odd width) on a CPU.
WIDTHS = [(8192, 768), (4096, 4097)] if DEVICE.type == "cuda" else [(16, 128), (33, 129)]
#: Normwise bounds at these widths: fp32 1e-4 (dweight / dbias sum 8192 rows in fp32, so the
#: elementwise 1e-5 of ``assert_matches`` is loosened tenfold), bf16 2e-2 (about 10 units of bf16
#: roundoff). A scalar parameter's gradient (DyT's dalpha) is one sum over every element, where
#: terms of both signs cancel: bf16 5e-2 (the plain-op DyT, ``impl=torch``, multiplies dy by the
#: bf16-rounded gain in its before_weight backward).
WIDTH_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
SCALAR_TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


def assert_normwise(got, want, dtype, what: str) -> None:
    """``max|got - want| / max|want| <=`` :data:`WIDTH_TOL` (:data:`SCALAR_TOL` for a scalar
    parameter's gradient); a non-finite value fails."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    tol = (SCALAR_TOL if what.endswith("(scalar)") else WIDTH_TOL)[dtype]
    assert err <= tol, f"{what}: normwise relative error {err:.3g} > {tol:.0e}"


@pytest.mark.device
@pytest.mark.parametrize("shape", WIDTHS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_matches_the_float64_oracle_at_model_widths(kind, impl, dtype, shape):
    rows, d = shape
    check_oracle(kind, impl, dtype, lead=(rows,), bias=KINDS[kind].bias, d=d, check=assert_normwise)


@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_passes_float64_gradcheck_where_it_takes_fp64(kind, impl):
    if not IMPLS[impl].float64:
        pytest.skip(f"the table says {impl.name} takes no fp64 input")
    norm = make(kind, impl, 10, bias=KINDS[kind].bias).double()
    x = (torch.randn(2, 3, 10, dtype=torch.float64) + 0.3).requires_grad_()
    torch.autograd.gradcheck(norm, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)  # raises on mismatch


@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_parameter_layout_is_the_kinds(kind, impl):
    norm = norms.build_norm(norms.resolve_norm(NormConfig(kind=kind, impl=impl), "cpu"), 10)
    ps = dict(norm.named_parameters())
    more = set(KINDS[kind].extra_params)
    assert set(ps) == ({"weight", "bias"} if KINDS[kind].bias else {"weight"}) | more
    assert torch.equal(ps["weight"], torch.ones(10)) and ps["weight"].dtype == torch.float32
    if KINDS[kind].bias:
        assert torch.equal(ps["bias"], torch.zeros(10))
    else:
        with pytest.raises(ValueError, match="takes no bias"):
            norms.norm_class(kind, impl)(10, 1e-5, affine=True, bias=True)
    assert set(dict(make(kind, impl, 10, affine=False).named_parameters())) == more


@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_an_input_of_another_width_is_refused(kind, impl):
    for d, width in ((8, 3), (1, 3), (3, 1)):
        with pytest.raises((ValueError, RuntimeError)):
            make(kind, impl, d)(torch.randn(2, width))


@pytest.mark.device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_preflight_passes(kind, impl, dtype):
    cfg = norms.resolve_norm(NormConfig(kind=kind, impl=impl), DEVICE.type)
    assert preflight(cfg, 96, DEVICE, dtype)["max_error"] <= TOLERANCES[dtype]


@pytest.mark.parametrize("mode", AUTOGRAD_MODES)
@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_autograd_modes_are_exactly_the_tables(kind, impl, mode):
    if mode in IMPLS[impl].autograd:
        MODE_CHECKS[mode](kind, impl)
    else:
        with pytest.raises((ValueError, RuntimeError), match=MODE_ERRORS[mode]) as err:
            MODE_CHECKS[mode](kind, impl)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_without_forward_ad_tangents_are_refused_never_zero(kind, impl):
    """Under no_grad (where a kernel is called without autograd) and with forward_ad dual
    tensors too: cpp returned zero tangents for torch.func.jvp under no_grad."""
    if JVP in IMPLS[impl].autograd:
        pytest.skip(f"the table says {impl.name} computes forward-mode AD")
    norm = make(kind, impl)
    x, t = torch.randn(2, D), torch.randn(2, D)
    with torch.no_grad(), pytest.raises(ValueError, match=MODE_ERRORS[JVP]):
        jvp(norm, (x,), (t,))
    with fwAD.dual_level(), pytest.raises(ValueError, match=MODE_ERRORS[JVP]):
        norm(fwAD.make_dual(x, t))


# ------------------------------------------- zero-centred weights and cast orders, per case


@pytest.mark.device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("kind", "impl", "zero_centered", "cast"), OPTION_CASES)
def test_every_honoured_option_matches_the_float64_oracle(kind, impl, zero_centered, cast, dtype):
    check_oracle(kind, impl, dtype, bias=KINDS[kind].bias, zero_centered=zero_centered, cast=cast)


@pytest.mark.parametrize(("kind", "impl", "zero_centered", "cast"), OPTION_GRADCHECK_CASES)
def test_every_honoured_option_passes_float64_gradcheck(kind, impl, zero_centered, cast):
    if not IMPLS[impl].float64:
        pytest.skip(f"the table says {impl.name} takes no fp64 input")
    opts = {"zero_centered": zero_centered, "cast": cast}
    norm = make(kind, impl, 10, bias=KINDS[kind].bias, **opts).double()
    x = (torch.randn(2, 3, 10, dtype=torch.float64) + 0.3).requires_grad_()
    torch.autograd.gradcheck(norm, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("kind", "impl", "option", "value"), REFUSED_OPTIONS)
def test_an_option_the_table_says_is_not_honoured_is_refused_in_one_line(kind, impl, option, value):
    shown = value.name if isinstance(value, Enum) else str(value).lower()
    allowed = ", ".join(
        i.name
        for i, spec in IMPLS.items()
        if (value in spec.casts if option == "cast" else spec.zero_centered)
    )
    cfg = NormConfig(kind=kind, impl=impl, **{option: value})
    with pytest.raises(ConfigError) as err:
        norms.resolve_norm(cfg, "cpu")
    assert str(err.value) == (
        f"norm.{option}={shown} is not honoured by norm.impl={impl.name}; only by: {allowed}"
    )
    with pytest.raises(ValueError, match=f"does not honour {option}"):
        norms.norm_class(kind, impl)(10, 1e-5, **{option: value})


# ------------------------------------------------------------ statistic kinds only


@pytest.mark.parametrize(("kind", "impl"), STATISTIC_CASES)
def test_statistic_kind_is_invariant_to_positive_input_scale(kind, impl):
    norm = make(kind, impl, eps=1e-10)
    x = torch.randn(4, D) + 0.5
    y = norm(x)
    for c in (1e-2, 7.0, 1e3):
        torch.testing.assert_close(norm(c * x), y, rtol=1e-5, atol=1e-5)


def _signs() -> torch.Tensor:
    return torch.tensor([1.0, -1.0]).repeat(D // 2)  # mean 0, mean square 1: both statistics


@pytest.mark.parametrize(("kind", "impl"), STATISTIC_CASES)
def test_statistic_kind_adds_eps_inside_the_square_root(kind, impl):
    """Rows of +-c with eps = 0.5: c / sqrt(c^2 + eps), not c / (|c| + eps) nor 1 + eps."""
    c, eps = 0.5, 0.5
    y = make(kind, impl, eps=eps, affine=False)((c * _signs())[None])
    torch.testing.assert_close(y, (c / (c * c + eps) ** 0.5 * _signs())[None], rtol=1e-6, atol=0)


@pytest.mark.parametrize(("kind", "impl"), STATISTIC_CASES)
def test_statistic_kind_in_fp16_overflows_only_where_upcast_false_is_honoured(kind, impl):
    """Rows of +-300 in fp16: 300^2 = 90000 > 65504. With fp32 statistics the output is +-1;
    an implementation that honours upcast=false squares in fp16: inf, rsqrt(inf) = 0."""
    x = (300.0 * _signs()).half()[None]
    assert torch.isinf(x * x).all()
    torch.testing.assert_close(make(kind, impl, affine=False)(x), _signs().half()[None])
    if IMPLS[impl].upcast_false:
        assert (make(kind, impl, affine=False, upcast=False)(x) == 0).all()
    else:
        with pytest.raises(ConfigError, match="upcast=false"):
            norms.resolve_norm(NormConfig(kind=kind, impl=impl, upcast=False), "cpu")


# ------------------------------------------------------------------------------ the table


def test_every_kind_and_concrete_impl_is_in_the_table():
    assert set(KINDS) == set(NormKind)
    assert set(IMPLS) == set(NormImpl) - {NormImpl.auto}
    for spec in KINDS.values():
        assert NormImpl.reference in spec.impls  # preflight's yardstick
        assert callable(norms.oracle(next(k for k, v in KINDS.items() if v is spec)))


def test_bias_null_is_the_kinds_default_and_an_explicit_bias_is_refused_where_there_is_none():
    for kind, spec in KINDS.items():
        assert NormConfig(kind=kind).bias is spec.bias
        assert NormConfig(kind=kind, affine=False).bias is False
        if not spec.bias:
            with pytest.raises(ConfigError, match=rf"norm.bias=true .*norm.kind={kind.name}"):
                NormConfig(kind=kind, bias=True)


def test_every_kind_has_a_yaml_whose_comments_list_no_implementations():
    names = {i.name for i in NormImpl} - {"auto"}
    kinds = set()
    for path in CONF.glob("*.yaml"):
        for line in path.read_text().splitlines():
            comment = line.partition("#")[2]
            listed = {w for w in re.findall(r"\w+", comment) if w in names}
            assert len(listed) < 2, f"{path.name}: comment lists implementations {listed}"
            if line.startswith("kind:"):
                kinds.add(line.split(":")[1].split("#")[0].strip())
    assert kinds == {k.name for k in KINDS}


def test_available_impls_and_auto_follow_the_table(monkeypatch):
    assert norms.available_impls("cpu") == [i.name for i in IMPLS if runnable_here(i)]
    assert (
        norms.resolve_norm(NormConfig(kind=NormKind.rms, impl=NormImpl.auto), "cpu").impl
        == (table.AUTO["cpu"][0])
    )
    assert norms.auto_impl(NormKind.rms, "mps") == table.AUTO["*"][0]
    # auto on cuda wants triton; without the package it is an error, never a fallback
    monkeypatch.setitem(IMPLS, NormImpl.triton, Impl(devices=("cuda",), packages=("no_such_pkg",)))
    with pytest.raises(ConfigError, match=r"norm.impl=auto \(-> triton\) cannot run .*no_such_pkg"):
        norms.resolve_norm(NormConfig(impl=NormImpl.auto), "cuda")


def test_errors_list_the_allowed_values_from_the_table(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ConfigError) as err:
        norms.resolve_norm(NormConfig(impl=NormImpl.triton), "cpu")
    allowed = ", ".join([*norms.available_impls("cpu", NormKind.layer), "auto"])
    assert str(err.value).endswith(f"allowed here: {allowed}") and "TRITON_INTERPRET=1" in str(
        err.value
    )
    with pytest.raises(ConfigError, match=r"norm.impl=cpp cannot run on device 'cuda': .*CPU"):
        norms.resolve_norm(NormConfig(impl=NormImpl.cpp), "cuda")
    monkeypatch.setitem(KINDS, NormKind.rms, Kind({NormImpl.reference: "x:y"}, "x:y", True, False))
    with pytest.raises(ConfigError, match="has no norm.kind=rms implementation; allowed here: "):
        norms.resolve_norm(NormConfig(kind=NormKind.rms, impl=NormImpl.torch), "cpu")


# ----------------------------------------- meta-tests: a new entry is tested with no edit


class FakeImpl(Enum):
    """A stand-in for a new ``NormImpl`` member (the table only needs hashable keys with .name)."""

    wrong_backward = "wrong_backward"


class FakeKind(Enum):
    """A stand-in for a new ``NormKind`` member."""

    center = "center"


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1.01


class WrongBackwardLayerNorm(NormBase):
    """LayerNorm with the right output and dx 1% too large."""

    takes_bias = True

    def forward(self, x):
        self.check_input(x)
        return torch.nn.functional.layer_norm(
            _ScaleGrad.apply(x), (self.d,), self.weight, self.bias, self.eps
        )


def center_oracle(x, weight, bias, eps):
    """Toy kind: ``(x - mean(x)) * w + b`` in float64 (no statistic in a square root)."""
    y = x.double() - x.double().mean(-1, keepdim=True)
    y = y if weight is None else y * weight.double()
    return y if bias is None else y + bias.double()


class CenterNorm(NormBase):
    """The toy kind's implementation."""

    forward_ad = True

    def forward(self, x):
        self.check_input(x)
        y = x - x.mean(-1, keepdim=True)
        y = y if self.weight is None else y * self.weight
        return y if self.bias is None else y + self.bias


def test_a_registered_implementation_with_a_wrong_backward_is_caught(monkeypatch):
    monkeypatch.setitem(IMPLS, FakeImpl.wrong_backward, Impl(autograd=frozenset({BACKWARD})))
    monkeypatch.setitem(
        KINDS[NormKind.layer].impls, FakeImpl.wrong_backward, f"{__name__}:WrongBackwardLayerNorm"
    )
    assert (NormKind.layer, FakeImpl.wrong_backward) in contract_cases()
    with pytest.raises(AssertionError, match="grad input") as err:
        check_oracle(NormKind.layer, FakeImpl.wrong_backward, bias=True)
    print(f"\ncontract check on {FakeImpl.wrong_backward.name}:", str(err.value).splitlines()[:4])
    check_oracle(NormKind.layer, NormImpl.reference, bias=True)  # the same check passes the oracle


def test_a_kind_added_only_to_the_table_is_parametrized_and_checked(monkeypatch):
    monkeypatch.setitem(
        KINDS,
        FakeKind.center,
        Kind(
            impls={NormImpl.reference: f"{__name__}:CenterNorm"},
            oracle=f"{__name__}:center_oracle",
            statistic=False,
            bias=True,
        ),
    )
    assert (FakeKind.center, NormImpl.reference) in contract_cases()
    assert (FakeKind.center, NormImpl.reference) not in contract_cases(statistic_only=True)
    assert layouts(FakeKind.center) == [(True, True), (True, False), (False, False)]
    for affine, bias in layouts(FakeKind.center):
        check_oracle(FakeKind.center, NormImpl.reference, affine=affine, bias=bias)
    for mode in AUTOGRAD_MODES:
        MODE_CHECKS[mode](FakeKind.center, NormImpl.reference)


@pytest.mark.device
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_nan_and_inf_inputs_give_the_oracles_non_finite_values(kind, impl, dtype):
    """A NaN and both infinities in the input (rows 1-3; row 0 finite) come out where the float64
    oracle puts them, forward and backward: no implementation's rounding turns a non-finite value
    into a finite one (a diverging run must not be hidden from the divergence check)."""
    norm = make(kind, impl)
    g = torch.Generator().manual_seed(1)
    x = (1.5 * torch.randn(4, D, generator=g) + 0.3).to(dtype)
    x[1, 5], x[2, 7], x[3, 9] = float("nan"), float("inf"), float("-inf")
    x = x.to(DEVICE).requires_grad_()
    y = norm(x)
    dy = torch.randn(y.shape, generator=g).to(DEVICE, dtype)
    y.backward(dy)
    y64, dx64, _ = oracle_grads(kind, x, norm, dy)
    for what, got, want in (("output", y.detach(), y64.detach()), ("grad input", x.grad, dx64)):
        got = got.double()
        assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN where the oracle has none"
        assert torch.equal(got.isinf(), want.isinf()), f"{what}: inf where the oracle has none"
        inf = want.isinf()
        assert torch.equal(got[inf], want[inf]), f"{what}: an infinity changed sign"
        assert torch.isfinite(got[0]).all(), f"{what}: the finite row is not finite"
