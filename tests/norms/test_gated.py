"""GatedNorm beyond the norm contract (which covers its oracle, gradcheck, parameter layout and
autograd modes from the table): the formula by hand, the gate's start at 1, ``norm.gate_rank``,
its eps, ``auto``, paired initialisation in the model and weight decay on the gate."""

from __future__ import annotations

import math

import pytest
import torch

import normlab.norms as norms
from normlab.config import ConfigError, ModelConfig, NormConfig, NormImpl, NormKind, OptimConfig
from normlab.config.norm_table import KINDS
from normlab.model import GPT
from normlab.training.setup import make_optimizer

GATED = NormKind.gated
IMPLS_HERE = [pytest.param(i, id=i.name) for i in KINDS[GATED].impls]


def built(impl=NormImpl.reference, d=2, **fields):
    return norms.build_norm(
        norms.resolve_norm(NormConfig(kind=GATED, impl=impl, **fields), "cpu"), d
    )


@pytest.mark.parametrize("impl", IMPLS_HERE)
def test_the_formula_by_hand_on_two_features(impl):
    """x = (3, 4): rms = sqrt(12.5); y = x / rms; W_down = (1, -1), W_up = (2, 0)^T."""
    norm = built(impl, gate_rank=1)
    with torch.no_grad():
        norm.gate_down.copy_(torch.tensor([[1.0, -1.0]]))
        norm.gate_up.copy_(torch.tensor([[2.0], [0.0]]))
    rms = math.sqrt((9 + 16) / 2 + 1e-5)
    y = [3 / rms, 4 / rms]
    z1 = y[0] - y[1]
    h = z1 / (1 + math.exp(-z1))  # silu
    gate = [2 / (1 + math.exp(-2 * h)), 1.0]  # 2 sigmoid(W_up h); the second row of W_up is 0
    want = torch.tensor([[y[0] * gate[0], y[1] * gate[1]]])
    got = norm(torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert gate[0] < 0.9  # the gate really scaled the first feature


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("impl", IMPLS_HERE)
def test_a_fresh_gated_norm_is_rms_norm_bit_for_bit(impl, dtype):
    """W_up starts at zero and the gate is 2 sigmoid(.), so it starts at exactly 1 (not 0.5):
    the reference is RMSNorm's reference bit for bit."""
    gated = built(impl, d=48)
    rms = norms.build_norm(
        norms.resolve_norm(NormConfig(kind=NormKind.rms, impl=NormImpl.reference), "cpu"), 48
    )
    assert (gated.gate_up == 0).all() and gated.gate_down.abs().max() > 0
    x = (1.5 * torch.randn(8, 48, generator=torch.Generator().manual_seed(0)) + 0.3).to(dtype)
    if impl == NormImpl.reference:  # the same eager arithmetic times exactly 1
        assert torch.equal(gated(x), rms(x))
    else:  # inductor sums in another order
        torch.testing.assert_close(gated(x), rms(x))


def test_gate_rank_sets_the_shapes_and_defaults_to_16():
    assert built(d=48).gate_down.shape == (16, 48)
    norm = built(d=48, gate_rank=32)
    assert norm.gate_down.shape == (32, 48) and norm.gate_up.shape == (48, 32)
    assert NormConfig(kind=GATED).resolved_gate_rank == 16
    assert NormConfig(kind=NormKind.rms).resolved_gate_rank is None


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (
            {"kind": GATED, "gate_rank": 0},
            "norm.gate_rank=0 is not allowed: must be an integer >= 1",
        ),
        ({"kind": GATED, "gate_rank": -3}, "norm.gate_rank=-3 is not allowed: must be an integer"),
        (
            {"kind": GATED, "gate_rank": 2.5},
            "norm.gate_rank=2.5 is not allowed: must be an integer",
        ),
        ({"kind": GATED, "gate_rank": True}, "norm.gate_rank=true is not allowed: must be an int"),
        (
            {"kind": NormKind.rms, "gate_rank": 16},
            "norm.gate_rank=16 is not allowed: only norm.kind=gated has a gate "
            "(use norm.gate_rank=null with norm.kind=rms)",
        ),
        ({"kind": GATED, "alpha_init": 0.5}, "norm.alpha_init=0.5 is not allowed: only norm.kind"),
        (
            {"kind": GATED, "bias": True},
            "norm.bias=true is not allowed: norm.kind=gated has no bias",
        ),
    ],
)
def test_bad_gated_values_are_one_config_error_line(fields, line):
    with pytest.raises(ConfigError) as err:
        NormConfig(**fields)
    assert line in str(err.value) and "\n" not in str(err.value)


def test_a_position_can_set_its_own_gate_rank():
    cfg = NormConfig(kind=GATED, positions={"final": {"gate_rank": 64}})
    assert cfg.at("final").resolved_gate_rank == 64 and cfg.at("attn_in").resolved_gate_rank == 16


def test_its_eps_is_its_rms_norms_and_reaches_the_module():
    """Not a statistic kind (the gate scales elements), yet norm.eps means something."""
    cfg = norms.resolve_norm(NormConfig(kind=GATED, impl=NormImpl.reference), "cpu")
    assert cfg.eps == 1e-5
    big = built(d=48, eps=1.0)
    assert big.eps == 1.0
    x = 0.1 * torch.randn(4, 48, generator=torch.Generator().manual_seed(3))
    assert not torch.allclose(big(x), built(d=48)(x))
    with pytest.raises(ConfigError, match="norm.kind=dyt has no statistic, so no eps"):
        NormConfig(kind=NormKind.dyt, eps=1e-6)


def test_auto_resolves_to_an_implementation_the_kind_has():
    impl = norms.resolve_norm(NormConfig(kind=GATED), "cpu").impl
    assert impl in KINDS[GATED].impls and impl == NormImpl.compiled  # cpp has no gated kernel


def _model(kind, seed, n_layer=2, **norm_fields):
    cfg = ModelConfig(name="t", n_layer=n_layer, n_head=2, d_model=32, context_length=16)
    cfg.vocab_size = 64
    norm = norms.resolve_norm(NormConfig(kind=kind, impl=NormImpl.reference, **norm_fields), "cpu")
    torch.manual_seed(seed)
    model = GPT(cfg, norm)
    return model, torch.get_rng_state()


def _is_norm_param(name: str) -> bool:
    return name.split(".")[-2] in {"attn_in", "mlp_in", "final", "q_norm", "k_norm"}


@pytest.mark.parametrize("seed", [0, 7])
def test_a_gated_and_an_rms_model_of_one_seed_share_every_other_parameter(seed):
    """Building the gates draws nothing from the global RNG: the embeddings, attention and MLP
    weights are the RMSNorm model's, the RNG is left where RMSNorm leaves it, and (gate at 1)
    the first logits are RMSNorm's."""
    (gated, rng_g), (rms, rng_r) = _model(GATED, seed), _model(NormKind.rms, seed)
    sg, sr = gated.state_dict(), rms.state_dict()
    shared = [k for k in sr if not _is_norm_param(k)]
    assert any(".attn." in k for k in shared) and any(".mlp." in k for k in shared)
    assert "tok_emb.weight" in shared and "pos_emb.weight" in shared
    assert all(torch.equal(sg[k], sr[k]) for k in shared)
    assert torch.equal(rng_g, rng_r)
    assert {k for k in sg if k not in sr} == {
        f"{p}.gate_{w}"
        for p in ("blocks.0.attn_in", "blocks.0.mlp_in", "blocks.1.attn_in", "blocks.1.mlp_in")
        + ("final",)
        for w in ("down", "up")
    }
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert torch.equal(gated(idx)[0], rms(idx)[0])


def test_each_gate_is_drawn_for_its_seed_and_position():
    a, _ = _model(GATED, 0)
    again, _ = _model(GATED, 0)
    other, _ = _model(GATED, 1)
    downs = {n: p for n, p in a.named_parameters() if n.endswith("gate_down")}
    assert len(downs) == 5
    for name, p in downs.items():
        assert torch.equal(p, again.get_parameter(name))  # deterministic
        assert not torch.equal(p, other.get_parameter(name))  # another seed, another gate
        assert abs(p.std().item() * math.sqrt(32) - 1) < 0.3  # N(0, 1/d)
    values = list(downs.values())
    assert all(not torch.equal(values[i], values[j]) for i in range(5) for j in range(i))


def test_the_gate_matrices_decay_like_every_matrix_and_the_gain_as_norm_weight_decay_says():
    model, _ = _model(GATED, 0)
    names = {id(p): n for n, p in model.named_parameters()}
    for which, gains_decay in (("none", False), ("all", True)):
        opt = make_optimizer(model, OptimConfig(norm_weight_decay=which), torch.device("cpu"))
        decayed = {
            names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]
        }
        gates = {n for n in names.values() if ".gate_" in n}
        assert len(gates) == 10 and gates <= decayed
        assert ("final.weight" in decayed) is gains_decay
