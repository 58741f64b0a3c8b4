"""DyT, zero-centred weights and the cast order: exact bf16 facts, what each option changes, and
the refusal of bad input (config, CLI). The float64 oracle forward / backward / gradcheck of every
honoured combination is in ``test_norm_contract.py`` (parametrized from the norm table); the
implementations here are derived from the same table.

The bf16 facts: a zero-centred weight w = 3.140625 (exact in bf16) is applied as 1 + w = 4.140625
(exact in fp32, not in bf16, where 1 + w rounds to 4.125); w = 2^-8 gives 1.00390625 (bf16: 1.0).
The applied scale is read off rows whose normalized values are exactly 3.5 and 0.5 (LayerNorm and
RMSNorm alike: mean 0, mean square 4 * 512^2 = 2^20, which absorbs eps in fp32).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import normlab.norms as norms
from normlab.bench.norms import summarize, summary_line
from normlab.commands.bench import _parser as bench_parser
from normlab.compose import to_train_config
from normlab.config import ConfigError, NormCast, NormConfig, NormImpl, NormKind
from normlab.config.norm_table import IMPLS, KINDS
from normlab.studies.norm_cost import variants
from normlab.training.diagnostics import named_norms
from normlab.training.setup import build_run

from ..conftest import TINY, run_cli
from .test_norm_contract import _environment, contract_cases, make  # noqa: F401 (fixture)

W_FACTS = [(3.140625, 4.140625, 4.125), (2.0**-8, 1.00390625, 1.0)]  # w, 1 + w in fp32, in bf16
CENTRED = [(k, i) for k, i in contract_cases() if IMPLS[i].zero_centered]
BOTH_CASTS = [(k, i) for k, i in contract_cases() if IMPLS[i].casts == frozenset(NormCast)]


def ids(cases) -> list:
    return [pytest.param(k, i, id=f"{k.name}-{i.name}") for k, i in cases]


def _rows(kind) -> torch.Tensor:
    """One row of 32 whose normalized values are exactly +-3.5 (columns 0, 16) and +-0.5; for DyT
    a row where tanh(0.5 x) is exactly 1 in fp32."""
    if not KINDS[kind].statistic:
        return torch.full((1, 32), 64.0)
    half = torch.tensor([7.0] + [1.0] * 15)
    return 512.0 * torch.cat([half, -half])[None]


def _centred(kind, impl, w: float, cast: NormCast):
    norm = norms.norm_class(kind, impl)(32, 1e-5, zero_centered=True, cast=cast).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.fill_(w)
    return norm


@pytest.mark.parametrize(("w", "exact", "in_bf16"), W_FACTS)
@pytest.mark.parametrize(("kind", "impl"), ids(CENTRED))
def test_zero_centred_bf16_weight_is_applied_as_one_plus_w_in_fp32(kind, impl, w, exact, in_bf16):
    assert torch.tensor(w, dtype=torch.bfloat16) + 1 == in_bf16  # what bf16 addition would give
    x, top = _rows(kind), 3.5 if KINDS[kind].statistic else 1.0
    for cast in IMPLS[impl].casts:
        norm = _centred(kind, impl, w, cast)
        assert norm.gain().dtype == torch.float32 and (norm.gain() == exact).all()
        y = norm(x)  # fp32 input, bf16 parameters: the gain is applied unrounded
        assert y.dtype == torch.float32 and y[0, 0].item() == top * exact, cast.name
        if not KINDS[kind].statistic:
            continue
        y = norm(x.bfloat16())  # bf16 input and parameters
        bf16 = lambda v: torch.tensor(v).bfloat16().item()  # noqa: E731
        if cast == NormCast.after_weight:  # one rounding of 3.5 * 4.140625, not of 3.5 * 4.125
            assert y[0, 0].item() == bf16(3.5 * exact) != bf16(3.5 * in_bf16)
        else:  # before_weight casts the fp32 gain to the input dtype, as it does any weight
            assert y[0, 0].item() == bf16(3.5 * bf16(exact))


@pytest.mark.parametrize(("kind", "impl"), ids(BOTH_CASTS))
def test_the_cast_orders_differ_in_bf16_and_agree_in_fp32(kind, impl):
    g = torch.Generator().manual_seed(0)
    x = 1.5 * torch.randn(16, 48, generator=g) + 0.3
    before, after = (make(kind, impl, bias=KINDS[kind].bias, cast=c) for c in NormCast)
    assert torch.equal(before(x), after(x))
    yb, ya = before(x.bfloat16()), after(x.bfloat16())
    assert not torch.equal(yb, ya)
    assert ((yb.float() - ya.float()).abs() <= 2**-6 * ya.float().abs().max()).all()  # one ulp-ish


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("kind", "impl"), ids(CENTRED))
def test_a_fresh_zero_centred_norm_equals_the_standard_one(kind, impl, dtype):
    cls = norms.norm_class(kind, impl)
    bias = KINDS[kind].bias
    centred, plain = cls(48, 1e-5, bias=bias, zero_centered=True), cls(48, 1e-5, bias=bias)
    assert (centred.weight == 0).all() and (plain.weight == 1).all()
    x = (1.5 * torch.randn(8, 48, generator=torch.Generator().manual_seed(1)) + 0.3).to(dtype)
    assert torch.equal(centred(x), plain(x))


def test_dyt_is_weight_times_tanh_of_alpha_x_plus_bias_and_differs_from_layernorm():
    cfg = norms.resolve_norm(NormConfig(kind=NormKind.dyt, impl=NormImpl.reference), "cpu")
    assert cfg.eps is None and cfg.bias is True and cfg.resolved_alpha_init == 0.5
    dyt = norms.build_norm(cfg, 48)
    assert dyt.alpha.shape == (1,) and dyt.alpha.item() == 0.5
    layer = norms.build_norm(norms.resolve_norm(NormConfig(impl=NormImpl.reference), "cpu"), 48)
    x = 1.5 * torch.randn(4, 48, generator=torch.Generator().manual_seed(2)) + 0.3
    with torch.no_grad():
        dyt.weight.mul_(2.0), dyt.bias.add_(0.25)
    torch.testing.assert_close(dyt(x), 2.0 * torch.tanh(0.5 * x) + 0.25, rtol=1e-6, atol=1e-6)
    assert (dyt(x) - layer(x)).abs().max() > 0.1


def test_alpha_init_reaches_every_dyt_implementation_and_auto_picks_one_on_cpu():
    for impl in KINDS[NormKind.dyt].impls:
        if (NormKind.dyt, impl) in contract_cases():
            cfg = norms.resolve_norm(
                NormConfig(kind=NormKind.dyt, impl=impl, alpha_init=0.8), "cpu"
            )
            assert norms.build_norm(cfg, 8).alpha.item() == pytest.approx(0.8)
    auto = norms.resolve_norm(NormConfig(kind=NormKind.dyt), "cpu").impl
    assert auto in KINDS[NormKind.dyt].impls


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"kind": NormKind.dyt, "alpha_init": 0.0}, "norm.alpha_init=0.0 is not allowed: must be"),
        ({"kind": NormKind.dyt, "alpha_init": -1.0}, "norm.alpha_init=-1.0 is not allowed"),
        ({"kind": NormKind.dyt, "alpha_init": math.inf}, "norm.alpha_init=inf is not allowed"),
        ({"kind": NormKind.dyt, "alpha_init": math.nan}, "norm.alpha_init=nan is not allowed"),
        ({"kind": NormKind.rms, "alpha_init": 0.5}, "is not allowed: only norm.kind=dyt|"),
        ({"kind": NormKind.dyt, "eps": 1e-6}, "norm.kind=dyt has no statistic, so no eps"),
        ({"zero_centered": True, "affine": False}, "norm.zero_centered=true is not allowed: a"),
        (
            {"cast": NormCast.after_weight, "upcast": False, "impl": NormImpl.reference},
            "norm.cast=after_weight is not allowed: it needs norm.upcast=true",
        ),
    ],
)
def test_bad_option_values_are_one_config_error_line(fields, line):
    with pytest.raises(ConfigError) as err:
        NormConfig(**fields)
    assert line in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["norm.cast=foo"], "norm.cast=foo is not allowed (allowed: before_weight, after_weight)"),
        (
            ["norm=dyt", "norm.alpha_init=-0.5"],
            "norm.alpha_init=-0.5 is not allowed: must be a finite number > 0 "
            "(or null for the default 0.5)",
        ),
    ],
)
def test_the_cli_refuses_a_bad_option_with_one_line_and_exit_2(tmp_path, args, line):
    r = run_cli([*TINY, *args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"normlab: error: {line}"]


def test_the_bench_summary_compares_dyt_with_layernorm_too():
    rows = [
        {"kind": k, "impl": "compiled", "dtype": "fp32", "shape": [64, 128], "fwdbwd_ms": ms}
        for k, ms in (("layer", 2.0), ("rms", 1.6), ("dyt", 1.0))
    ]
    rms, dyt = summarize(rows)
    assert (rms["kind"], dyt["kind"]) == ("rms", "dyt") and dyt["dyt_faster_pct"] == 100.0
    assert summary_line(dyt) == (
        "fp32 64x128: DyT fastest (compiled, 1.000 ms) is 100% faster than LayerNorm fastest "
        "(compiled, 2.000 ms) fwd+bwd (50% less time)"
    )
    assert bench_parser().parse_args([]).kinds == [k.name for k in KINDS]  # dyt included
    assert variants("cpu", ["dyt"], None) == [
        ["norm=dyt", f"norm.impl={i}"] for i in norms.available_impls("cpu", NormKind.dyt)
    ]


@pytest.mark.parametrize(
    "variant",
    [["norm=dyt"], ["norm.zero_centered=true"], ["norm.cast=after_weight"]],
    ids=lambda v: v[0],
)
def test_each_new_option_keeps_the_runs_of_a_seed_paired(compose_cfg, variant):
    """Same first batches and the same initial weights for every parameter both share outside
    the norms (a norm's own parameters differ by design: a zero-centred weight starts at 0)."""

    def setup(overrides):
        args = ["experiment=loss_parity_cpu", "norm=layer", "seed=3", "norm.impl=torch"]
        cfg = to_train_config(compose_cfg([*args, *overrides]))
        run = build_run(dataclasses.replace(cfg, device="cpu"))
        return run.model, run.sampler

    (ma, a), (mb, b) = setup([]), setup(variant)
    for step in (0, 1, 599):
        assert torch.equal(a.train_batch(step)[0], b.train_batch(step)[0])
    sa, sb = ma.state_dict(), mb.state_dict()
    norm_names = {qual for _, qual, _ in named_norms(mb)}  # what diagnostics and norm_cost hook
    shared = [k for k in sa if k in sb and k.rsplit(".", 1)[0] not in norm_names]
    assert any(".attn." in k for k in shared) and any(".mlp." in k for k in shared)
    assert all(torch.equal(sa[k], sb[k]) for k in shared)
    built = {type(m).__name__ for _, _, m in named_norms(mb)}
    assert built == ({"TorchDyT"} if variant == ["norm=dyt"] else {"TorchLayerNorm"})
