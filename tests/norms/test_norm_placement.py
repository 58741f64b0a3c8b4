"""Where the norms sit: each placement's block is its formula, QK-norm and the embedding norm do
what they say, each option changes the outputs, and bad values stop ``train`` with one line."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from normlab.config import ModelConfig, NormConfig, NormImpl, NormKind, Placement, QKNorm
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.training.diagnostics import named_norms
from normlab.training.loop import train

from ..conftest import run_cli

D, V, T = 32, 64, 16


def gpt(seed=0, n_layer=2, kind=NormKind.layer, **norm) -> GPT:
    cfg = ModelConfig(
        name="t", n_layer=n_layer, n_head=4, d_model=D, context_length=T, vocab_size=V
    )
    torch.manual_seed(seed)
    return GPT(cfg, resolve_norm(NormConfig(kind=kind, impl=NormImpl.reference, **norm), "cpu"))


def perturbed(model: GPT) -> GPT:
    """Gains and biases away from 1 and 0, so that every norm's parameters matter."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, _, norm in named_norms(model):
            norm.weight.copy_(1 + 0.5 * torch.rand(norm.weight.shape, generator=g))
            if getattr(norm, "bias", None) is not None:
                norm.bias.copy_(0.3 * torch.randn(norm.bias.shape, generator=g))
    return model


@pytest.mark.parametrize("placement", list(Placement))
def test_each_placements_block_computes_its_formula(placement):
    block = perturbed(gpt(placement=placement)).blocks[0]
    x = torch.randn(2, T, D) * 3
    a, m = block.attn, block.mlp
    if placement == Placement.pre:  # GPT-2
        h = x + a(block.attn_in(x))
        want = h + m(block.mlp_in(h))
    elif placement == Placement.post:  # Vaswani et al.
        h = block.attn_out(x + a(x))
        want = block.mlp_out(h + m(h))
    elif placement == Placement.peri:  # Peri-LN
        h = x + block.attn_out(a(block.attn_in(x)))
        want = h + block.mlp_out(m(block.mlp_in(h)))
    elif placement == Placement.deepnorm:  # DeepNorm: alpha = (2N)^(1/4), N = 2 blocks
        h = block.attn_out(4**0.25 * x + a(x))
        want = block.mlp_out(4**0.25 * h + m(h))
    elif placement == Placement.hybrid:  # HybridNorm: QKV-norm inside a (test_block_designs)
        h = block.mlp_in(x + a(x))
        want = h + m(h)
    else:  # reordered (OLMo-2)
        h = x + block.attn_out(a(x))
        want = h + block.mlp_out(m(h))
    torch.testing.assert_close(block(x), want, rtol=0, atol=0)


def test_every_placement_gives_other_logits_and_those_ending_in_a_stream_norm_lack_a_final():
    idx = torch.randint(0, V, (2, T))
    logits = {p: perturbed(gpt(placement=p))(idx)[0] for p in Placement}
    for p in Placement:
        for q in Placement:
            if p != q:
                assert not torch.allclose(logits[p], logits[q]), (p, q)
    names = {p: [n for n, _, _ in named_norms(gpt(placement=p, n_layer=1))] for p in Placement}
    assert names[Placement.pre] == ["block0/attn_in", "block0/mlp_in", "final/norm"]
    assert names[Placement.post] == ["block0/attn_out", "block0/mlp_out"]
    assert names[Placement.peri] == [
        "block0/attn_in",
        "block0/attn_out",
        "block0/mlp_in",
        "block0/mlp_out",
        "final/norm",
    ]
    assert names[Placement.reordered] == ["block0/attn_out", "block0/mlp_out", "final/norm"]
    assert names[Placement.deepnorm] == ["block0/attn_out", "block0/mlp_out"]
    assert names[Placement.hybrid] == [
        "block0/qk_q",
        "block0/qk_k",
        "block0/qk_v",
        "block0/mlp_in",
        "final/norm",
    ]


@pytest.mark.parametrize("qk", [QKNorm.head, QKNorm.full])
def test_qk_norm_makes_attention_blind_to_the_scale_of_q_and_k(qk):
    """RMSNorm on q and k (no gain change): scaling the q rows of the projection of one head
    (head) or of all heads (full) leaves the output as it was; without QK-norm it changes it."""
    for qk_norm, invariant in ((qk, True), (QKNorm.none, False)):
        model = gpt(kind=NormKind.rms, qk=qk_norm)
        attn = model.blocks[0].attn
        x = torch.randn(2, T, D)
        before = attn(x)
        rows = slice(0, D // 4) if qk == QKNorm.head else slice(0, D)  # head 0's q, or all q
        with torch.no_grad():
            attn.qkv.weight[rows] *= 7.0
            attn.qkv.bias[rows] *= 7.0
        after = attn(x)
        assert torch.allclose(before, after, atol=1e-4) == invariant, (qk_norm, invariant)


def test_qk_norms_normalize_over_head_dim_or_over_d_model():
    head, full = gpt(qk=QKNorm.head).blocks[0].attn, gpt(qk=QKNorm.full).blocks[0].attn
    assert head.q_norm.weight.shape == head.k_norm.weight.shape == (D // 4,)
    assert full.q_norm.weight.shape == full.k_norm.weight.shape == (D,)
    # head: by hand, q of each head normalized on its own before attention
    attn = perturbed(gpt(qk=QKNorm.head, kind=NormKind.rms)).blocks[0].attn
    x = torch.randn(2, T, D)
    q, k, v = attn.qkv(x).split(D, dim=2)
    q, k, v = (t.view(2, T, 4, D // 4).transpose(1, 2) for t in (q, k, v))
    q, k = attn.q_norm(q), attn.k_norm(k)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = attn.proj(y.transpose(1, 2).reshape(2, T, D))
    torch.testing.assert_close(attn(x), want, rtol=0, atol=0)


def test_the_embedding_norm_feeds_the_first_block_a_normalized_stream():
    idx = torch.randint(0, V, (2, T))
    plain, emb = gpt(kind=NormKind.rms), gpt(kind=NormKind.rms, embedding=True)
    seen = []
    emb.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    logits = emb(idx)[0]
    x0 = emb.tok_emb(idx) + emb.pos_emb(torch.arange(T))
    want = x0 * torch.rsqrt(x0.pow(2).mean(-1, keepdim=True) + 1e-5)  # RMSNorm, unit gain
    torch.testing.assert_close(seen[0], want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(logits, plain(idx)[0])
    assert [n for n, _, _ in named_norms(emb)][0] == "embedding/norm"


@pytest.mark.parametrize(
    "override,shown",
    [
        ("norm.placement=middle", ["middle", "pre", "post", "peri", "reordered", "hybrid"]),
        ("norm.qk=heads", ["heads", "none", "head", "full"]),
        ("norm.embedding=maybe", ["maybe"]),
    ],
)
def test_an_unknown_placement_or_qk_value_stops_train_with_one_line(tmp_path, override, shown):
    res = run_cli([override, "device=cpu"], tmp_path, timeout=120)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, err
    assert all(s in err for s in shown), err
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.pt"))


def test_the_startup_line_names_the_norm_design_beside_kind_and_impl(tmp_path, cfg_tiny, caplog):
    """train.log's first line says which design trained: placement, QK-norm, schedule."""
    cfg = cfg_tiny("max_steps=1", "norm=rms", "norm.impl=reference",
                   "norm.placement=peri", "norm.qk=head", "norm.blocks=0:layer")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="normlab"):
        train(cfg, tmp_path)
    line = next(r.getMessage() for r in caplog.records if "parameters, norm" in r.getMessage())
    assert "norm rms/reference (design rms[0:layer]-peri-qkhead) on cpu" in line, line
