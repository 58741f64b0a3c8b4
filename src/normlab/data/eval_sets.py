"""Held-out corpora (``eval_data``): data configs from ``conf/data/<name>.yaml`` tokenized with the
training run's tokenizer, prepared and cached like the training data.

:func:`eval_data_configs` reads each named file and makes it a :class:`DataConfig` that differs
from the file in what must follow the training run: ``tokenizer`` (and ``bpe_vocab_size``),
``batch_size``, ``num_proc``, and ``cache_dir`` when the file leaves it null. Only the corpus is
the file's (format, path, glob, text field, validation split). :func:`prepare_eval` prepares one.

Byte and gpt2 tokens do not depend on the training corpus, so a held-out corpus gets the token
folder it would get as a training corpus (shared with runs that train on it). A ``bpe`` tokenizer
is the one trained on the training corpus: the held-out corpus is encoded with that
``tokenizer.json``, in a folder inside the training token folder
(``<train token folder>/eval/<name>-<fingerprint>/``), never with a BPE of its own.

No torch here: ``train`` checks ``eval_data`` before torch is imported.
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
    """``name -> DataConfig`` for every held-out corpus, in the order given.

    ``conf_dir`` is the config folder that holds ``data/<name>.yaml`` (``train`` passes its own);
    ``None`` means the one every tool composes from
    (:func:`normlab.config.base.find_conf_dir`), so a run built in-process (``build_run`` without
    a ``conf_dir``: the studies, the tests) resolves the same names as ``train``.

    Raises:
        ConfigError: a name without a file (the message lists the allowed names), a file that is
            no complete data config, or a value out of range (one line each).
        FileNotFoundError: ``conf_dir`` is ``None`` and no config folder can be found.
    """
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
    """Refuse a held-out corpus whose local files are not there (a missing package is one line
    naming its pip command). Hub corpora are checked when they are prepared.

    Raises:
        DataError: ``eval_data: <name>: <why and the fix>``.
    """
    if cfg.format.name == "hub":
        return
    try:
        source_files(cfg)
    except DataError as e:
        raise DataError(f"eval_data: {name}: {e}") from None


def prepare_eval(name: str, cfg: DataConfig, train_dir: Path):
    """The :class:`~normlab.data.tokens.TokenData` of a held-out corpus (prepared once, cached).

    ``train_dir``: the training run's token folder; with ``bpe`` its ``tokenizer.json`` encodes
    the corpus, in a folder below it named by the corpus's fingerprint.

    Raises:
        DataError: as :func:`~normlab.data.tokens.prepare`, the message prefixed with the name.
    """
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
