"""decode for every tokenizer, and the validation split's bytes per token behind val/bpb."""

from __future__ import annotations

import math
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from normlab.config import DataConfig, Tokenizer
from normlab.data import tokenizer as tt
from normlab.data.corpus import held_out
from normlab.data.tokens import prepare

#: Text a tokenizer must give back exactly: multi-byte characters, emoji, whitespace runs, CRLF,
#: the end-of-text marker written as text, a NUL.
HARD = [
    "plain ascii, with punctuation: (a+b)*c = d;",
    "ünïcödé — ελληνικά — 中文 — 😀👍🏽",
    "  leading and trailing spaces  \n\n\ttabs\r\nand CRLF\n",
    "<|endoftext|> written inside a document is text",
    "nul\x00byte",
    "",
]
WORDS = "the a norm layer root mean square gradient token model train valid loss step".split()


def documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 40))) + f" é{i}" for i in range(n)
    ]


def bpe(tmp_path) -> tt.BPETokenizer:
    return tt.train_bpe(iter(documents(200) + HARD), 400, tmp_path / "tokenizer.json")


def gpt2():
    if not tt.gpt2_cached():
        pytest.skip("tiktoken's GPT-2 files are not cached here (offline machine)")
    return tt.load(Tokenizer.gpt2)


@pytest.mark.parametrize("kind", ["byte", "bpe", "gpt2"])
def test_decode_of_encode_is_the_text_for_every_tokenizer(tmp_path, kind):
    tok = {"byte": tt.ByteTokenizer, "bpe": lambda: bpe(tmp_path), "gpt2": gpt2}[kind]()
    for text, ids in zip(HARD, tok.encode(HARD), strict=True):
        assert ids.dtype == np.uint16
        assert tok.decode(ids) == text
        assert tok.decode(ids.tolist()) == text  # a list (a sampled sequence) as well


def test_decode_replaces_a_split_character_and_refuses_ids_outside_the_vocabulary(tmp_path):
    byte = tt.ByteTokenizer()
    ids = byte.encode(["é"])[0]  # two bytes: 0xC3 0xA9
    assert byte.decode(ids[:1]) == "\ufffd"
    with pytest.raises(tt.TokenizerError, match=r"byte ids must be in \[0, 256\); got 300"):
        byte.decode([65, 300])
    tok = bpe(tmp_path)
    with pytest.raises(tt.TokenizerError, match=rf"bpe ids must be in \[0, {tok.n_vocab}\)"):
        tok.decode([tok.n_vocab])


def parquet_corpus(tmp_path, docs: list[str]) -> dict:
    pq.write_table(pa.table({"text": docs}), tmp_path / "docs.parquet")
    return dict(format="parquet", path=str(tmp_path / "docs.parquet"), val_fraction=0.2)


def test_byte_tokens_have_one_byte_per_token_so_bpb_is_loss_over_ln2_exactly(tmp_path):
    data = prepare(
        DataConfig(
            name="b", cache_dir=str(tmp_path / "c"), **parquet_corpus(tmp_path, documents(60))
        )
    )
    m = data.meta
    assert m["val_bytes"] == m["val_tokens"] == len(data.val) and m["bytes_per_token"] == 1.0
    assert data.val_bytes_per_token == 1.0
    for loss in (0.0, 1.2345, 5.545):
        assert data.bits_per_byte(loss) == loss / math.log(2)


def test_bpe_bytes_per_token_matches_a_count_by_hand(tmp_path):
    docs = documents(60)
    cfg = DataConfig(
        name="p",
        tokenizer="bpe",
        bpe_vocab_size=300,
        cache_dir=str(tmp_path / "c"),
        **parquet_corpus(tmp_path, docs),
    )
    data = prepare(cfg)
    val_docs = [d for d in docs if held_out(d, 0.2)]
    # by hand: every validation document's UTF-8 bytes, plus 2 bytes per boundary between them;
    # the tokens: each document's BPE ids plus one <|endoftext|> per boundary
    n_bytes = sum(len(d.encode("utf-8")) for d in val_docs) + 2 * (len(val_docs) - 1)
    tok = data.load_tokenizer()
    n_tokens = sum(len(ids) for ids in tok.encode(val_docs)) + (len(val_docs) - 1)
    assert (data.meta["val_bytes"], data.meta["val_tokens"]) == (n_bytes, n_tokens)
    assert n_tokens < n_bytes  # merges: more than one byte per token
    loss = 3.0
    assert data.bits_per_byte(loss) == pytest.approx(loss * n_tokens / n_bytes / math.log(2))
    assert tok.decode(data.val) == tt.EOT.join(val_docs)  # the split decodes to its documents


def test_shards_prepared_before_bytes_were_recorded_give_no_bpb(tmp_path):
    data = prepare(
        DataConfig(
            name="b", cache_dir=str(tmp_path / "c"), **parquet_corpus(tmp_path, documents(60))
        )
    )
    old = dict(data.meta)
    old.pop("bytes_per_token")
    legacy = type(data)(data.train_shards, data.val_shards, data.vocab_size, old, data.directory)
    assert legacy.val_bytes_per_token is None and legacy.bits_per_byte(2.0) is None
