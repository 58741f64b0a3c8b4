"""Checkpoints and resume: a run killed at any step continues bit for bit (CPU, fp32)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import torch

from normlab.compose import to_train_config
from normlab.config import ConfigError
from normlab.training import checkpoint as ckpt
from normlab.training import resume, tracking
from normlab.training.loop import RunOptions, train

from ..conftest import ONE_THREAD, TINY, run_cli

#: TINY with dropout on (so the torch RNG state matters), evaluation every 4 steps.
RUN = [*TINY, "model.dropout=0.1", "eval_interval=4"]

#: The real `train` CLI, with one fault: signal NORMLAB_TEST_SIGNAL is sent to the process itself
#: right after metrics.jsonl gets the row of step NORMLAB_TEST_SIGNAL_AT (a deterministic kill
#: point).
DRIVER = """
import os, signal, sys
import normlab.training.tracking as tracking
at = int(os.environ["NORMLAB_TEST_SIGNAL_AT"])
sig = getattr(signal, os.environ["NORMLAB_TEST_SIGNAL"])
log = tracking.MetricsLogger.log
def log_then_signal(self, row):
    log(self, row)
    if row["step"] == at:
        os.kill(os.getpid(), sig)
tracking.MetricsLogger.log = log_then_signal
from normlab.commands.train import main
main()
"""


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One intra-op thread for every test here (see conftest.one_thread)."""


def cli(
    args: list[str], cwd: Path, signal_at: tuple[str, int] | None = None
) -> subprocess.CompletedProcess:
    if not signal_at:
        return run_cli(args, cwd, env=ONE_THREAD)
    sig, at = signal_at
    env = {**ONE_THREAD, "NORMLAB_TEST_SIGNAL": sig, "NORMLAB_TEST_SIGNAL_AT": str(at)}
    return run_cli(args, cwd, code=DRIVER, env=env)


def losses(run_dir: Path) -> list[tuple[int, dict]]:
    """``(step, row without timings)`` for every row of metrics.jsonl, in file order."""
    timing = {"perf/step_time_ms", "perf/tokens_per_s", "perf/train_time_s"}
    return [
        (r["step"], {k: v for k, v in r.items() if k not in timing})
        for r in tracking.read_metrics(run_dir / "metrics.jsonl")
    ]


def wandb_ids(run_dir: Path) -> list[str]:
    return sorted(p.name.split("-")[-1] for p in (run_dir / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_a_run_killed_with_sigkill_and_resumed_logs_the_losses_of_an_uninterrupted_run(tmp_path):
    args = [*RUN, "max_steps=16", "ckpt_interval=5"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    r = cli([*args, f"hydra.run.dir={full}"], tmp_path)
    assert r.returncode == 0, r.stderr

    # logger is not in the config hash: the killed run logs to wandb, the uninterrupted one not
    r = cli([*args, "logger=wandb", f"hydra.run.dir={killed}"], tmp_path, signal_at=("SIGKILL", 13))
    assert r.returncode == -signal.SIGKILL
    assert [s for s, _ in losses(killed)] == list(range(0, 14))
    assert [s for s, _ in ckpt.list_checkpoints(killed / "checkpoints")] == [10, 5]

    r = cli([f"resume={killed}"], tmp_path)  # the run's own overrides are re-applied
    assert r.returncode == 0, r.stderr
    assert losses(killed) == losses(full)  # every step once, every value bit-identical
    assert [s for s, _ in losses(full)] == list(range(0, 17))
    summary = tracking.json.loads((killed / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed"]["from_step"] == 10
    assert (
        summary["final_val_loss"]
        == tracking.json.loads((full / "summary.json").read_text())["final_val_loss"]
    )
    ids = wandb_ids(killed)
    assert len(ids) == 2 and ids[0] == ids[1], "the resumed run must continue the same wandb run"
    assert "resume=" not in (killed / ".hydra" / "overrides.yaml").read_text(), (
        "the first invocation's record stays"
    )


@pytest.mark.slow
def test_sigterm_saves_a_loadable_checkpoint_exits_nonzero_and_a_requeue_finishes_the_run(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *RUN,
        "logger=none",
        "max_steps=10",
        "ckpt_interval=0",
        f"hydra.run.dir={run_dir}",
        "resume=auto",
    ]
    r = cli(args, tmp_path, signal_at=("SIGTERM", 7))
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert "SIGTERM after step 7: checkpoint saved" in r.stderr and "Traceback" not in r.stderr
    loaded = ckpt.load_latest(run_dir / "checkpoints")
    assert (
        loaded.skipped == [] and loaded.state["step"] == 7 and loaded.state["sampler"]["step"] == 7
    )
    assert {
        "model",
        "optimizer",
        "scaler",
        "rng",
        "config_hash",
        "wandb_run_id",
    } <= loaded.state.keys()
    assert set(loaded.state["rng"]) == {"python", "numpy", "torch", "cuda"}
    summary = tracking.json.loads((run_dir / "summary.json").read_text())
    assert (
        summary["status"] == "interrupted"
        and summary["signal"] == "SIGTERM"
        and summary["steps_completed"] == 7
    )

    r = cli(args, tmp_path)  # a requeued job runs the same command again
    assert r.returncode == 0, r.stderr
    assert [s for s, _ in losses(run_dir)] == list(range(0, 11))
    assert tracking.json.loads((run_dir / "summary.json").read_text())["resumed"]["from_step"] == 7


# --- in-process: resume, refusals, damaged checkpoints
# ---------------------------------------------


@pytest.fixture
def tiny(compose_cfg):
    def _cfg(*overrides: str):
        return to_train_config(compose_cfg([*RUN, "logger=none", *overrides]))

    return _cfg


def test_sigint_stops_after_a_checkpoint_and_resume_continues_bit_identically(
    tiny, tmp_path, monkeypatch, signal_after_step
):
    cfg = tiny("max_steps=8")
    train(cfg, tmp_path / "full", RunOptions(ckpt_interval=0))
    # the handler before the run: Python's default_int_handler, or SIG_IGN when the test process
    # was started in the background by a non-interactive shell (nohup ... &)
    before = signal.getsignal(signal.SIGINT)
    signal_after_step(signal.SIGINT, 3)
    summary = train(cfg, tmp_path / "cut", RunOptions(ckpt_interval=0))
    assert (
        summary["status"] == "interrupted"
        and summary["signal"] == "SIGINT"
        and summary["steps_completed"] == 3
    )
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    monkeypatch.undo()
    summary = train(cfg, tmp_path / "cut", RunOptions(ckpt_interval=0, resume="auto"))
    assert summary["status"] == "completed" and summary["resumed"]["from_step"] == 3
    assert losses(tmp_path / "cut") == losses(tmp_path / "full")
    # the evaluation of step 0 is logged once, by the first process (a resumed run starts later)
    assert [s for s, _ in losses(tmp_path / "cut")] == list(range(9))


def test_a_truncated_checkpoint_is_named_and_the_previous_one_is_used(tiny, tmp_path, caplog):
    cfg = tiny("max_steps=6")
    train(cfg, tmp_path / "full", RunOptions(ckpt_interval=2))
    run = tmp_path / "run"
    train(cfg, run, RunOptions(ckpt_interval=2))
    (s6, newest), (s4, _) = ckpt.list_checkpoints(run / "checkpoints")
    assert (s6, s4) == (6, 4)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    loaded = ckpt.load_latest(run / "checkpoints")
    assert loaded.state["step"] == 4 and len(loaded.skipped) == 1
    assert (
        loaded.skipped[0].startswith(newest.name) and "truncated or corrupted" in loaded.skipped[0]
    )
    summary = train(cfg, run, RunOptions(ckpt_interval=2, resume="auto"))
    assert f"checkpoint skipped: {newest.name}" in caplog.text
    assert summary["status"] == "completed" and summary["resumed"]["from_step"] == 4
    assert losses(run) == losses(tmp_path / "full")
    assert [s for s, _ in ckpt.list_checkpoints(run / "checkpoints")] == [
        6,
        4,
    ]  # the damaged file is replaced


def test_resume_auto_over_only_damaged_checkpoints_refuses_and_changes_nothing(tiny, tmp_path):
    """Every checkpoint unreadable: a new run in place would rewrite metrics.jsonl from step 0
    and delete the checkpoints. resume=auto refuses in one line, before any file is touched."""
    cfg = tiny("max_steps=4")
    run = tmp_path / "run"
    train(cfg, run, RunOptions(ckpt_interval=2))
    for _, path in ckpt.list_checkpoints(run / "checkpoints"):
        path.write_bytes(path.read_bytes()[:100])
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    for mode in ("auto", "required"):
        with pytest.raises(ConfigError, match=r"2 damaged .*move .* aside") as e:
            train(cfg, run, RunOptions(ckpt_interval=2, resume=mode))
        assert "\n" not in str(e.value)
        assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


def test_a_flipped_byte_is_detected_though_torch_load_would_accept_it(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, {"step": 1, "w": torch.zeros(1000)}, keep=2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "SHA-256 does not match" in ckpt.verify(path)
    with pytest.raises(ValueError, match="truncated or corrupted"):
        ckpt.load_checkpoint(path)


def test_saves_are_atomic_keep_the_newest_k_and_clear_leftovers(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, {"step": step}, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [3, 2]

    def torch_save_dies_halfway(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", torch_save_dies_halfway)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path, {"step": 4}, keep=2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for _, p in ckpt.list_checkpoints(tmp_path)
    )
    (tmp_path / ".step-00000004.tmp999").write_bytes(b"left by a kill during a save")
    assert ckpt.load_latest(tmp_path).state["step"] == 3
    ckpt.save_checkpoint(tmp_path, {"step": 4}, keep=2)
    assert sorted(p.name[:13] for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]


def test_every_rng_state_round_trips(tmp_path):
    import random

    import numpy as np

    path = ckpt.save_checkpoint(tmp_path, {"step": 1, "rng": resume.rng_state()}, keep=1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    resume.restore_rng(ckpt.load_checkpoint(path)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_resuming_with_another_config_is_refused_with_the_keys_unless_forced(tiny, tmp_path):
    train(tiny("max_steps=4"), tmp_path, RunOptions(ckpt_interval=2))
    changed = tiny(
        "max_steps=6", "optim.lr=1e-3", "progress=true", "logger=none"
    )  # progress may differ
    with pytest.raises(
        ConfigError,
        match=r"cannot resume from step-00000004-\w+\.pt: the config differs in max_steps: 4 -> 6; "
        r"optim.lr: 0.0006 -> 0.001 \(force=true",
    ):
        train(changed, tmp_path, RunOptions(resume="auto"))
    summary = train(changed, tmp_path, RunOptions(resume="auto", force=True))
    assert summary["status"] == "completed" and summary["resumed"]["forced_config_diff"] == [
        "max_steps: 4 -> 6",
        "optim.lr: 0.0006 -> 0.001",
    ]


def test_a_checkpoint_of_another_model_shape_is_refused_even_when_forced(tiny, tmp_path):
    train(tiny("max_steps=2"), tmp_path, RunOptions())
    with pytest.raises(
        ConfigError,
        match=r"another shape: blocks\.0\.attn\.proj\.bias: \(128,\) in the checkpoint, \(64,\) "
        r"now; .* \(and \d+ more\)$",
    ):
        train(
            tiny("max_steps=2", "model.d_model=64"), tmp_path, RunOptions(resume="auto", force=True)
        )


def test_a_new_run_never_overwrites_checkpoints_and_required_resume_needs_one(tiny, tmp_path):
    cfg = tiny("max_steps=2")
    with pytest.raises(ConfigError, match="no valid checkpoint to resume from"):
        train(cfg, tmp_path, RunOptions(resume="required"))
    assert not (tmp_path / "metrics.jsonl").exists(), (
        "an input error must stop before anything is written"
    )
    train(cfg, tmp_path, RunOptions())
    with pytest.raises(ConfigError, match="already holds checkpoints: add resume=auto"):
        train(cfg, tmp_path, RunOptions())


def test_a_key_added_after_the_checkpoint_resumes_at_its_default_and_differs_otherwise():
    # A checkpoint written before norm.depth_scale existed: resuming it with the key at its
    # default (false, the old behaviour) is no config difference; with the key on, it is one.
    from normlab.config import TrainConfig, to_plain
    from normlab.training.resume import config_diff

    current = to_plain(TrainConfig())
    saved = to_plain(TrainConfig())
    del saved["norm"]["depth_scale"]
    assert config_diff(saved, current) == []
    current["norm"]["depth_scale"] = True
    assert config_diff(saved, current) == ["norm.depth_scale: '<absent>' -> True"]
    current["norm"]["depth_scale"] = False
    current["optim"]["lr"] = 1.0
    assert [d.split(":")[0] for d in config_diff(saved, current)] == ["optim.lr"]
