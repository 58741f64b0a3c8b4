"""The GPT: shapes, init, placement, and that every norm comes from the one factory."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.config import ModelConfig, NormConfig, NormImpl, NormKind, Placement
from normlab.model import GPT
from normlab.norms import norm_class, resolve_norm


def tiny_model(
    kind=NormKind.layer, placement=Placement.pre, impl=NormImpl.torch, seed=0, n_layer=2
):
    cfg = ModelConfig(
        name="t", n_layer=n_layer, n_head=2, d_model=32, context_length=16, vocab_size=64
    )
    norm = resolve_norm(NormConfig(kind=kind, impl=impl, placement=placement), "cpu")
    torch.manual_seed(seed)
    return GPT(cfg, norm)


def test_logits_have_shape_batch_time_vocab_and_loss_starts_near_log_vocab():
    model = tiny_model()
    idx, targets = torch.randint(0, 64, (3, 16)), torch.randint(0, 64, (3, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, 64)
    assert loss.ndim == 0 and abs(loss.item() - math.log(64)) < 0.3


def test_sequence_longer_than_context_is_refused():
    with pytest.raises(ValueError, match="context_length=16"):
        tiny_model()(torch.zeros(1, 17, dtype=torch.long))


def test_every_norm_in_the_model_is_built_by_the_factory_for_the_chosen_variant():
    for kind in NormKind:
        model = tiny_model(kind=kind, impl=NormImpl.reference)
        cls = norm_class(kind, NormImpl.reference)
        norms = [m for m in model.modules() if isinstance(m, cls)]
        assert len(norms) == 2 * 2 + 1  # two per block and the final norm
        assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())


def test_placement_changes_the_computation_and_post_norm_drops_only_the_final_norm():
    pre, post = tiny_model(placement=Placement.pre), tiny_model(placement=Placement.post)
    idx = torch.randint(0, 64, (2, 16))
    assert not torch.allclose(pre(idx)[0], post(idx)[0])
    # post: attn_out/mlp_out instead of attn_in/mlp_in, and no final norm (weight + bias)
    d = pre.cfg.d_model
    assert pre.num_params() - post.num_params() == 2 * d
    assert isinstance(post.final, torch.nn.Identity) and not isinstance(
        pre.final, torch.nn.Identity
    )
    rename = {"attn_in": "attn_out", "mlp_in": "mlp_out"}
    pre_keys = {
        ".".join(rename.get(p, p) for p in k.split("."))
        for k in pre.state_dict()
        if "final" not in k
    }
    assert pre_keys == set(post.state_dict())


def test_post_norm_block_output_is_normalized_and_pre_norm_is_not():
    for placement, normalized in ((Placement.post, True), (Placement.pre, False)):
        model = tiny_model(kind=NormKind.rms, placement=placement)
        x = torch.randn(2, 16, 32) * 5
        rms = model.blocks[0](x).pow(2).mean(-1).sqrt()
        assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3) == normalized


def test_gpt2_init_std_and_scaled_residual_projections():
    torch.manual_seed(0)
    big = GPT(
        ModelConfig(name="b", n_layer=8, n_head=4, d_model=256, context_length=16, vocab_size=512),
        resolve_norm(NormConfig(), "cpu"),
    )
    assert abs(big.blocks[0].attn.qkv.weight.std().item() - 0.02) < 0.002
    assert abs(big.blocks[0].mlp.proj.weight.std().item() - 0.02 / math.sqrt(2 * 8)) < 0.001
    assert abs(big.blocks[0].attn.proj.weight.std().item() - 0.02 / math.sqrt(2 * 8)) < 0.001
    assert big.head.weight is big.tok_emb.weight  # tied head
    assert torch.all(big.blocks[0].attn_in.weight == 1) and torch.all(
        big.blocks[0].attn_in.bias == 0
    )


def test_layernorm_and_rmsnorm_models_start_from_the_same_shared_weights_for_one_seed():
    a, b = tiny_model(kind=NormKind.layer, seed=3), tiny_model(kind=NormKind.rms, seed=3)
    shared = {k: v for k, v in b.state_dict().items()}
    for name, tensor in a.state_dict().items():
        if name in shared:
            assert torch.equal(tensor, shared[name]), name
    assert any(k.endswith("attn_in.bias") for k in a.state_dict()) and not any(
        k.endswith("attn_in.bias") for k in shared
    )


def test_flops_per_token_follow_6n_plus_attention_term():
    model = tiny_model()
    c = model.cfg
    assert (
        model.flops_per_token()
        == 6 * model.num_params() + 12 * c.n_layer * c.d_model * c.context_length
    )


def test_an_untied_head_is_a_parameter_of_its_own_drawn_at_the_same_std_and_counted():
    cfg = dict(name="t", n_layer=2, n_head=2, d_model=32, context_length=16, vocab_size=64)
    norm = resolve_norm(NormConfig(), "cpu")
    torch.manual_seed(5)
    tied = GPT(ModelConfig(**cfg), norm)
    torch.manual_seed(5)
    untied = GPT(ModelConfig(**cfg, tie_head=False), norm)
    assert untied.head.weight is not untied.tok_emb.weight
    assert not torch.equal(untied.head.weight, untied.tok_emb.weight)
    assert untied.num_params() == tied.num_params() + 64 * 32
    # the same draws in the same order: the head's draw is the tied weight's last draw
    assert torch.equal(untied.head.weight, tied.head.weight)
    assert torch.equal(untied.blocks[1].mlp.fc.weight, tied.blocks[1].mlp.fc.weight)
    idx = torch.randint(0, 64, (2, 8))
    loss = untied(idx, idx)[1]
    loss.backward()
    assert untied.head.weight.grad is not None and untied.tok_emb.weight.grad is not None
