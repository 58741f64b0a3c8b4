"""Paired runs: for one seed, LayerNorm and RMSNorm runs share initial weights and batches."""

from __future__ import annotations

import dataclasses

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
