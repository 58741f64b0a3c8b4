"""Faults found by trying public bug reports (issue 15), each through the real ``train`` CLI:
relative paths under ``hydra.job.chdir=true`` (hydra#2414), run dirs whose names hold ``=``, the
first invocation's ``.hydra/`` record kept by ``resume=auto``, and a wandb server that never
answers. (A multirun job's own dir saying what happened, hydra#3215: tests/test_faults.py.)
Also the override helpers those fixes rest on: Hydra's sweep order and its quoting."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the oracle, tests only
from hydra.core.override_parser.overrides_parser import OverridesParser

from normlab.commands.overrides import as_override, expand, quote, value_of
from normlab.training import tracking
from normlab.training.loop import RunOptions, train

from ..conftest import REPO, TINY

RUN = [*TINY, "max_steps=4", "eval_interval=2", "ckpt_interval=0"]


@pytest.fixture
def cli(train_main, signal_after_step) -> Callable[..., subprocess.CompletedProcess]:
    """``cli(args, cwd, sigterm_at=0)``: the real ``train`` main() in this process (exit status,
    stdout, stderr as a ``CompletedProcess``); ``sigterm_at=N`` sends this process SIGTERM right
    after step N's metrics row (0: never; step 0 is the initial evaluation's row), for that call
    only. train's handler turns it into a checkpoint and exit status 143, as in a process of its
    own."""

    def run(args: list[str], cwd: Path, sigterm_at: int = 0) -> subprocess.CompletedProcess:
        signal_after_step(signal.SIGTERM, sigterm_at or None)
        code, out, err = train_main(args, cwd)
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


# --- the override helpers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        ["norm=layer,rms", "seed=0,1,2", "model=tiny"],
        ["seed=range(3)", "+a=1,2", "norm=rms", "seed=5,6"],  # a key given again keeps its slot
        ["optim.lr=choice(1e-3,2e-3)", "~logger", "data.path='a=b,c'"],
    ],
)
def test_expand_gives_hydras_basic_sweeper_jobs_in_its_order(overrides):
    parsed = OverridesParser.create().parse_overrides(overrides)
    want = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    assert expand(overrides) == want


def test_normlab_prepare_expands_with_the_public_parser_only():
    source = (REPO / "src" / "normlab" / "commands" / "prepare.py").read_text()
    assert (
        "hydra._internal" not in source
        and "from normlab.commands.overrides import expand" in source
    )


@pytest.mark.parametrize(
    ("path", "quoted"),
    [
        ("ckpt/epoch=3-step=100", True),
        ("a b,c", True),
        ("it's", True),
        ("end\\", False),
        ("a/b", False),
    ],
)
def test_a_path_survives_hydras_grammar_quoted_when_it_must_be(path, quoted):
    override = as_override("hydra.run.dir", path)
    assert OverridesParser.create().parse_override(override).value() == path
    assert value_of([override], "hydra.run.dir") == path
    assert override != f"hydra.run.dir={path}" if quoted else override == f"hydra.run.dir={path}"
    assert OverridesParser.create().parse_override(f"k={quote(path)}").value() == path


# --- through the CLI -----------------------------------------------------------------------------


@pytest.mark.slow
def test_relative_paths_are_the_launch_dirs_under_hydra_job_chdir(tmp_path, cli):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):  # text_files holds out whole files: several are needed
        (corpus / f"doc{i}.txt").write_text(
            " ".join(f"word{(i * 7 + j) % 23}" for j in range(2000))
        )
    args = ["data=text_files", "data.path=corpus", "data.cache_dir=cache", "data.token_dir=tokens"]
    run = tmp_path / "run"
    r = cli([*RUN, *args, "hydra.job.chdir=true", f"hydra.run.dir={run}"], tmp_path)
    assert r.returncode == 0, r.stderr  # before: "data.path=corpus does not exist"
    data = summary(run)["config"]["data"]
    assert (data["path"], data["cache_dir"], data["token_dir"]) == (
        str(corpus),
        str(tmp_path / "cache"),
        str(tmp_path / "tokens"),
    )
    assert (tmp_path / "tokens" / "meta.json").is_file() and not (run / "tokens").exists()
    # resume= relative too, resolved where train is started, not in the run dir it changes into
    r = cli(["resume=run", "max_steps=4"], tmp_path)
    assert r.returncode == 0 and "already completed 4 of max_steps=4" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_run_dir_whose_name_holds_equals_signs_resumes_by_path(tmp_path, cli):
    run = tmp_path / "ckpt" / "epoch=3-step=100"
    r = cli([*RUN, as_override("hydra.run.dir", str(run))], tmp_path, sigterm_at=2)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert summary(run)["status"] == "interrupted"
    r = cli([f"resume={run}"], tmp_path)  # typed as a user types it: unquoted
    assert r.returncode == 0, r.stderr  # before: Hydra's "mismatched input '='"
    s = summary(run)
    assert s["status"] == "completed" and s["resumed"]["from_step"] == 2
    assert [row["step"] for row in tracking.read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_resume_auto_in_a_given_run_dir_keeps_the_first_invocations_record(tmp_path, cli):
    run = tmp_path / "ckpt" / "epoch=1"  # given quoted, as Hydra's grammar needs it
    first = [*RUN, f"hydra.run.dir='{run}'", "resume=auto"]
    r = cli(first, tmp_path, sigterm_at=2)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    record = {p.name: (p.stat().st_mtime_ns, p.read_text()) for p in (run / ".hydra").iterdir()}
    assert "- resume=auto" in record["overrides.yaml"][1]
    r = cli([*first, "progress=true", "ckpt_keep=3"], tmp_path)  # a requeue, with other run keys
    assert r.returncode == 0, r.stderr
    assert summary(run)["resumed"]["from_step"] == 2
    after = {p.name: (p.stat().st_mtime_ns, p.read_text()) for p in (run / ".hydra").iterdir()}
    assert after == record and "ckpt_keep" not in after["overrides.yaml"][1]


def test_the_wandb_init_timeout_is_the_configured_one(cfg_tiny, tmp_path, monkeypatch):
    import wandb

    seen = []
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.append(kw["settings"]) or None)
    train(
        cfg_tiny("logger=wandb", "logger.init_timeout_s=7", "max_steps=1"), tmp_path, RunOptions()
    )
    assert [s.init_timeout for s in seen] == [7.0]
    with pytest.raises(
        ValueError, match=r"^logger.init_timeout_s=0.0 is not allowed: must be > 0$"
    ):
        cfg_tiny("logger.init_timeout_s=0")


@pytest.mark.slow
def test_an_online_wandb_whose_server_never_answers_gives_up_after_init_timeout_s(
    cfg_tiny, tmp_path, monkeypatch, caplog, one_thread
):
    server = socket.socket()  # accepts connections (the kernel's backlog), never answers
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    cfg = cfg_tiny("logger=wandb", "logger.mode=online", "logger.init_timeout_s=3", "max_steps=2")
    t0 = time.perf_counter()
    try:
        result = train(cfg, tmp_path, RunOptions())
    finally:
        server.close()
    elapsed = time.perf_counter() - t0
    assert result["status"] == "completed"
    assert elapsed < 40, f"{elapsed:.0f} s: wandb's own default waits 90 s"
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("wandb could not start ("), warnings


@pytest.mark.slow
def test_a_sweep_continued_in_its_dir_keeps_each_jobs_first_record(tmp_path, cli):
    sweep = tmp_path / "sweep"
    first = ["-m", "norm=layer,rms", *RUN, f"hydra.sweep.dir={sweep}", "resume=auto"]
    r = cli(first, tmp_path, sigterm_at=2)  # job 0 is stopped after step 2; so is the sweep
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    (job0,) = sweep.glob("0_*")
    record = {p.name: p.read_bytes() for p in (job0 / ".hydra").iterdir()}
    r = cli([*first, "ckpt_keep=3"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert summary(job0)["resumed"]["from_step"] == 2 and summary(job0)["status"] == "completed"
    assert {p.name: p.read_bytes() for p in (job0 / ".hydra").iterdir()} == record
    (job1,) = sweep.glob("1_*")
    assert b"ckpt_keep=3" in (job1 / ".hydra" / "overrides.yaml").read_bytes()  # its first record
