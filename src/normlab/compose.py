"""The one Hydra composition: ``conf/train.yaml`` plus overrides -> a validated config.

Every tool (``train``, ``normlab-prepare``, ``normlab-bench``, the studies) and the tests compose
through ``compose``; no other module outside ``commands/`` imports Hydra. The schema is
``normlab.config.CliConfig``; every range check runs in its ``__post_init__``.

Why: docs/running.md
"""

from __future__ import annotations

from enum import Enum

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from normlab.config import CliConfig, ConfigError, TrainConfig, to_plain
from normlab.config.base import find_conf_dir
from normlab.config.schedule import norm_tag


def register_schema() -> None:
    """Register ``CliConfig`` as ``train_schema`` (every group type-checked on merge) and the
    resolvers ``${name:${norm.kind}}`` (``rms``, not ``NormKind.rms``) and ``${norm_tag:${norm}}``
    (``schedule.norm_tag`` for a directory name, e.g. ``layer[0-1:rms+3:dyt]-cpp-peri-qkhead``)."""
    ConfigStore.instance().store(name="train_schema", node=CliConfig)
    if not OmegaConf.has_resolver("name"):
        OmegaConf.register_new_resolver("name", lambda v: v.name if isinstance(v, Enum) else v)
    if not OmegaConf.has_resolver("norm_tag"):
        OmegaConf.register_new_resolver(  # ``device`` is read by ``train``'s own (it resolves auto)
            "norm_tag",
            lambda n, device=None: norm_tag(
                to_plain(OmegaConf.to_container(n)), impl=True, path_safe=True
            ),
        )


def validate(cfg: DictConfig) -> CliConfig:
    """A composed DictConfig as a validated ``CliConfig`` (every ``__post_init__`` check);
    ConfigError: one line naming the bad key and value."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CliConfig), plain))
    except ConfigError:
        raise
    except Exception as e:  # OmegaConf wraps errors raised inside a dataclass constructor
        cause = e.__cause__ or e.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(str(e).splitlines()[0]) from None


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """A composed config as a validated ``TrainConfig`` (the hashed part); ConfigError."""
    return validate(cfg).train_config()


def compose_dict(overrides: list[str]) -> DictConfig:
    """``conf/train.yaml`` composed with ``overrides`` (Hydra's grammar), not yet validated."""
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(find_conf_dir()), version_base="1.3"):
            return hydra_compose("train", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def compose_cli(overrides: list[str]) -> CliConfig:
    """``compose_dict`` validated as the full ``CliConfig`` (invocation keys included)."""
    return validate(compose_dict(overrides))


def compose(overrides: list[str]) -> TrainConfig:
    """``train.yaml`` + ``overrides`` validated as ``train`` does; ConfigError, HydraException."""
    return compose_cli(overrides).train_config()
