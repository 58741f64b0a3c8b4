"""The token-cache fingerprint is derived from DataConfig's fields: a new field is covered without
an edit, and every field left out provably does not change the tokens."""

from __future__ import annotations

import dataclasses
import enum
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from normlab.config import DataConfig, DataFormat, Tokenizer
from normlab.data import tokens
from normlab.data.sources import source_files
from normlab.data.tokens import NOT_IN_FINGERPRINT, ONLY_WHEN, fingerprint, prepare

WORDS = "norm layer root mean square gradient token model shard batch".split()


def corpus(root, n: int = 6):
    """``n`` small text files (one document each) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(40 + 7 * i))
        (root / f"work-{i}.txt").write_text(f"{text} ({i}) é\n")
    return root


def base(tmp_path, **kw) -> DataConfig:
    keys = dict(
        name="fp",
        format="text",
        path=str(corpus(tmp_path / "src")),
        file_glob="*.txt",
        val_fraction=0.3,
        token_dir=str(tmp_path / "tok-base"),
    )
    return DataConfig(**{**keys, **kw})


def fp(cfg: DataConfig) -> str:
    return fingerprint(cfg, source_files(cfg))


def shards(data) -> list[list[int]]:
    return [np.asarray(s).tolist() for s in data.train_shards + data.val_shards]


def other_value(cfg: DataConfig, name: str):
    """A valid value of field ``name`` other than ``cfg``'s."""
    value = getattr(cfg, name)
    special = {
        "format": DataFormat.json,  # (auto resolves to text here: the same tokens)
        "tokenizer": Tokenizer.bpe,
        "val_fraction": 0.2,
    }
    if name in special:
        return special[name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, enum.Enum):
        return next(m for m in type(value) if m != value)
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return 1000 if name.startswith("max_") else "sub"  # a null cap or a null Hub option


def test_a_new_field_of_a_data_config_subclass_changes_the_fingerprint(tmp_path):
    @dataclasses.dataclass
    class WithLowercase(DataConfig):
        lowercase: bool = False  # a setting a contributor adds, and forgets to tell the cache

    plain = base(tmp_path)
    keys = {f.name: getattr(plain, f.name) for f in dataclasses.fields(plain)}
    off, on = WithLowercase(**keys), WithLowercase(**keys, lowercase=True)
    files = source_files(plain)
    assert "lowercase" in tokens.fingerprint_settings(on, files)
    assert fingerprint(off, files) != fingerprint(on, files)


def hashed_fields() -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(DataConfig)
        if f.name not in NOT_IN_FINGERPRINT and f.name not in ONLY_WHEN
    ]


@pytest.mark.parametrize("name", hashed_fields())
def test_every_other_field_changes_the_fingerprint(tmp_path, name):
    cfg = base(tmp_path)
    changed = dataclasses.replace(cfg, **{name: other_value(cfg, name)})
    assert fp(changed) != fp(cfg), f"data.{name} is not in the fingerprint"


def test_bpe_settings_count_only_for_bpe_and_hf_path_only_without_local_files(tmp_path):
    byte = base(tmp_path)
    assert fp(dataclasses.replace(byte, bpe_vocab_size=300, bpe_train_chars=10)) == fp(byte)
    bpe = base(tmp_path, tokenizer="bpe")
    assert fp(dataclasses.replace(bpe, bpe_vocab_size=300)) != fp(bpe)
    assert fp(dataclasses.replace(bpe, bpe_train_chars=10)) != fp(bpe)
    remote = DataConfig(name="h", format="hub", hf_path="org/a")
    assert fingerprint(remote, []) != fingerprint(dataclasses.replace(remote, hf_path="org/b"), [])


def hub_folder(root):
    (root / "data").mkdir(parents=True)
    docs = [f"document {i}: " + " ".join(WORDS[i % 5 :]) for i in range(40)]
    pq.write_table(pa.table({"text": docs[:-8]}), root / "data" / "train-00000-of-00001.parquet")
    pq.write_table(
        pa.table({"text": docs[-8:]}), root / "data" / "validation-00000-of-00001.parquet"
    )
    return str(root)


def variants(tmp_path, name: str) -> tuple[DataConfig, DataConfig]:
    """Two configs differing only in the excluded field ``name`` (each its own token folder)."""
    a = base(tmp_path, token_dir=str(tmp_path / "tok-a"))
    if name == "path":  # the same files seen through another path
        os.symlink(a.path, tmp_path / "elsewhere")
        return a, dataclasses.replace(a, path=str(tmp_path / "elsewhere"), token_dir=None)
    if name == "streaming":
        a = DataConfig(name="h", format="hub", hf_path=hub_folder(tmp_path / "hub"))
        a = dataclasses.replace(a, token_dir=str(tmp_path / "tok-a"))
    if name in ("cache_dir", "token_dir"):
        a = dataclasses.replace(a, token_dir=None, cache_dir=str(tmp_path / "cache-a"))
    alt = (
        {
            "file_glob": "*",
            "streaming": not a.streaming,
            "num_proc": 2,
            "cache_dir": str(tmp_path / "cache-b"),
            "token_dir": str(tmp_path / "tok-b"),
            "batch_size": a.batch_size + 5,
        }[name]
        if name != "path"
        else None
    )
    b = dataclasses.replace(a, **{name: alt})
    if name not in ("cache_dir", "token_dir"):
        b = dataclasses.replace(b, token_dir=None, cache_dir=str(tmp_path / "cache-b"))
    return a, b


@pytest.mark.parametrize("name", sorted(NOT_IN_FINGERPRINT))
def test_each_field_left_out_of_the_fingerprint_does_not_change_the_tokens(tmp_path, name):
    a, b = variants(tmp_path, name)
    assert getattr(a, name) != getattr(b, name)
    assert fp(a) == fp(b)
    da, db = prepare(a), prepare(b)
    assert da.directory != db.directory  # two independent prepares ...
    assert shards(da) == shards(db) and da.meta["splits"] == db.meta["splits"]  # ... same tokens
