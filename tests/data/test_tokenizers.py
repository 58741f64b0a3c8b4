"""Tokenizers: byte, tiktoken's GPT-2 (when its files are cached) and a trained BPE."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from normlab.config import DataConfig, Tokenizer
from normlab.data import tokenizer as tt
from normlab.data.tokens import DataError, prepare

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 5,
    "Pack my box with five dozen liquor jugs!\n" * 5,
    "héllo wörld ✓",
]


def test_the_embedding_size_is_the_vocabulary_padded_to_a_multiple_of_64():
    assert (
        tt.padded_vocab(256) == 256
        and tt.padded_vocab(50257) == 50304
        and tt.padded_vocab(4000) == 4032
    )


def test_bytes_round_trip_and_documents_are_separated_by_a_blank_line():
    tok = tt.load(Tokenizer.byte)
    ids = tok.encode(TEXTS)
    assert all(a.dtype == np.uint16 for a in ids)
    assert [bytes(a.astype(np.uint8)).decode() for a in ids] == TEXTS
    assert tok.separator.tolist() == [10, 10]


def test_a_trained_bpe_round_trips_reserves_id_0_for_end_of_text_and_is_deterministic(tmp_path):
    a = tt.train_bpe(iter(TEXTS * 3), 300, tmp_path / "a.json")
    tt.train_bpe(iter(TEXTS * 3), 300, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert a.separator.tolist() == [0] and a.tok.id_to_token(0) == tt.EOT and 256 < a.n_vocab <= 300
    ids = a.encode(TEXTS)
    assert [a.tok.decode(x.tolist()) for x in ids] == TEXTS
    assert sum(map(len, ids)) < sum(len(t.encode()) for t in TEXTS)  # merges compress
    assert a.encode([tt.EOT])[0].tolist() != [0]  # end-of-text inside a document is plain text


@pytest.mark.skipif(
    not tt.gpt2_cached(), reason="tiktoken's GPT-2 files are not cached here (offline machine)"
)
def test_gpt2_encodes_with_tiktoken_and_reports_the_padded_vocabulary(tmp_path):
    tok = tt.load(Tokenizer.gpt2)
    assert tok.encode(["Hello world"])[0].tolist() == [15496, 995] and tok.separator.tolist() == [
        50256
    ]
    f = tmp_path / "c.txt"
    f.write_text("Hello world. " * 200)
    data = prepare(
        DataConfig(name="mine", path=str(f), tokenizer="gpt2", cache_dir=str(tmp_path / "c"))
    )
    assert data.vocab_size == 50304 and data.meta["tokenizer_vocab_size"] == 50257


def test_gpt2_without_its_cached_files_offline_fails_fast_with_one_line_saying_how_to_fix_it(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(tt, "reachable", lambda url, timeout=3.0: False)
    f = tmp_path / "c.txt"
    f.write_text("hello " * 100)
    with pytest.raises(DataError) as e:
        prepare(
            DataConfig(name="mine", path=str(f), tokenizer="gpt2", cache_dir=str(tmp_path / "c"))
        )
    msg = str(e.value)
    assert (
        "\n" not in msg
        and "TIKTOKEN_CACHE_DIR" in msg
        and tt.GPT2_URLS[0] in msg
        and "get_encoding('gpt2')" in msg
    )
    assert not (tmp_path / "c").exists() or not any(
        (tmp_path / "c").iterdir()
    )  # nothing left behind


@pytest.mark.slow
@pytest.mark.skipif(
    tt.reachable(tt.GPT2_URLS[0], 1.0), reason="this machine can download tiktoken's files"
)
def test_normlab_prepare_with_gpt2_offline_prints_one_error_line(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("hello " * 100)
    env = dict(
        os.environ,
        TIKTOKEN_CACHE_DIR=str(tmp_path / "empty"),
        NORMLAB_CACHE=str(tmp_path / "cache"),
    )
    cmd = [
        sys.executable,
        "-m",
        "normlab.commands.prepare",
        "data=text_files",
        f"data.path={f}",
        "data.tokenizer=gpt2",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("normlab-prepare: error:")]
    assert len(errors) == 1 and "TIKTOKEN_CACHE_DIR" in errors[0] and "Traceback" not in r.stderr
