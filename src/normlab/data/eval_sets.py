"""Held-out corpora (``eval_data``): data configs from ``conf/data/<name>.yaml`` tokenized with the
training run's tokenizer, prepared and cached like the training data.

``eval_data_configs`` makes each named file a ``DataConfig`` whose corpus is the file's and whose
``FROM_TRAINING`` keys (and a null ``cache_dir``) are the training run's; ``prepare_eval`` prepares
one. Byte and gpt2 tokens share the folder the corpus gets as a training corpus; with ``bpe`` the
training corpus's ``tokenizer.json`` encodes it, in ``<train token folder>/eval/<name>-<fp>/``.
No torch here: ``train`` checks ``eval_data`` before torch is imported.

Why: docs/data.md
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import yaml

from normlab.config import ConfigError, DataConfig, Tokenizer
from normlab.config.base import find_conf_dir
from normlab.data import tokenizer as tt
from normlab.data.corpus import DataError
from normlab.data.sources import source_files

#: What a held-out corpus takes from the training run's data config.
FROM_TRAINING = ("tokenizer", "bpe_vocab_size", "bpe_train_chars", "batch_size", "num_proc")


def data_config_names(conf_dir: Path) -> list[str]:
    """The data configs ``eval_data`` may name: the stems of ``conf_dir/data/*.yaml``, sorted."""
    return sorted(p.stem for p in (Path(conf_dir) / "data").glob("*.yaml"))


def _read(name: str, conf_dir: Path) -> dict[str, Any]:
    allowed = data_config_names(conf_dir)
    if name not in allowed:
        raise ConfigError(
            f"eval_data: there is no data config {name!r} in {Path(conf_dir) / 'data'} "
            f"(allowed: {', '.join(allowed)})"
        )
    values = yaml.safe_load((Path(conf_dir) / "data" / f"{name}.yaml").read_text()) or {}
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(DataConfig)})
    missing = sorted(k for k, v in values.items() if v == "???")
    problem = (
        f"has keys that are no data.* key ({', '.join(unknown)})"
        if unknown
        else f"leaves {', '.join(missing)} to be given (???)"
        if missing
        else None
    )
    if problem:
        raise ConfigError(
            f"eval_data: conf/data/{name}.yaml {problem}; a held-out corpus must be a complete "
            "data config of its own"
        )
    return values


def eval_data_configs(
    names: list[str], train: DataConfig, conf_dir: Path | str | None
) -> dict[str, DataConfig]:
    """``name -> DataConfig`` for every held-out corpus, in order, from ``conf_dir/data/`` (None:
    ``find_conf_dir()``, as ``train``); ConfigError (one line): no such file, an incomplete file, a
    value out of range; FileNotFoundError: no config folder."""
    if not names:
        return {}
    if conf_dir is None:
        conf_dir = find_conf_dir()
    out = {}
    for name in names:
        values = _read(name, Path(conf_dir))
        values.update({k: getattr(train, k) for k in FROM_TRAINING})
        values.update(token_dir=None, cache_dir=values.get("cache_dir") or train.cache_dir)
        try:
            out[name] = DataConfig(**values)
        except ConfigError as e:
            raise ConfigError(f"eval_data: conf/data/{name}.yaml: {e}") from None
    return out


def check_corpus(name: str, cfg: DataConfig) -> None:
    """DataError ``eval_data: <name>: <why and the fix>`` when a held-out corpus's local files are
    not there; Hub corpora are checked when they are prepared."""
    if cfg.format.name == "hub":
        return
    try:
        source_files(cfg)
    except DataError as e:
        raise DataError(f"eval_data: {name}: {e}") from None


def prepare_eval(name: str, cfg: DataConfig, train_dir: Path):
    """The ``TokenData`` of a held-out corpus (prepared once, cached); with ``bpe`` the training
    token folder ``train_dir``'s ``tokenizer.json`` encodes it. DataError as ``tokens.prepare``."""
    from normlab.data.tokens import fingerprint, prepare

    check_corpus(name, cfg)
    try:
        if cfg.tokenizer == Tokenizer.bpe:
            folder = Path(train_dir) / "eval" / f"{name}-{fingerprint(cfg, source_files(cfg))}"
            cfg = dataclasses.replace(cfg, token_dir=str(folder))
            if not (folder / tt.BPE_FILE).is_file():
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(train_dir) / tt.BPE_FILE, folder / tt.BPE_FILE)
        return prepare(cfg)
    except DataError as e:
        raise DataError(f"eval_data: {name}: {e}") from None
