"""Block-placement designs: Mix-LN (``norm.mix_ln``), HybridNorm (``norm.placement=hybrid``) and
DeepNorm (``norm.placement=deepnorm``): each block computes its paper's formula, the final norm
exists iff the last block does not end in a norm of the stream, parameters shared with the other
variants start equal for one seed, names say the design, bad values are one line, and each
trains end to end."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from normlab.config import (
    ConfigError,
    ModelConfig,
    NormConfig,
    NormImpl,
    NormKind,
    Placement,
    to_plain,
)
from normlab.config.schedule import diag_norm_names, norm_tag
from normlab.model import GPT
from normlab.norms import norm_class, resolve_norm
from normlab.training.diagnostics import ActivationRecorder, named_norms
from normlab.training.loop import train

from .test_norm_placement import perturbed

D, V, T, H = 16, 32, 8, 2


def gpt(n_layer=4, seed=0, kind=NormKind.layer, **norm) -> GPT:
    cfg = ModelConfig(
        name="t", n_layer=n_layer, n_head=H, d_model=D, context_length=T, vocab_size=V
    )
    torch.manual_seed(seed)
    norm.setdefault("impl", NormImpl.reference)
    return GPT(cfg, resolve_norm(NormConfig(kind=kind, **norm), "cpu"))


def x_in() -> torch.Tensor:
    return 3 * torch.randn(2, T, D, generator=torch.Generator().manual_seed(2))


# --- Mix-LN ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mix_ln,n_layer,n_post",
    [(0.25, 4, 1), (0.5, 4, 2), (0.3, 10, 3), (0.57, 100, 57), (0.25, 12, 3), (0.9, 4, 3)],
)
def test_mix_ln_makes_the_first_floor_alpha_l_blocks_post_and_the_rest_pre(mix_ln, n_layer, n_post):
    norm = NormConfig(mix_ln=mix_ln)
    want = [Placement.post] * n_post + [Placement.pre] * (n_layer - n_post)
    assert [norm.placement_at(i, n_layer) for i in range(n_layer)] == want
    if n_layer <= 4:
        model = gpt(n_layer=n_layer, mix_ln=mix_ln)
        assert [b.placement for b in model.blocks] == want
        assert not isinstance(model.final, torch.nn.Identity)  # the last block is pre


def test_mix_ln_blocks_compute_post_then_pre_and_depth_scale_only_the_pre_blocks():
    model = perturbed(gpt(mix_ln=0.5, depth_scale=True))
    x = x_in()
    post, pre = model.blocks[1], model.blocks[2]
    h = post.attn_out(x + post.attn(x))
    torch.testing.assert_close(post(x), post.mlp_out(h + post.mlp(h)), rtol=0, atol=0)
    c = 1 / math.sqrt(3)  # block 2 is the third block
    h = x + pre.attn(c * pre.attn_in(x))
    torch.testing.assert_close(pre(x), h + pre.mlp(c * pre.mlp_in(h)), rtol=0, atol=0)
    assert post.attn_in is None and post.depth_scale is None and pre.attn_out is None
    names = [n for n, _, _ in named_norms(model)]
    assert names[:2] == ["block0/attn_out", "block0/mlp_out"] and names[-1] == "final/norm"
    assert "block3/attn_in" in names and "block3/attn_out" not in names


@pytest.mark.parametrize(
    "norm,says",
    [
        ({"mix_ln": 1.0}, "norm.mix_ln=1.0 is not allowed: must be a fraction of the blocks, 0 <"),
        ({"mix_ln": 0}, "norm.mix_ln=0 is not allowed: must be a fraction"),
        ({"mix_ln": True}, "norm.mix_ln=true is not allowed: must be a fraction"),
        ({"mix_ln": "x"}, "norm.mix_ln='x' is not allowed: must be a fraction"),
        (
            {"mix_ln": 0.25, "placement": Placement.peri},
            "norm.mix_ln=0.25 is not allowed: Mix-LN puts post-norm blocks before pre-norm ones, "
            "so it needs norm.placement=pre (got peri)",
        ),
    ],
)
def test_a_bad_mix_ln_is_one_line_naming_it(norm, says):
    with pytest.raises(ConfigError) as e:
        NormConfig(**norm)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_a_mix_ln_that_makes_no_post_block_for_the_depth_is_refused():
    NormConfig(mix_ln=0.5).check(2)
    with pytest.raises(ConfigError) as e:
        NormConfig(mix_ln=0.25).check(2)
    assert str(e.value) == (
        "norm.mix_ln=0.25 is not allowed: floor(0.25 x model.n_layer=2) = 0 post-norm blocks; "
        "use at least 0.5 with 2 blocks (or null for pre-norm)"
    )


def test_mix_ln_position_overrides_reach_the_post_blocks_norms():
    model = gpt(mix_ln=0.5, positions={"attn_out": {"kind": "rms"}})
    rms, layer = (norm_class(k, NormImpl.reference) for k in (NormKind.rms, NormKind.layer))
    assert type(model.blocks[0].attn_out) is rms and type(model.blocks[0].mlp_out) is layer
    assert type(model.blocks[3].attn_in) is layer


# --- HybridNorm -----------------------------------------------------------------------------------


def test_hybrid_block_normalizes_q_k_and_v_per_head_and_the_stream_before_the_mlp():
    """HybridNorm as its authors' code (dense_model/olmo/model.py) computes it: use_query_norm,
    use_key_norm, use_value_norm over head_dim; ffn_norm with ffn_residual_after_norm."""
    block = perturbed(gpt(placement=Placement.hybrid, kind=NormKind.rms)).blocks[0]
    a, x = block.attn, x_in()
    q, k, v = a.qkv(x).split(D, dim=2)
    q, k, v = (t.view(2, T, H, D // H).transpose(1, 2) for t in (q, k, v))
    q, k, v = a.q_norm(q), a.k_norm(k), a.v_norm(v)  # each over head_dim, per head
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    z = block.mlp_in(x + a.proj(y.transpose(1, 2).reshape(2, T, D)))
    torch.testing.assert_close(block(x), z + block.mlp(z), rtol=0, atol=0)
    assert a.v_norm.weight.shape == (D // H,)
    assert block.attn_in is block.attn_out is block.mlp_out is None


def test_hybrid_keeps_the_final_norm_and_names_its_value_norm():
    model = gpt(n_layer=1, placement=Placement.hybrid)
    names = [n for n, _, _ in named_norms(model)]
    assert names == ["block0/qk_q", "block0/qk_k", "block0/qk_v", "block0/mlp_in", "final/norm"]
    assert "block0/qk_v" in diag_norm_names(1)
    rec = ActivationRecorder()
    with rec.hooks(model):
        model(torch.randint(0, V, (2, T)))
    assert "diag/block0/qk_v_out_rms" in rec.stats


def test_hybrid_qk_position_override_covers_the_value_norm_too():
    model = gpt(placement=Placement.hybrid, positions={"qk": {"kind": "rms"}})
    rms = norm_class(NormKind.rms, NormImpl.reference)
    a = model.blocks[2].attn
    assert type(a.q_norm) is type(a.k_norm) is type(a.v_norm) is rms
    layer = norm_class(NormKind.layer, NormImpl.reference)
    assert type(model.blocks[2].mlp_in) is layer


def test_hybrid_refuses_a_qk_norm_of_its_own_and_depth_scale():
    with pytest.raises(ConfigError) as e:
        NormConfig(placement=Placement.hybrid, qk="head")
    assert str(e.value) == (
        "norm.qk='head' is not allowed: norm.placement=hybrid normalizes q, k and v itself "
        "(per head); use norm.qk=none"
    )
    with pytest.raises(ConfigError) as e:
        NormConfig(placement=Placement.hybrid, depth_scale=True)
    assert str(e.value) == (
        "norm.depth_scale=true is not allowed: norm.placement=hybrid's mlp_in norm carries the "
        "residual stream, so scaling it would scale the stream (use pre or peri)"
    )


def test_auto_honours_an_option_asked_for_the_hybrid_qkv_norms_only():
    plain = resolve_norm(NormConfig(kind=NormKind.rms, placement=Placement.hybrid), "cpu")
    zc = NormConfig(
        kind=NormKind.rms, placement="hybrid", positions={"qk": {"zero_centered": True}}
    )
    assert plain.impl == NormImpl.cpp and resolve_norm(zc, "cpu").impl == NormImpl.compiled


# --- DeepNorm -------------------------------------------------------------------------------------


def test_deepnorm_block_scales_the_stream_by_alpha_before_each_post_norm():
    model = perturbed(gpt(n_layer=3, placement=Placement.deepnorm))
    alpha = (2 * 3) ** 0.25
    block, x = model.blocks[1], x_in()
    h = block.attn_out(alpha * x + block.attn(x))
    torch.testing.assert_close(block(x), block.mlp_out(alpha * h + block.mlp(h)), rtol=0, atol=0)
    assert block.alpha == pytest.approx(alpha) and isinstance(model.final, torch.nn.Identity)


def test_deepnorm_starts_from_post_norms_weights_times_beta_on_v_proj_and_mlp_only():
    """Paired with post-norm: same seed, same RNG use; v rows of qkv, the attention output and
    both MLP weights are post's times beta = (8N)^(-1/4), every other parameter is post's."""
    n_layer = 3
    beta = (8 * n_layer) ** -0.25
    post = gpt(n_layer=n_layer, seed=5, placement=Placement.post)
    after_post = torch.rand(3)
    deep = gpt(n_layer=n_layer, seed=5, placement=Placement.deepnorm)
    after_deep = torch.rand(3)
    assert torch.equal(after_post, after_deep)  # the init drew no extra random numbers
    sp, sd = post.state_dict(), deep.state_dict()
    assert sp.keys() == sd.keys()
    scaled = (".attn.proj.weight", ".mlp.fc.weight", ".mlp.proj.weight")
    for key, p in sp.items():
        d = sd[key]
        if key.endswith(".attn.qkv.weight"):
            assert torch.equal(d[: 2 * D], p[: 2 * D]), key  # q and k rows: unscaled
            torch.testing.assert_close(d[2 * D :] / beta, p[2 * D :], rtol=1e-6, atol=0)
            assert not torch.equal(d[2 * D :], p[2 * D :]), key
        elif key.endswith(scaled):
            torch.testing.assert_close(d / beta, p, rtol=1e-6, atol=0)
            assert not torch.equal(d, p), key
        else:
            assert torch.equal(d, p), key


# --- every design: paired with pre-norm, named, trained ------------------------------------------


@pytest.mark.parametrize(
    "design",
    [{"mix_ln": 0.5}, {"placement": Placement.hybrid}, {"placement": Placement.post}],
    ids=["mix_ln", "hybrid", "post"],
)
def test_designs_share_every_linear_and_embedding_weight_with_pre_norm_for_one_seed(design):
    pre, other = gpt(seed=3), gpt(seed=3, **design)
    sp, so = pre.state_dict(), other.state_dict()
    shared = [k for k in sp if k in so]
    assert sum(".attn.qkv." in k or ".mlp.fc." in k for k in shared) >= 8
    for k in shared:
        if "_norm." not in k and ".attn_" not in k and ".mlp_" not in k and "final" not in k:
            assert torch.equal(sp[k], so[k]), (design, k)


def test_the_design_tag_names_each_design():
    assert norm_tag({"kind": "layer", "placement": "deepnorm"}) == "layer-deepnorm"
    assert norm_tag({"kind": "rms", "placement": "hybrid"}) == "rms-hybrid"
    assert norm_tag({"kind": "rms", "placement": "pre", "mix_ln": 0.25}) == "rms-mixln0.25"
    assert norm_tag(to_plain(NormConfig(kind=NormKind.rms, mix_ln=0.5)), impl=True) == (
        "rms-auto-mixln0.5"
    )


@pytest.mark.slow  # three short trainings
@pytest.mark.parametrize(
    "design,tag",
    [
        ("norm.mix_ln=0.5", "rms-mixln0.5"),
        ("norm.placement=hybrid", "rms-hybrid"),
        ("norm.placement=deepnorm", "rms-deepnorm"),
    ],
)
def test_each_design_trains_end_to_end_with_auto(
    cfg_tiny, tmp_path, one_thread, caplog, design, tag
):
    cfg = cfg_tiny("max_steps=2", "norm=rms", design)
    with caplog.at_level(logging.INFO, logger="normlab"):
        summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])
    line = next(r.getMessage() for r in caplog.records if "parameters, norm" in r.getMessage())
    assert f"norm rms/cpp (design {tag}) on cpu" in line, line
