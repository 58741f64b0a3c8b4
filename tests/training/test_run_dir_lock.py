"""One process owns a run dir (``training/lock.py``): a second writer is refused naming the pid
that holds it and changes nothing; a lock left by a dead process is taken over; the lock is gone
after the run; only rank 0 takes it. And a run that fails before its record (building the model)
still says ``failed`` in ``summary.json``, while a refusal writes nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.config import ConfigError
from normlab.training import distributed, setup
from normlab.training.lock import LOCK_FILE, own_run_dir, release, take
from normlab.training.loop import RunOptions, train

from ..conftest import TINY

FAST = [*TINY, "max_steps=2", "eval_interval=2", "eval_batches=1", "norm.impl=torch"]


def files(run_dir: Path) -> dict[str, bytes]:
    """Every file below ``run_dir`` (relative path -> bytes), the lock file left out."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def test_a_second_train_in_a_held_run_dir_is_refused_naming_the_pid_and_changes_nothing(
    tmp_path, train_main, one_thread
):
    run = tmp_path / "run"
    args = [*FAST, f"hydra.run.dir={run}", "resume=auto"]
    code, _, err = train_main(args, tmp_path)
    assert code == 0, err
    assert not (run / LOCK_FILE).exists(), "the lock is released at the end of the run"
    (run / "summary.json").unlink()  # as while the first `train` still runs: no summary yet
    before = files(run)
    fd = take(run)  # this process holds it, as that first `train` would
    try:
        code, _, err = train_main(args, tmp_path)  # unlocked, it would resume and write
    finally:
        release(run, fd)
    assert code == 2
    assert err.splitlines() == [
        f"normlab: error: run dir {run} is in use by pid {os.getpid()} on {socket.gethostname()} "
        f"since {err.split(' since ')[1].split(' ')[0]} (it holds {LOCK_FILE}): one process "
        "writes a run dir at a time; wait for it to end, or use another run dir"
    ]
    assert files(run) == before, "nothing of the refused invocation is written"
    assert not (run / LOCK_FILE).exists()


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_warning(
    tmp_path, train_main, one_thread
):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    pid = int(dead.stdout)
    run = tmp_path / "run"
    run.mkdir()
    stale = {"pid": pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+0000"}
    (run / LOCK_FILE).write_text(json.dumps(stale) + "\n")
    code, _, err = train_main([*FAST, f"hydra.run.dir={run}"], tmp_path)
    assert code == 0, err
    assert f"taking over {run / LOCK_FILE} left by pid {pid}" in (run / "train.log").read_text()
    assert not (run / LOCK_FILE).exists()
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_only_rank_0_takes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    with own_run_dir(tmp_path):
        assert not (tmp_path / LOCK_FILE).exists()
    monkeypatch.setattr(distributed, "is_main", lambda: True)
    with own_run_dir(tmp_path):
        holder = json.loads((tmp_path / LOCK_FILE).read_text())
        assert holder["pid"] > 0 and holder["host"] == socket.gethostname()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_file_that_is_a_link_is_refused_and_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).symlink_to(target)
    with pytest.raises(ConfigError, match=r"\.normlab\.lock is a link"):
        take(run)
    assert target.read_text() == "keep\n"


def test_a_failure_before_the_run_record_leaves_a_failed_summary(
    cfg_tiny, tmp_path, monkeypatch, one_thread
):
    def no_memory(cfg, device):
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 TB")

    monkeypatch.setattr(setup, "build_model", no_memory)
    with pytest.raises(RuntimeError, match="not enough memory"):
        train(cfg_tiny("norm.impl=torch"), tmp_path / "run", RunOptions())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("RuntimeError: Default")
    assert "no_memory" in summary["traceback"] and summary["config"]["seed"] == 0
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["summary.json"]


def test_a_refusal_before_the_run_record_still_writes_nothing(cfg_tiny, tmp_path, one_thread):
    with pytest.raises(ConfigError, match=r"model.vocab_size=100 is smaller"):
        train(cfg_tiny("norm.impl=torch", "model.vocab_size=100"), tmp_path / "run", RunOptions())
    assert not (tmp_path / "run").exists()
