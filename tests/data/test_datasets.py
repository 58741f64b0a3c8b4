"""Corpora through the real ``datasets`` builders (parquet, JSON lines, a Hub-like folder),
sharded tokens, resuming an interrupted prepare, refusing another tokenizer's shards, and the Hub
offline."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import normlab.data.shards as npre
from normlab.config import DataConfig, Tokenizer
from normlab.data import tokenizer as tt
from normlab.data.tokens import BatchSampler, DataError, held_out, prepare

WORDS = (
    "the a norm layer root mean square gradient token model train valid loss step batch shard"
).split()


def documents(n: int = 80, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + f" ({i})"
        for i in range(n)
    ]


def write_source(kind: str, root: Path, docs: list[str]) -> dict:
    """Write ``docs`` as ``kind`` under ``root``; the DataConfig keys that read them back."""
    root.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        for part in range(2):
            with open(root / f"part-{part}.jsonl", "w") as f:
                f.writelines(
                    json.dumps({"id": i, "content": d}) + "\n" for i, d in enumerate(docs[part::2])
                )
        return {
            "format": "auto",
            "path": str(root),
            "file_glob": "*.jsonl",
            "text_field": "content",
        }
    if kind == "parquet":
        pq.write_table(pa.table({"text": docs}), root / "docs.parquet")
        return {"format": "parquet", "path": str(root / "docs.parquet")}
    # laid out like a dataset on the Hub: data/<split>-NNNNN-of-NNNNN.parquet
    (root / "data").mkdir()
    pq.write_table(pa.table({"text": docs[:-10]}), root / "data" / "train-00000-of-00001.parquet")
    pq.write_table(
        pa.table({"text": docs[-10:]}), root / "data" / "validation-00000-of-00001.parquet"
    )
    return {"format": "hub", "hf_path": str(root)}


def expected_split(kind: str, docs: list[str]) -> tuple[list[str], list[str]]:
    if kind == "hub":
        return docs[:-10], docs[-10:]
    order = [d for part in range(2) for d in docs[part::2]] if kind == "jsonl" else docs
    return [d for d in order if not held_out(d, 0.2)], [d for d in order if held_out(d, 0.2)]


def decode(data, tokenizer: str, ids: np.ndarray) -> str:
    if tokenizer == "byte":
        return bytes(ids.astype(np.uint8)).decode()
    return tt.load(Tokenizer.bpe, data.directory).tok.decode(
        ids.tolist(), skip_special_tokens=False
    )


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
@pytest.mark.parametrize("kind", ["jsonl", "parquet", "hub"])
def test_a_source_read_through_datasets_is_tokenized_into_shards_that_decode_to_its_documents(
    tmp_path, kind, tokenizer
):
    docs = documents()
    keys = write_source(kind, tmp_path / "src", docs)
    cfg = DataConfig(
        name=f"t-{kind}",
        tokenizer=tokenizer,
        bpe_vocab_size=320,
        val_fraction=0.2,
        shard_tokens=1500,
        cache_dir=str(tmp_path / "c"),
        **keys,
    )
    data = prepare(cfg)
    train, val = expected_split(kind, docs)
    sep = "\n\n" if tokenizer == "byte" else tt.EOT
    assert decode(data, tokenizer, np.concatenate(data.train_shards)) == sep.join(train)
    assert decode(data, tokenizer, np.concatenate(data.val_shards)) == sep.join(val)
    m = data.meta
    assert (
        m["complete"]
        and m["tokenizer"] == tokenizer
        and m["tokens"]["train"] == sum(map(len, data.train_shards))
    )
    assert len(data.train_shards) > 1 and all(len(s) >= 1500 for s in data.train_shards[:-1])
    assert all(isinstance(s, np.memmap) for s in data.train_shards)
    if tokenizer == "bpe":
        assert (
            (data.directory / "tokenizer.json").is_file()
            and data.vocab_size == 320
            and m["bpe_vocab_size"] == 320
        )
    else:
        assert data.vocab_size == 256
    x, y = BatchSampler(data, 4, 32, seed=0, device=torch.device("cpu")).train_batch(0)
    assert x.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


def test_several_tokenizer_processes_write_the_same_shards_as_one(tmp_path):
    keys = write_source("jsonl", tmp_path / "src", documents(120))
    common = dict(
        name="mp", tokenizer="bpe", bpe_vocab_size=300, val_fraction=0.2, shard_tokens=2000, **keys
    )
    one = prepare(DataConfig(num_proc=1, token_dir=str(tmp_path / "one"), **common))
    two = prepare(DataConfig(num_proc=2, token_dir=str(tmp_path / "two"), **common))
    assert [s["file"] for s in one.meta["splits"]["train"]["shards"]] == [
        s["file"] for s in two.meta["splits"]["train"]["shards"]
    ]
    for a, b in zip(
        one.train_shards + one.val_shards, two.train_shards + two.val_shards, strict=True
    ):
        assert np.array_equal(a, b)


def test_the_token_budget_and_the_document_cap_stop_reading_early(tmp_path):
    keys = write_source("parquet", tmp_path / "src", documents(200))
    capped = prepare(
        DataConfig(
            name="cap", max_tokens=3000, val_fraction=0.2, cache_dir=str(tmp_path / "c"), **keys
        )
    )
    assert (
        3000 <= capped.meta["tokens"]["train"] < 3000 + 500
    )  # stops at the document that crosses it
    few = prepare(
        DataConfig(
            name="few", max_documents=30, val_fraction=0.2, cache_dir=str(tmp_path / "c"), **keys
        )
    )
    assert few.meta["splits"]["train"]["docs"] + few.meta["splits"]["val"]["docs"] == 30


def test_a_source_with_its_own_validation_split_caps_it_in_proportion_to_the_token_budget(tmp_path):
    keys = write_source("hub", tmp_path / "src", documents(200))
    data = prepare(
        DataConfig(
            name="cap", max_tokens=2000, val_fraction=0.2, cache_dir=str(tmp_path / "c"), **keys
        )
    )
    assert (
        2000 <= data.meta["tokens"]["train"] < 2500 and 500 <= data.meta["tokens"]["val"] < 1000
    )  # 2000 * 0.2 / 0.8


def test_a_missing_text_column_is_named_with_the_columns_there_are(tmp_path):
    keys = write_source("jsonl", tmp_path / "src", documents())
    with pytest.raises(DataError, match=r"no column data.text_field='text'.*content"):
        prepare(
            DataConfig(name="x", cache_dir=str(tmp_path / "c"), **{**keys, "text_field": "text"})
        )


def test_an_interrupted_prepare_resumes_without_rewriting_finished_shards(tmp_path, monkeypatch):
    keys = write_source("jsonl", tmp_path / "src", documents(150))
    cfg = DataConfig(
        name="resume",
        tokenizer="bpe",
        bpe_vocab_size=300,
        val_fraction=0.2,
        shard_tokens=1200,
        token_dir=str(tmp_path / "tok"),
        **keys,
    )
    written: list[str] = []
    real = npre._write_shard

    def crash_on_the_fourth(path, ids):
        if len(written) == 3:
            raise KeyboardInterrupt  # as if Ctrl-C arrived while the fourth shard was being written
        real(path, ids)
        written.append(path.name)

    monkeypatch.setattr(npre, "_write_shard", crash_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg)
    meta = json.loads((tmp_path / "tok" / "meta.json").read_text())
    done = [s["file"] for split in ("train", "val") for s in meta["splits"][split]["shards"]]
    assert not meta["complete"] and sorted(done) == sorted(written)
    stamps = {f: (tmp_path / "tok" / f).stat().st_mtime_ns for f in done}
    bpe_stamp = (tmp_path / "tok" / "tokenizer.json").stat().st_mtime_ns

    monkeypatch.setattr(npre, "_write_shard", real)
    resumed = prepare(cfg)
    assert resumed.meta["complete"] and resumed.meta["resumed"]
    assert {f: (tmp_path / "tok" / f).stat().st_mtime_ns for f in done} == stamps  # not rewritten
    assert (tmp_path / "tok" / "tokenizer.json").stat().st_mtime_ns == bpe_stamp
    fresh = prepare(DataConfig(**{**cfg.__dict__, "token_dir": str(tmp_path / "fresh")}))
    assert resumed.meta["splits"] == fresh.meta["splits"]
    for a, b in zip(
        resumed.train_shards + resumed.val_shards,
        fresh.train_shards + fresh.val_shards,
        strict=True,
    ):
        assert np.array_equal(a, b)


def test_shards_made_with_another_tokenizer_are_refused_naming_both(tmp_path):
    keys = write_source("parquet", tmp_path / "src", documents())
    prepare(DataConfig(name="x", val_fraction=0.2, token_dir=str(tmp_path / "tok"), **keys))
    with pytest.raises(DataError) as e:
        prepare(
            DataConfig(
                name="x", val_fraction=0.2, tokenizer="bpe", token_dir=str(tmp_path / "tok"), **keys
            )
        )
    msg = str(e.value)
    assert (
        "\n" not in msg
        and "made with tokenizer byte" in msg
        and "data.tokenizer=bpe (vocab 4096)" in msg
    )


def test_a_complete_token_folder_is_used_without_its_source(tmp_path):
    keys = write_source("parquet", tmp_path / "src", documents())
    cfg = DataConfig(name="x", val_fraction=0.2, token_dir=str(tmp_path / "tok"), **keys)
    first = prepare(cfg)
    (tmp_path / "src" / "docs.parquet").unlink()
    assert prepare(cfg).meta["tokens"] == first.meta["tokens"]


def hub_cfg(**kw) -> DataConfig:
    return DataConfig(name="tinystories", format="hub", hf_path="roneneldan/TinyStories", **kw)


def test_a_hub_dataset_offline_and_not_cached_fails_with_one_line(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for streaming in (False, True):
        with pytest.raises(DataError) as e:
            prepare(hub_cfg(streaming=streaming, cache_dir=str(tmp_path)))
        msg = str(e.value)
        assert "\n" not in msg and "roneneldan/TinyStories" in msg and "HF_HUB_OFFLINE=1" in msg
        assert "normlab-prepare data=tinystories" in msg and "HF_DATASETS_CACHE" in msg
    assert not any(tmp_path.iterdir())  # no empty cache folder left behind


def test_a_copied_token_folder_serves_a_hub_dataset_offline(tmp_path, monkeypatch):
    keys = write_source("parquet", tmp_path / "src", documents())
    made = prepare(
        DataConfig(name="tinystories", val_fraction=0.2, token_dir=str(tmp_path / "tok"), **keys)
    )
    monkeypatch.setattr(tt, "reachable", lambda url, timeout=3.0: False)
    assert (
        prepare(hub_cfg(token_dir=str(tmp_path / "tok"), tokenizer="byte")).meta["tokens"]
        == made.meta["tokens"]
    )


def test_an_unreachable_hub_fails_fast_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(tt, "reachable", lambda url, timeout=3.0: False)
    with pytest.raises(
        DataError, match=r"unreachable \(no connection to https://huggingface.co within 3 s\)"
    ):
        prepare(hub_cfg(cache_dir=str(tmp_path)))


@pytest.mark.slow
def test_train_and_normlab_prepare_offline_print_one_error_line_and_no_traceback(tmp_path):
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        NORMLAB_CACHE=str(tmp_path / "cache"),
        HYDRA_FULL_ERROR="0",
    )
    for cmd, prefix in (
        (
            [
                sys.executable,
                "-m",
                "normlab.commands.train",
                "data=tinystories",
                "model=tiny",
                "device=cpu",
                "logger=none",
                "max_steps=1",
            ],
            "normlab: error:",
        ),
        (
            [sys.executable, "-m", "normlab.commands.prepare", "data=fineweb_edu"],
            "normlab-prepare: error:",
        ),
    ):
        r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        (line,) = [x for x in r.stderr.splitlines() if x.startswith(prefix)]
        assert "HF_HUB_OFFLINE=1" in line and "normlab-prepare data=" in line


def test_normlab_prepare_runs_one_row_per_value_of_a_comma_list(tmp_path, capsys):
    from normlab.commands.prepare import main

    keys = write_source("parquet", tmp_path / "src", documents())
    main(
        [
            "--fresh",
            "data=text_files",
            f"data.path={keys['path']}",
            "data.val_fraction=0.2",
            "data.bpe_vocab_size=300",
            "data.tokenizer=byte,bpe",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("data ") and len(out) == 3
    assert out[1].split()[:3] == ["text_files", "byte", "256"] and out[2].split()[:3] == [
        "text_files",
        "bpe",
        "(300)",
    ]
    assert (
        int(out[2].split()[3]) % 64 == 0
    )  # the embedding size: the trained vocabulary padded to 64
    assert not list(tmp_path.glob("normlab-prepare-*"))  # --fresh leaves nothing behind
