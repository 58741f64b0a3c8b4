"""The ``train`` console script: the only module that sees Hydra or a DictConfig.

Composes ``conf/train.yaml`` with the user's overrides, validates it into a typed
:class:`~normlab.config.TrainConfig`, and calls :func:`normlab.train.train`. A user error (a value
out of range, a missing data file, a precision the device cannot run) prints one line on stderr
and exits with status 2 before any training; ``debug=true`` shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .config import ConfigError, TrainConfig

log = logging.getLogger("normlab")


def find_conf_dir() -> Path:
    """Where ``train.yaml`` and its groups live.

    In order: ``$NORMLAB_CONF_DIR``; ``normlab/conf`` inside the installed package (a wheel ships
    the repository's ``conf/`` there); the repository's top-level ``conf/`` (editable install or a
    source checkout). Raises FileNotFoundError naming the places searched.
    """
    here = Path(__file__).resolve().parent
    candidates = [Path(p) for p in [os.environ.get("NORMLAB_CONF_DIR")] if p]
    candidates += [here / "conf", here.parent.parent / "conf"]
    for c in candidates:
        if (c / "train.yaml").is_file():
            return c
    raise FileNotFoundError(f"normlab cannot find conf/train.yaml; searched: {', '.join(map(str, candidates))}")


def register_schema() -> None:
    """Register :class:`TrainConfig` as ``train_schema`` so every group is type-checked on merge."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Validate a composed config into a :class:`TrainConfig` (runs every ``__post_init__`` check).

    Raises:
        ConfigError: one line naming the bad key and value.
    """
    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), plain))
    except ConfigError:
        raise
    except Exception as e:  # OmegaConf wraps errors raised inside a dataclass constructor
        cause = e.__cause__ or e.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(str(e).splitlines()[0]) from None


def _task(cfg: DictConfig) -> float | None:
    from .data import DataError  # deferred: keeps `train --help` fast
    from .train import train

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    debug = bool(cfg.get("debug", False))
    try:
        summary = train(to_train_config(cfg), run_dir)
    except (ConfigError, DataError) as e:
        if debug:
            raise
        print(f"normlab: error: {e}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # the basic launcher records the failure, runs the other jobs, then exits 1
        sys.exit(2)
    if summary["status"] != "completed":
        print(f"normlab: run {summary['status']} at step {summary['steps_completed']} ({run_dir})", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise RuntimeError(f"run {summary['status']}: {run_dir}")
        sys.exit(1)
    return summary["final_val_loss"]


def main() -> None:
    """Entry point of the ``train`` console script (Hydra parses ``sys.argv``)."""
    register_schema()
    hydra.main(version_base="1.3", config_path=str(find_conf_dir()), config_name="train")(_task)()


if __name__ == "__main__":
    main()
