"""optim.norm_weight_decay: which parameters AdamW decays, its refusal, and pairing kept."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from normlab.config import ConfigError, NormWeightDecay, OptimConfig
from normlab.norms import resolve_norm
from normlab.training.setup import build_model, decayed_gains, make_optimizer

from ..conftest import TINY, run_cli

PERI_QK = ("norm=rms", "norm.placement=peri", "norm.qk=head", "norm.embedding=true")


def _model(cfg_tiny, *overrides):
    cfg = cfg_tiny(*PERI_QK, *overrides)
    cfg = dataclasses.replace(
        cfg,
        norm=resolve_norm(cfg.norm, "cpu"),
        model=dataclasses.replace(cfg.model, vocab_size=256),
    )
    return cfg, build_model(cfg, "cpu")


def _decayed_names(model, optim: OptimConfig) -> set[str]:
    groups = make_optimizer(model, optim, torch.device("cpu")).param_groups
    ids = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize(
    "which, gains",
    [
        ("none", set()),
        (
            "all",
            {
                "embedding.weight",
                *(
                    f"blocks.{i}.{m}.weight"
                    for i in (0, 1)
                    for m in (
                        "attn_in",
                        "attn_out",
                        "mlp_in",
                        "mlp_out",
                        "attn.q_norm",
                        "attn.k_norm",
                    )
                ),
                "final.weight",
            },
        ),
        ("input_only", {f"blocks.{i}.{m}.weight" for i in (0, 1) for m in ("attn_in", "mlp_in")}),
    ],
)
def test_the_decayed_group_holds_the_matrices_and_the_chosen_norm_gains(cfg_tiny, which, gains):
    cfg, model = _model(cfg_tiny, f"optim.norm_weight_decay={which}")
    assert cfg.optim.norm_weight_decay == NormWeightDecay[which]
    matrices = {n for n, p in model.named_parameters() if p.dim() >= 2}
    assert matrices and "blocks.0.attn.qkv.weight" in matrices
    assert _decayed_names(model, cfg.optim) == matrices | gains
    # every 1-D parameter not named as a gain stays undecayed: biases above all
    groups = make_optimizer(model, cfg.optim, torch.device("cpu")).param_groups
    assert [g["weight_decay"] for g in groups] == [cfg.optim.weight_decay, 0.0]
    n_params = sum(len(g["params"]) for g in groups)
    assert n_params == len(list(model.parameters()))  # each parameter in exactly one group


def test_the_default_keeps_the_groups_of_before_the_key(cfg_tiny):
    cfg, model = _model(cfg_tiny)
    assert cfg.optim.norm_weight_decay == NormWeightDecay.none
    groups = make_optimizer(model, cfg.optim, torch.device("cpu")).param_groups
    before = [p for p in model.parameters() if p.dim() >= 2]  # the rule before the key
    assert [id(p) for p in groups[0]["params"]] == [id(p) for p in before]
    assert decayed_gains(model, NormWeightDecay.none) == []


def test_a_norm_without_a_gain_gives_no_gain_to_decay(cfg_tiny):
    _, model = _model(cfg_tiny, "norm.affine=false", "norm.bias=false")
    assert decayed_gains(model, NormWeightDecay.all) == []


def test_a_bad_value_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^optim\.norm_weight_decay='gains' is not allowed: "):
        OptimConfig(norm_weight_decay="gains")
    r = run_cli([*TINY, "optim.norm_weight_decay=gains"], cwd=tmp_path)
    assert r.returncode == 2 and not list(tmp_path.rglob("metrics.jsonl")), "nothing trained"
    assert r.stderr.count("\n") == 1 and "optim.norm_weight_decay=gains" in r.stderr
    assert "none" in r.stderr and "all" in r.stderr and "input_only" in r.stderr


@pytest.mark.parametrize("placement", ["post", "reordered"])
def test_input_only_is_refused_where_the_placement_has_no_input_norms(cfg_tiny, placement):
    with pytest.raises(ConfigError, match=f"norm.placement={placement} has no input norms"):
        cfg_tiny("optim.norm_weight_decay=input_only", f"norm.placement={placement}")


def test_the_same_seed_starts_from_the_same_weights_whatever_decays(cfg_tiny):
    states = [
        _model(cfg_tiny, f"optim.norm_weight_decay={w}")[1].state_dict()
        for w in ("none", "all", "input_only")
    ]
    for other in states[1:]:
        assert other.keys() == states[0].keys()
        assert all(torch.equal(other[k], states[0][k]) for k in states[0])


def test_decayed_gains_shrink_and_undecayed_ones_do_not(cfg_tiny):
    """One AdamW step with zero gradients: only decoupled decay moves a parameter."""
    cfg, model = _model(cfg_tiny, "optim.norm_weight_decay=input_only")
    opt = make_optimizer(model, cfg.optim, torch.device("cpu"))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    shrink = 1 - cfg.optim.lr * cfg.optim.weight_decay  # lr of the group: optim.lr, no schedule
    assert torch.allclose(model.blocks[0].attn_in.weight, torch.full((128,), shrink))
    assert torch.equal(model.blocks[0].attn_out.weight, torch.ones(128))
    assert torch.equal(model.final.weight, torch.ones(128))
