"""Typed configuration: one dataclass per Hydra config group, validated on construction.

The YAML files under ``conf/`` only compose values; the schema and every range check live here.
Closed choices are Enums whose member names are what users type (``norm.kind=rms``): OmegaConf
validates enum values by member name. No torch import. Modules: ``base``, ``norm_table`` (every
fact about the norm kinds and implementations), ``norm``, ``schedule``, ``data``, ``files``,
``run`` (model, precision, optim, logger, TrainConfig, RunOptions, CliConfig).

Why: docs/ARCHITECTURE.md
"""

from __future__ import annotations

from normlab.config.base import DEFAULT_EPS, ConfigError, to_plain
from normlab.config.data import DataConfig, DataFormat, Tokenizer
from normlab.config.norm import NormConfig, NormOverride, NormPositions
from normlab.config.norm_table import (
    DEFAULT_ALPHA_INIT,
    NormCast,
    NormImpl,
    NormKind,
    Placement,
    QKNorm,
)
from normlab.config.run import (
    CliConfig,
    DecayShape,
    LoggerConfig,
    LoggerKind,
    LrSchedule,
    ModelConfig,
    NormWeightDecay,
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
    "NormWeightDecay",
    "OptimName",
    "LrSchedule",
    "DecayShape",
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
