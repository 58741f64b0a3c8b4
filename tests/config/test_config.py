"""Config composition of every group, the typed schema, and one-line errors for bad values."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from normlab.compose import to_train_config
from normlab.config import (
    DEFAULT_EPS,
    ConfigError,
    NormConfig,
    NormImpl,
    NormKind,
    NormOverride,
    Placement,
    Precision,
    to_plain,
)
from normlab.config.norm_table import WHERE_KEYS

from ..conftest import CONF_DIR

GROUPS = ["model", "norm", "precision", "data", "optim", "logger", "experiment"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _set_by(path) -> dict:
    """The plain values a group file sets (null and ``???`` left out: the schema fills them)."""
    values = OmegaConf.to_container(OmegaConf.load(path))
    return {k: v for k, v in values.items() if v is not None and v != "???"}


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes_into_a_valid_train_config(compose_cfg, group):
    """Each file composes and validates, and every value a group file sets is the typed config's
    (an experiment file sets many groups: composing and validating it is its check)."""
    extra = {"text_files": ["data.path=/tmp"]}
    for option in options(group):
        tc = to_train_config(compose_cfg([f"{group}={option}", *extra.get(option, [])]))
        if group == "experiment":
            continue
        typed = to_plain(getattr(tc, group))
        for key, value in _set_by(CONF_DIR / group / f"{option}.yaml").items():
            assert typed[key] == value, (
                f"{group}={option}: {key} is {typed[key]!r}, file: {value!r}"
            )


def test_defaults_are_gpt2_small_layernorm_fp32_shakespeare_wandb_offline(compose_cfg):
    tc = to_train_config(compose_cfg())
    assert (tc.model.n_layer, tc.model.d_model, tc.model.n_head, tc.model.context_length) == (
        12,
        768,
        12,
        1024,
    )
    assert tc.norm.kind == NormKind.layer and tc.norm.impl == NormImpl.auto
    assert tc.precision.dtype == Precision.fp32
    assert (
        tc.data.name == "shakespeare"
        and tc.logger.kind.name == "wandb"
        and tc.logger.mode.name == "offline"
    )


def test_overrides_reach_the_typed_config(compose_cfg):
    tc = to_train_config(
        compose_cfg(["norm=rms", "precision=bf16", "norm.eps=1e-6", "norm.placement=post"])
    )
    assert tc.norm.kind == NormKind.rms and tc.norm.bias is False
    assert tc.norm.eps == 1e-6 and tc.norm.placement == Placement.post
    assert tc.precision.dtype == Precision.bf16


def test_every_norm_file_shares_the_one_eps_default(compose_cfg):
    for option in options("norm"):
        tc = to_train_config(compose_cfg([f"norm={option}"]))
        assert tc.norm.eps is None and tc.norm.resolved_eps == DEFAULT_EPS


def test_norm_fused_is_gone_and_norm_rms_is_its_replacement(compose_cfg):
    """``norm=fused`` was RMSNorm with ``impl: auto``, the same as ``norm=rms``: it is no option."""
    assert "fused" not in options("norm")
    tc = to_train_config(compose_cfg(["norm=rms"]))
    assert tc.norm.kind == NormKind.rms and tc.norm.impl == NormImpl.auto


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("norm.placement=middle", "middle"),
        ("norm.kind=batch", "batch"),
        ("precision.dtype=fp8", "fp8"),
        ("max_steps=ten", "ten"),
    ],
)
def test_values_outside_a_closed_choice_are_rejected_while_composing(
    compose_cfg, override, fragment
):
    with pytest.raises((ValidationError, ConfigCompositionException)) as e:
        compose_cfg([override])
    assert fragment in str(e.value)


def test_unknown_group_option_lists_the_available_choices(compose_cfg):
    with pytest.raises(Exception) as e:
        compose_cfg(["norm=batchnorm"])
    msg = str(e.value)
    assert "batchnorm" in msg and "layer" in msg and "rms" in msg


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["norm.eps=0"], "norm.eps=0"),
        (["norm.eps=-1e-5"], "norm.eps=-1e-05"),
        (["max_steps=0"], "max_steps=0"),
        (["model.d_model=100", "model.n_head=12"], "model.d_model=100"),
        (["norm=rms", "norm.bias=true"], "norm.bias=true"),
        (["norm.upcast=false", "norm.cast=after_weight"], "norm.cast=after_weight"),
        (["optim.lr=0"], "optim.lr=0"),
        (["optim.grad_accum=0"], "optim.grad_accum=0"),
        (["data.val_fraction=0.9"], "data.val_fraction=0.9"),
        (["device=tpu"], "device='tpu'"),
    ],
)
def test_out_of_range_values_raise_one_line_naming_key_and_value(compose_cfg, overrides, key):
    with pytest.raises(ConfigError) as e:
        to_train_config(compose_cfg(overrides))
    msg = str(e.value)
    assert "\n" not in msg
    assert key in msg


def test_resolved_eps_is_the_default_when_null_and_the_value_otherwise():
    assert NormConfig().resolved_eps == DEFAULT_EPS
    assert NormConfig(eps=1e-3).resolved_eps == 1e-3


def test_enum_member_names_are_the_strings_users_type():
    # OmegaConf validates enum values by member *name*: a mismatch would make `norm=rms` unusable.
    for enum in (NormKind, NormImpl, Placement, Precision):
        assert all(m.name == m.value for m in enum)


def test_train_norm_fused_is_refused_in_one_line_naming_its_replacement(tmp_path):
    from ..conftest import run_cli

    r = run_cli(["norm=fused", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=120)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    assert r.stderr.strip().splitlines() == [
        "normlab: error: norm=fused is retired: use norm=rms (the same norm)"
    ]


def test_every_key_of_one_norm_can_be_set_per_position():
    """``NormOverride`` holds every NormConfig key but where the norms sit: a per-norm option
    added to NormConfig alone could not be set per position."""
    per_norm = {f.name for f in fields(NormConfig)} - set(WHERE_KEYS)
    assert {f.name for f in fields(NormOverride)} == per_norm
    cfg = NormConfig(positions={"final": {"kind": "rms", "zero_centered": True, "eps": 1e-3}})
    final = cfg.at("final")
    assert (final.kind, final.zero_centered, final.eps) == (NormKind.rms, True, 1e-3)
    assert cfg.at("attn_in").kind == NormKind.layer
