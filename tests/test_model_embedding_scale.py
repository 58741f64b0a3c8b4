"""``model.embedding_scale`` (DyT's LLM recipe): a learnable scalar on the embedding, off by
default, initialised at sqrt(d_model) or a given number, drawing no random number."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.config import ConfigError, ModelConfig, NormConfig, NormImpl, NormKind, OptimConfig
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.training.setup import make_optimizer


def model(scale, seed=0, kind=NormKind.dyt):
    cfg = ModelConfig(
        name="t", n_layer=2, n_head=2, d_model=32, context_length=16, embedding_scale=scale
    )
    cfg.vocab_size = 64
    torch.manual_seed(seed)
    return GPT(cfg, resolve_norm(NormConfig(kind=kind, impl=NormImpl.reference), "cpu"))


def test_off_by_default_with_no_parameter():
    assert ModelConfig().embedding_scale is False
    assert ModelConfig().resolved_embedding_scale is None
    m = model(False)
    assert m.emb_scale is None and not any("emb_scale" in k for k in m.state_dict())


@pytest.mark.parametrize(("scale", "init"), [(True, math.sqrt(32)), (2.5, 2.5), (3, 3.0)])
def test_the_scalar_starts_at_sqrt_d_model_or_the_number_given(scale, init):
    m = model(scale)
    assert m.emb_scale.shape == (1,) and m.emb_scale.item() == pytest.approx(init)
    assert m.emb_scale.requires_grad


def test_it_multiplies_the_embedding_and_pairs_every_other_parameter():
    """Scale 1 is the model without the scalar bit for bit (same draws, same logits); scale 2
    doubles the stream the first norm sees, so the logits change."""
    plain, one, two = model(False), model(1.0), model(2.0)
    sp, so = plain.state_dict(), one.state_dict()
    assert set(so) - set(sp) == {"emb_scale"}
    assert all(torch.equal(sp[k], so[k]) for k in sp)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain(idx)[0], one(idx)[0])
    assert not torch.allclose(plain(idx)[0], two(idx)[0])
    x = plain.tok_emb(idx) + plain.pos_emb(torch.arange(16))
    seen = {}
    two.blocks[0].attn_in.register_forward_hook(lambda m, a, out: seen.setdefault("x", a[0]))
    two(idx)
    torch.testing.assert_close(seen["x"], 2.0 * x)


def test_the_scalar_gets_no_weight_decay():
    m = model(True)
    opt = make_optimizer(m, OptimConfig(), torch.device("cpu"))
    (group,) = [g for g in opt.param_groups if any(p is m.emb_scale for p in g["params"])]
    assert group["weight_decay"] == 0.0


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "big"])
def test_a_bad_value_is_one_config_error_line(bad):
    with pytest.raises(ConfigError) as err:
        ModelConfig(embedding_scale=bad)
    line = str(err.value)
    assert line.startswith("model.embedding_scale=") and "is not allowed: false (none)" in line
    assert "\n" not in line
