"""``normlab-sample``: a run's checkpoint -> its model, its norm, its tokenizer -> text."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from normlab.commands.sample import main
from normlab.config import ConfigError, DataConfig, NormImpl
from normlab.data import tokenizer as tt
from normlab.data.corpus import DataError
from normlab.data.tokens import prepare
from normlab.norms import unavailable_reason
from normlab.training.checkpoint import CKPT_DIR, save_checkpoint
from normlab.training.sample import (
    SampleOptions,
    encode_prompt,
    generate,
    load_run,
    run_tokenizer,
    sample_texts,
)

from ..conftest import REPO, TINY, run_cli
from .conftest import corpus_lines, train_bpe_run, write_run

CONTEXT = 32  # TINY's model.context_length


def _main(argv, capsys):
    """Run the CLI in-process: (exit status, stdout, stderr)."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_model_is_rebuilt_with_the_norm_and_weights_it_trained_with(tiny_run):
    run_dir, original = tiny_run
    run = load_run(run_dir, "cpu")
    assert run.norm.kind.name == "rms" and run.norm.impl == NormImpl.torch and run.step == 7
    assert type(run.model.blocks[0].attn_in) is type(original.blocks[0].attn_in)
    idx = torch.randint(0, 256, (2, CONTEXT))
    torch.testing.assert_close(run.model(idx)[0], original(idx)[0], rtol=0, atol=0)


def test_a_fixed_seed_gives_the_same_samples_and_another_seed_others(tiny_run):
    run = load_run(tiny_run[0], "cpu")
    opts = SampleOptions(max_new_tokens=20, temperature=1.0, top_k=None, num_samples=3, seed=5)
    first = sample_texts(run, "To be", opts)
    assert sample_texts(run, "To be", opts) == first
    assert len(first) == 3 and len(set(first)) == 3  # the rows of one batch differ
    assert sample_texts(run, "To be", dataclasses.replace(opts, seed=6)) != first


def test_top_k_1_is_argmax_decoding_computed_step_by_step(tiny_run):
    run = load_run(tiny_run[0], "cpu")
    prompt = "ROMEO:"
    n_new = CONTEXT + 8  # past the context length: the context is cropped
    idx = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        for _ in range(n_new):
            logits = run.model(idx[:, -CONTEXT:])[0][:, -1]
            idx = torch.cat([idx, logits.argmax(dim=-1, keepdim=True)], dim=1)
    want = bytes(idx[0].tolist()).decode("utf-8", errors="replace")
    for temperature in (1.0, 0.3):  # top-k 1 leaves one token whatever the temperature
        opts = SampleOptions(max_new_tokens=n_new, temperature=temperature, top_k=1, seed=3)
        assert sample_texts(run, prompt, opts) == [want]


def test_ids_beyond_the_tokenizers_vocabulary_are_never_drawn(tiny_run):
    run = load_run(tiny_run[0], "cpu")
    g = torch.Generator().manual_seed(0)
    out = generate(run.model, torch.zeros(4, 1, dtype=torch.long), 50, 5.0, None, g, 100)
    assert out[:, 1:].max() < 100 and out[:, 1:].unique().numel() > 20  # hot, yet below 100


def test_the_sample_text_is_decode_of_the_prompt_ids_and_the_new_ones(tiny_run):
    run = load_run(tiny_run[0], "cpu")
    prompt = "Où est-il? ½"
    assert run.tokenizer.decode(encode_prompt(run.tokenizer, prompt)) == prompt
    text = sample_texts(run, prompt, SampleOptions(max_new_tokens=5, top_k=1))[0]
    assert text.startswith(prompt) and len(text.encode()) >= len(prompt.encode()) + 1


def test_an_empty_prompt_starts_after_the_document_separator(tiny_run):
    run = load_run(tiny_run[0], "cpu")
    opts = SampleOptions(max_new_tokens=12, top_k=1)
    empty = sample_texts(run, "", opts)[0]
    after_separator = sample_texts(run, "\n\n", opts)[0]
    assert after_separator == "\n\n" + empty  # the separator is context, not sample text


def test_a_prompt_the_tokenizer_cannot_encode_is_one_line_exit_2(tiny_run, capsys):
    with pytest.raises(ConfigError, match=r"character 2 \('\\udcff'"):
        encode_prompt(tt.ByteTokenizer(), "ab\udcff")
    code, out, err = _main([tiny_run[0], "--prompt", "ab\udcff", "--device", "cpu"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("normlab-sample: error: --prompt cannot be")


def test_invalid_utf8_on_the_real_command_line_is_refused(tiny_run):
    cmd = [sys.executable, "-m", "normlab.commands.sample", str(tiny_run[0]).encode()]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    r = subprocess.run([*cmd, b"--prompt", b"caf\xff"], env=env, capture_output=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert b"--prompt cannot be encoded by the byte tokenizer at character 3" in r.stderr


def test_a_run_dir_without_a_checkpoint_is_one_line_naming_it(tmp_path, capsys):
    code, out, err = _main([tmp_path], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"run dir {tmp_path} has no valid checkpoint" in err
    code, _, err = _main([tmp_path / "absent"], capsys)
    assert code == 2 and err.strip().endswith(f"run dir {tmp_path / 'absent'} does not exist")


def test_a_damaged_checkpoint_is_skipped_and_named(tiny_run, capsys):
    run_dir = tiny_run[0]
    (path,) = (run_dir / CKPT_DIR).iterdir()
    path.write_bytes(path.read_bytes()[:-10])
    code, _, err = _main([run_dir], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "has no valid checkpoint in checkpoints/: 1 damaged" in err and path.name in err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--temperature", "0", "--temperature=0.0: must be a finite number > 0"),
        ("--temperature", "-1", "--temperature=-1.0: must be a finite number > 0"),
        ("--temperature", "nan", "--temperature=nan: must be a finite number > 0"),
        ("--top-k", "0", "--top-k=0: must be >= 1"),
        ("--max-new-tokens", "0", "--max-new-tokens=0: must be >= 1"),
        ("--num-samples", "0", "--num-samples=0: must be >= 1"),
        ("--device", "gpu", "--device=gpu is not allowed: auto, cpu, cuda, cuda:N"),
    ],
)
def test_bad_options_are_one_line_exit_2(tiny_run, capsys, flag, value, message):
    code, out, err = _main([tiny_run[0], flag, value], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"normlab-sample: error: {message}")


def test_a_norm_implementation_that_cannot_run_here_is_refused_unless_replaced(
    tmp_path, cfg_tiny, one_thread, monkeypatch, capsys
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if unavailable_reason(NormImpl.triton, "cpu") is None:
        pytest.skip("triton runs on this CPU")
    run_dir = tmp_path / "run"
    cfg = cfg_tiny("norm=rms", "norm.impl=torch")
    model = write_run(run_dir, cfg)
    ckpt = next((run_dir / CKPT_DIR).iterdir())
    state = torch.load(ckpt, weights_only=True)
    state["config"]["norm"]["impl"] = "triton"  # as if trained on a GPU
    ckpt.unlink()
    save_checkpoint(run_dir / CKPT_DIR, state, keep=2)
    code, _, err = _main([run_dir, "--device", "cpu"], capsys)
    assert code == 2 and "norm.impl=triton cannot run on device 'cpu'" in err
    run = load_run(run_dir, "cpu", NormImpl.torch)
    idx = torch.randint(0, 256, (1, CONTEXT))
    torch.testing.assert_close(run.model(idx)[0], model(idx)[0], rtol=0, atol=0)


def test_a_bpe_run_finds_its_tokenizer_in_its_token_folder_or_the_summarys(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    data = DataConfig(
        name="mini", path=str(corpus), cache_dir=str(tmp_path / "c"), tokenizer="bpe",
        bpe_vocab_size=300, val_fraction=0.1,
    )  # fmt: skip
    prepared = prepare(data)
    folder = prepared.directory

    def no_prepare(cfg):
        raise AssertionError("prepared again")

    monkeypatch.setattr("normlab.training.sample.prepare", no_prepare)
    tok = run_tokenizer(data)
    assert tok.name == "bpe" and 256 < tok.n_vocab == prepared.load_tokenizer().n_vocab <= 300
    ids = encode_prompt(tok, "the lazy fox")
    assert len(ids) < len("the lazy fox") and tok.decode(ids) == "the lazy fox"
    corpus.unlink()  # a run dir copied elsewhere: no corpus, the summary names the folder
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"data": {"cache": str(folder)}}))
    assert run_tokenizer(data, run_dir).encode(["the lazy fox"])[0].tolist() == ids
    monkeypatch.undo()
    with pytest.raises(DataError, match="does not exist"):
        run_tokenizer(data)  # no folder to read it from, and no corpus to prepare it again


# --- the tokenizer a run used, by digest (issue 37, kind 6) ------------------------------------


@pytest.fixture
def bpe_run(tmp_path, cfg_tiny, one_thread):
    """``(run dir, corpus file, summary, data config)`` of a 2-step run with a BPE trained on its
    corpus."""
    return train_bpe_run(tmp_path, cfg_tiny)


def test_a_run_records_the_digest_of_the_tokenizer_it_trained_with(bpe_run):
    run_dir, _, summary, _ = bpe_run
    recorded = summary["data"]["tokenizer_digest"]
    cache = Path(summary["data"]["cache"])
    assert recorded == tt.digest(tt.load(tt.Tokenizer.bpe, cache)) and len(recorded) == 64
    assert (
        json.loads((run_dir / "summary.json").read_text())["data"]["tokenizer_digest"] == recorded
    )
    assert tt.digest(tt.ByteTokenizer()) != recorded  # a digest names one tokenizer
    run = load_run(run_dir, "cpu")
    assert run.tokenizer_notice is None and tt.digest(run.tokenizer) == recorded


def test_a_bpe_tokenizer_trained_again_on_a_changed_corpus_is_refused_naming_both_digests(
    bpe_run, capsys
):
    """The run's token cache is gone and its corpus changed: the tokenizer trained again is
    another one, and scoring or sampling with it would be silently wrong."""
    run_dir, corpus, summary, _ = bpe_run
    shutil.rmtree(summary["data"]["cache"])
    corpus.write_text(corpus_lines(300, seed=3, words="other words entirely now".split()))
    with pytest.raises(DataError) as e:
        load_run(run_dir, "cpu")
    recorded = summary["data"]["tokenizer_digest"]
    assert f"not the {recorded} the run trained with" in str(e.value)
    found = str(e.value).split("has digest ")[1].split(",")[0]
    assert len(found) == 64 and found != recorded
    code, out, err = _main([run_dir, "--device", "cpu"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"has digest {found}, not the {recorded}" in err and "put back " in err


def test_a_bpe_tokenizer_trained_again_on_the_same_corpus_is_the_one_the_run_used(bpe_run):
    run_dir, _, summary, _ = bpe_run
    shutil.rmtree(summary["data"]["cache"])  # prepared again from the unchanged corpus
    run = load_run(run_dir, "cpu")
    assert tt.digest(run.tokenizer) == summary["data"]["tokenizer_digest"]
    assert run.tokenizer_notice is None


def test_a_bpe_run_passes_over_the_token_folder_of_its_changed_corpus_for_its_own(bpe_run):
    """The corpus changed and was prepared again (its own folder, its own BPE); the run's folder
    is still there: the run's tokenizer is the one loaded, not the corpus's new one."""
    run_dir, corpus, summary, data = bpe_run
    corpus.write_text(corpus_lines(300, seed=3, words="other words entirely now".split()))
    new = prepare(data)
    assert str(new.directory) != summary["data"]["cache"]
    assert tt.digest(new.load_tokenizer()) != summary["data"]["tokenizer_digest"]
    run = load_run(run_dir, "cpu")
    assert tt.digest(run.tokenizer) == summary["data"]["tokenizer_digest"]


def test_a_run_that_recorded_no_tokenizer_digest_loads_as_before_with_a_notice(tiny_run, capsys):
    run_dir, _ = tiny_run  # a checkpoint and no summary.json: a run from before digests
    run = load_run(run_dir, "cpu")
    assert run.tokenizer.name == "byte" and "records no tokenizer digest" in run.tokenizer_notice
    (run_dir / "summary.json").write_text(json.dumps({"data": {"cache": "/gone"}}))
    code, out, err = _main([run_dir, "--device", "cpu", "--max-new-tokens", "3"], capsys)
    assert code == 0 and out.endswith("---------------\n")
    notices = [line for line in err.splitlines() if "records no tokenizer digest" in line]
    assert notices == [
        f"normlab-sample: {run_dir} records no tokenizer digest (a run from before they were "
        "recorded): its byte tokenizer is used unchecked"
    ]


@pytest.mark.slow
def test_a_run_trained_by_the_train_cli_prints_text(tmp_path, one_thread, capsys):
    run_dir = tmp_path / "run"
    overrides = [*TINY, "max_steps=30", "eval_interval=15", "optim.lr=3e-3"]
    r = run_cli([*overrides, "sample_interval=15", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    log = (run_dir / "train.log").read_text()  # samples during training go to the run's log
    assert "sample after step 15 (prompt " in log and "sample after step 30 (prompt " in log
    # normlab-sample in-process: test_invalid_utf8_on_the_real_command_line_is_refused runs it
    # as a subprocess
    args = ["--prompt", "KING:", "--max-new-tokens", "60", "--num-samples", "2", "--seed", "1"]
    code, out, err = _main([run_dir, "--device", "cpu", "--threads", "1", *args], capsys)
    assert code == 0, err
    samples = out.split("---------------\n")
    assert len(samples) == 3 and samples[2] == ""
    assert all(s.startswith("KING:") and len(s) > 40 for s in samples[:2])
    assert "step 30" in err and "norm layer/cpp" in err


@pytest.mark.parametrize("kind", ["byte", "bpe", "gpt2"])
def test_every_tokenizer_round_trips_a_prompt_and_refuses_a_lone_surrogate(kind, tmp_path):
    if kind == "gpt2" and not tt.gpt2_cached():
        pytest.skip("tiktoken's GPT-2 files are not cached here")
    if kind == "bpe":
        tok = tt.train_bpe(iter(["to be or not to be, that is it"] * 50), 280, tmp_path / "t.json")
    else:
        tok = tt.load(tt.Tokenizer[kind])
    prompt = "To be, or not <|endoftext|> to bé: ½"
    assert tok.decode(encode_prompt(tok, prompt)) == prompt
    with pytest.raises(ConfigError, match=rf"the {kind} tokenizer at character 1 \('\\udc80'"):
        encode_prompt(tok, "x\udc80y")


def test_a_prompt_that_does_not_survive_its_round_trip_is_refused():
    class Lowercasing(tt.ByteTokenizer):  # a tokenizer that normalizes text (none of ours does)
        name = "lowercasing"

        def encode(self, texts):
            return super().encode([t.lower() for t in texts])

    assert encode_prompt(Lowercasing(), "abc") == [97, 98, 99]
    with pytest.raises(ConfigError, match=r"differs from character 3 on \('Def' -> 'def'\)"):
        encode_prompt(Lowercasing(), "abcDef")


# --- samples during training (sample_interval) -----------------------------------------------


def _samples(caplog) -> dict[int, str]:
    """``step -> text`` of the samples a run wrote to its log."""
    out = {}
    for r in caplog.records:
        if r.getMessage().startswith("sample after step "):
            head, text = r.getMessage().split("\n", 1)
            out[int(head.split()[3])] = text
    return out


@pytest.mark.slow
def test_training_samples_are_the_run_models_continuation_of_a_fixed_prompt(
    cfg_tiny, tmp_path, caplog
):
    import logging

    from normlab.training.loop import train
    from normlab.training.validation import SAMPLE_PROMPT_TOKENS

    caplog.set_level(logging.INFO, logger="normlab")
    cfg = cfg_tiny("model.dropout=0.1", "sample_interval=4", "sample_tokens=12")
    train(cfg, tmp_path / "a")
    samples = _samples(caplog)
    assert sorted(samples) == [4, 6]  # every 4 steps, and at the end
    # the last one by hand: the run's final checkpoint, the first 16 validation tokens, seed 0
    run = load_run(tmp_path / "a", device="cpu")
    data = prepare(cfg.data)
    prompt = [int(i) for i in data.val[:SAMPLE_PROMPT_TOKENS]]
    g = torch.Generator().manual_seed(0)
    out = generate(run.model, torch.tensor([prompt]), 12, 0.8, 200, g, vocab_limit=256)
    assert samples[6] == run.tokenizer.decode(out[0].tolist())
    assert samples[6].startswith(run.tokenizer.decode(prompt))
    # sampling draws no global random number: with dropout on, the losses are those of a run
    # without samples
    train(cfg_tiny("model.dropout=0.1"), tmp_path / "b")
    a, b = ([json.loads(x).get("train/loss") for x in (tmp_path / d / "metrics.jsonl").open()]
            for d in ("a", "b"))  # fmt: skip
    assert a == b


def test_training_samples_go_to_a_wandb_table(cfg_tiny, tmp_path, monkeypatch):
    import wandb

    from normlab.training.loop import train

    logged = []

    class Recorder:
        id = "rec"
        summary: dict = {}

        def log(self, data, step=None):
            logged.append((step, data))

        def finish(self, *a, **k):
            pass

    monkeypatch.setattr(wandb, "init", lambda **kwargs: Recorder())
    train(cfg_tiny("logger=wandb", "sample_interval=3", "sample_tokens=5"), tmp_path)
    tables = [(step, d["samples"]) for step, d in logged if "samples" in d]
    assert [step for step, _ in tables] == [3, 6]
    last = tables[-1][1]
    assert isinstance(last, wandb.Table) and last.columns == ["step", "prompt", "text"]
    assert [row[0] for row in last.data] == [3, 6]  # the whole table, logged again each time
    assert all(row[2].startswith(row[1]) for row in last.data)


def test_a_tokenizer_that_cannot_load_costs_the_samples_not_the_run(
    cfg_tiny, tmp_path, monkeypatch, caplog
):
    from normlab.data.tokens import TokenData
    from normlab.training.loop import train

    def offline(self):
        raise DataError("the gpt2 tokenizer needs its files: offline")

    monkeypatch.setattr(TokenData, "load_tokenizer", offline)
    summary = train(cfg_tiny("sample_interval=2"), tmp_path)
    assert summary["status"] == "completed" and summary["steps_done"] == 6
    warned = [r.getMessage() for r in caplog.records if "no samples" in r.getMessage()]
    assert warned == ["no samples: the tokenizer cannot be loaded (the gpt2 tokenizer needs its "
                      "files: offline)"]  # fmt: skip


@pytest.mark.slow
def test_samples_of_a_compiled_norm_run_do_not_recompile_the_training_model(cfg_tiny, tmp_path):
    """A sample feeds a context that grows by one token per new token: 16 + 12 lengths, each a new
    graph of the compiled norms (``dynamic=False``), past torch's recompile limit (8), which
    ``build_run`` makes an error. Sampling runs the norms eagerly: the run completes and the
    samples are there."""
    from normlab.training.loop import train

    cfg = cfg_tiny("norm.impl=compiled", "sample_interval=3", "sample_tokens=12")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed", summary.get("error")
    assert summary["norm_impl"] == "compiled"


def _old_names(state: dict) -> dict:
    """A state dict as checkpoints had it before norms were named by position."""
    new = {"attn_in": "norm1", "mlp_in": "norm2", "attn_out": "norm1", "mlp_out": "norm2"}
    out = {}
    for k, v in state.items():
        parts = k.split(".")
        if parts[0] == "blocks" and parts[2] in new:
            parts[2] = new[parts[2]]
        elif parts[0] == "final":
            parts[0] = "norm_f"
        out[".".join(parts)] = v
    return out


def test_a_checkpoint_with_the_old_norm_names_samples_with_the_same_weights(
    tmp_path, cfg_tiny, one_thread
):
    run_dir = tmp_path / "run"
    model = write_run(run_dir, cfg_tiny("norm=rms", "norm.impl=torch"))
    ckpt = next((run_dir / CKPT_DIR).iterdir())
    state = torch.load(ckpt, weights_only=True)
    state["model"] = _old_names(state["model"])
    assert "blocks.0.norm1.weight" in state["model"] and "norm_f.weight" in state["model"]
    ckpt.unlink()
    save_checkpoint(run_dir / CKPT_DIR, state, keep=2)
    run = load_run(run_dir, "cpu")
    idx = torch.randint(0, 256, (1, CONTEXT))
    torch.testing.assert_close(run.model(idx)[0], model(idx)[0], rtol=0, atol=0)


def test_an_old_post_norm_checkpoint_with_a_final_norm_is_refused_in_one_line():
    from normlab.training.checkpoint import upgrade_model_state

    old = {"blocks.0.norm1.weight": torch.ones(4), "norm_f.weight": torch.ones(4)}
    with pytest.raises(ValueError, match="post-norm checkpoint has a final norm"):
        upgrade_model_state(old, "post")
    renamed = upgrade_model_state({"blocks.3.norm2.bias": torch.zeros(4)}, "post")
    assert list(renamed) == ["blocks.3.mlp_out.bias"]
    current = {"blocks.0.attn_in.weight": torch.ones(4)}
    assert upgrade_model_state(current, "pre") is current


def test_a_resume_whose_bpe_was_trained_again_on_a_changed_corpus_is_refused_changing_nothing(
    bpe_run, cfg_tiny
):
    """Resuming tokenizes as the run did: the same check as normlab-eval and normlab-sample, in
    train (issue 37, kind 6: 'checked wherever it is loaded again')."""
    from normlab.config import RunOptions
    from normlab.training.loop import train

    run_dir, corpus, summary, data = bpe_run
    shutil.rmtree(summary["data"]["cache"])
    corpus.write_text(corpus_lines(300, seed=3, words="other words entirely now".split()))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    cfg = cfg_tiny(
        "data=text_files",
        f"data.path={corpus}",
        f"data.cache_dir={data.cache_dir}",
        "data.tokenizer=bpe",
        "data.bpe_vocab_size=300",
        "data.val_fraction=0.2",
        "max_steps=4",
        "eval_interval=2",
    )
    with pytest.raises(DataError) as e:
        train(cfg, run_dir, RunOptions(resume="auto", force=True))  # force: max_steps differs
    assert f"not the {summary['data']['tokenizer_digest']} the run trained with" in str(e.value)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
