"""Paired runs: for one seed, LayerNorm and RMSNorm runs share initial weights and batches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from normlab.compose import to_train_config
from normlab.training.setup import build_run


def setup(compose_cfg, norm: str, seed: int):
    cfg = to_train_config(
        compose_cfg(
            ["experiment=loss_parity_cpu", f"norm={norm}", f"seed={seed}", "norm.impl=torch"]
        )
    )
    run = build_run(dataclasses.replace(cfg, device="cpu"))  # as train builds it, no run dir
    return run.model, run.sampler


def test_layer_and_rms_runs_of_one_seed_see_the_same_first_batch(compose_cfg):
    (_, a), (_, b) = setup(compose_cfg, "layer", 0), setup(compose_cfg, "rms", 0)
    for step in (0, 1, 599):
        assert torch.equal(a.train_batch(step)[0], b.train_batch(step)[0])
    assert torch.equal(a.val_batch(0)[0], b.val_batch(0)[0])


def test_layer_and_rms_runs_of_one_seed_start_from_the_same_attention_and_mlp_weights(compose_cfg):
    (ma, _), (mb, _) = setup(compose_cfg, "layer", 1), setup(compose_cfg, "rms", 1)
    sa, sb = ma.state_dict(), mb.state_dict()
    shared = [k for k in sa if k in sb]
    assert any(".attn." in k for k in shared) and any(".mlp." in k for k in shared)
    for k in shared:
        assert torch.equal(sa[k], sb[k]), k


def test_another_seed_gives_other_weights_and_batches(compose_cfg):
    (ma, a), (mb, b) = setup(compose_cfg, "layer", 0), setup(compose_cfg, "layer", 1)
    assert not torch.equal(ma.blocks[0].attn.qkv.weight, mb.blocks[0].attn.qkv.weight)
    assert not torch.equal(a.train_batch(0)[0], b.train_batch(0)[0])


# --- every axis of where the norms sit keeps runs paired ------------------------------------------


def tiny_setup(compose_cfg, *overrides: str):
    from ..conftest import TINY

    cfg = to_train_config(compose_cfg([*TINY, "norm.impl=torch", "seed=2", *overrides]))
    run = build_run(cfg)
    return run.model, run.sampler


@pytest.mark.parametrize(
    "axis",
    [
        [
            "norm.placement=pre",
            "norm.placement=post",
            "norm.placement=peri",
            "norm.placement=reordered",
        ],
        ["norm.qk=none", "norm.qk=head", "norm.qk=full"],
        ["norm.embedding=false", "norm.embedding=true"],
        [
            "norm.blocks=null",
            "norm.blocks=0:rms",
            "norm.blocks=0-1:rms",
            "norm.positions.final.kind=rms",
        ],
    ],
    ids=["placement", "qk", "embedding", "schedule"],
)
def test_variants_along_each_design_axis_share_initial_weights_and_batches(compose_cfg, axis):
    (m0, s0), *others = [tiny_setup(compose_cfg, o) for o in axis]
    state0 = m0.state_dict()
    for (m, s), override in zip(others, axis[1:], strict=True):
        state = m.state_dict()
        shared = [k for k in state0 if k in state]
        assert sum(".attn.qkv." in k or ".mlp.fc." in k for k in shared) >= 4, override
        for k in shared:
            assert torch.equal(state0[k], state[k]), (override, k)
        for step in (0, 5):
            assert torch.equal(s0.train_batch(step)[0], s.train_batch(step)[0]), override
        assert torch.equal(s0.val_batch(0)[0], s.val_batch(0)[0]), override


# --- init_seed and data_seed: what the seed seeds, set apart ---------------------------------


def test_init_seed_alone_changes_the_initial_weights_and_keeps_the_batch_order(compose_cfg):
    (ma, a), (mb, b) = tiny_setup(compose_cfg), tiny_setup(compose_cfg, "init_seed=7")
    assert not torch.equal(ma.blocks[0].attn.qkv.weight, mb.blocks[0].attn.qkv.weight)
    for step in (0, 5):
        assert torch.equal(a.train_batch(step)[0], b.train_batch(step)[0])


def test_data_seed_alone_changes_the_batch_order_and_keeps_the_initial_weights(compose_cfg):
    (ma, a), (mb, b) = tiny_setup(compose_cfg), tiny_setup(compose_cfg, "data_seed=7")
    assert torch.equal(ma.blocks[0].attn.qkv.weight, mb.blocks[0].attn.qkv.weight)
    assert not torch.equal(a.train_batch(0)[0], b.train_batch(0)[0])
    assert torch.equal(a.val_batch(0)[0], b.val_batch(0)[0])  # validation never moves


def test_null_init_and_data_seeds_are_the_seed_bit_for_bit(compose_cfg):
    (ma, a), (mb, b) = (
        tiny_setup(compose_cfg),
        tiny_setup(compose_cfg, "init_seed=2", "data_seed=2"),
    )
    for k, v in ma.state_dict().items():
        assert torch.equal(v, mb.state_dict()[k]), k
    assert torch.equal(a.train_batch(3)[0], b.train_batch(3)[0])


@pytest.mark.parametrize("key", ["init_seed", "data_seed"])
def test_a_negative_init_or_data_seed_is_refused_naming_the_key(compose_cfg, key):
    from normlab.config import ConfigError

    with pytest.raises(ConfigError, match=rf"{key}.*-1.*>= 0"):
        to_train_config(compose_cfg([f"{key}=-1"]))
