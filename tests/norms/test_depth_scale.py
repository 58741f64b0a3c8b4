"""``norm.depth_scale``: LayerNorm Scaling (Sun et al. 2025, arXiv:2502.05795), the output of each
input norm of block l (1-based) scaled by 1/sqrt(l), any kind; refused where a block has no input
norm."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.config import ConfigError, ModelConfig, NormConfig, NormImpl, NormKind, Placement
from normlab.config.schedule import norm_tag
from normlab.model import GPT
from normlab.norms import resolve_norm


def gpt(**norm) -> GPT:
    cfg = ModelConfig(name="t", n_layer=3, n_head=2, d_model=16, context_length=8, vocab_size=32)
    torch.manual_seed(0)
    return GPT(cfg, resolve_norm(NormConfig(impl=NormImpl.reference, **norm), "cpu"))


@pytest.mark.parametrize("kind", [NormKind.layer, NormKind.rms, NormKind.dyt], ids=str)
@pytest.mark.parametrize("placement", [Placement.pre, Placement.peri], ids=str)
def test_each_input_norm_of_block_l_is_scaled_by_one_over_sqrt_l(kind, placement):
    model = gpt(kind=kind, placement=placement, depth_scale=True)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    for i, block in enumerate(model.blocks):
        c = 1 / math.sqrt(i + 1)
        a = block.attn(c * block.attn_in(x))
        h = x + (a if placement == Placement.pre else block.attn_out(a))
        m = block.mlp(c * block.mlp_in(h))
        want = h + (m if placement == Placement.pre else block.mlp_out(m))
        torch.testing.assert_close(block(x), want, rtol=0, atol=0)
        assert block.depth_scale == c


def test_without_depth_scale_the_model_is_unchanged_and_the_scale_changes_the_loss():
    idx = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    plain, scaled = gpt(), gpt(depth_scale=True)
    assert all(b.depth_scale is None for b in plain.blocks)
    sd = scaled.state_dict()
    assert all(torch.equal(v, sd[k]) for k, v in plain.state_dict().items())  # same weights
    assert not torch.equal(plain(idx, idx)[1], scaled(idx, idx)[1])


@pytest.mark.parametrize("placement", [Placement.post, Placement.reordered], ids=str)
def test_depth_scale_without_input_norms_is_refused_in_one_line(placement):
    with pytest.raises(ConfigError) as err:
        NormConfig(placement=placement, depth_scale=True)
    assert str(err.value) == (
        "norm.depth_scale=true is not allowed: it scales the input norms (attn_in, mlp_in), and "
        f"norm.placement={placement.name} has none (use pre or peri)"
    )


def test_the_design_tag_names_it():
    assert norm_tag({"kind": "rms", "placement": "pre", "depth_scale": True}) == "rms-pre-ds"
    assert norm_tag({"kind": "rms", "placement": "pre", "depth_scale": False}) == "rms-pre"
