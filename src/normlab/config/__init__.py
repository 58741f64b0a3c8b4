"""Typed configuration: one dataclass per Hydra config group, validated on construction.

The YAML files under ``conf/`` only compose values; the schema and every range check live here.
Closed choices are Enums whose member *names* are the strings users type (``norm.kind=rms``),
because OmegaConf validates enum values by member name.

No torch import here: the config can be checked before anything heavy is loaded.

Modules: ``base`` (ConfigError, the range check), ``norm``, ``data``, ``run`` (model, precision,
optim, logger, TrainConfig, RunOptions, CliConfig). Import from ``normlab.config``.
"""

from __future__ import annotations

from normlab.config.base import DEFAULT_EPS, ConfigError, to_plain
from normlab.config.data import DataConfig, DataFormat, Tokenizer
from normlab.config.norm import (
    DEFAULT_ALPHA_INIT,
    IMPLS_WITH_UPCAST_FALSE,
    KINDS_WITH_ALPHA,
    KINDS_WITH_BIAS,
    KINDS_WITHOUT_EPS,
    NormCast,
    NormConfig,
    NormImpl,
    NormKind,
    NormOverride,
    NormPositions,
    Placement,
    QKNorm,
)
from normlab.config.run import (
    CliConfig,
    LoggerConfig,
    LoggerKind,
    ModelConfig,
    OptimConfig,
    OptimName,
    Precision,
    PrecisionConfig,
    RunOptions,
    TrainConfig,
    WandbMode,
)

__all__ = [
    "DEFAULT_EPS",
    "ConfigError",
    "to_plain",
    "NormKind",
    "NormImpl",
    "KINDS_WITH_BIAS",
    "IMPLS_WITH_UPCAST_FALSE",
    "KINDS_WITHOUT_EPS",
    "KINDS_WITH_ALPHA",
    "DEFAULT_ALPHA_INIT",
    "NormCast",
    "Placement",
    "QKNorm",
    "NormOverride",
    "NormPositions",
    "NormConfig",
    "Tokenizer",
    "DataFormat",
    "DataConfig",
    "Precision",
    "OptimName",
    "LoggerKind",
    "WandbMode",
    "ModelConfig",
    "PrecisionConfig",
    "OptimConfig",
    "LoggerConfig",
    "TrainConfig",
    "RunOptions",
    "CliConfig",
]
