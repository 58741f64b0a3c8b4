"""Equal wall-clock: ``max_time_s`` (training-step seconds) ends a run early, evaluated and
completed; ``perf/train_time_s`` is its clock on every row; the schedule stays over max_steps."""

from __future__ import annotations

import json

import pytest

from normlab.commands.train import already_completed
from normlab.config import OptimConfig
from normlab.training import checkpoint as ckpt
from normlab.training.loop import RunOptions, train
from normlab.training.resume import config_hash
from normlab.training.step import lr_at
from normlab.training.tracking import StepTimer, variant_label


@pytest.fixture
def steps_of_100_ms(monkeypatch):
    """Every training step takes 100 ms on the step timer (the time budget's clock)."""

    def stop(self, record=True):
        if record:
            self.times_ms.append(100.0)
        return 100.0

    monkeypatch.setattr(StepTimer, "stop", stop)


def rows_of(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_budget_ends_the_run_evaluated_checkpointed_and_completed(
    cfg_tiny, tmp_path, steps_of_100_ms
):
    cfg = cfg_tiny("max_steps=20", "eval_interval=10", "max_time_s=0.35")
    summary = train(cfg, tmp_path, RunOptions(ckpt_interval=0))
    # 0.1, 0.2, 0.3, 0.4 s: the budget is spent by step 4, which is the last
    assert summary["status"] == "completed" and summary["stopped_by"] == "max_time_s"
    assert summary["steps_done"] == summary["steps_completed"] == 4
    assert summary["train_time_s"] == pytest.approx(0.4)
    rows = rows_of(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["perf/train_time_s"] for r in rows] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 4]  # the final evaluation
    assert summary["final_val_loss"] == rows[-1]["val/loss"]
    assert summary["final_val_bpb"] == rows[-1]["val/bpb"]
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [4]
    # the schedule is the one over max_steps=20: cut short, not compressed
    optim = OptimConfig(**{**summary["config"]["optim"], "name": "adamw"})
    assert [r["train/lr"] for r in rows[1:]] == [lr_at(s, 20, optim) for s in range(4)]


def test_a_tiny_real_budget_stops_after_the_first_step(cfg_tiny, tmp_path):
    summary = train(cfg_tiny("max_steps=50", "max_time_s=1e-9"), tmp_path)
    assert summary["status"] == "completed" and summary["stopped_by"] == "max_time_s"
    assert summary["steps_done"] == 1 and summary["train_time_s"] > 1e-9
    assert [r["step"] for r in rows_of(tmp_path) if "val/loss" in r] == [0, 1]


def test_a_larger_budget_continues_a_run_its_budget_stopped(cfg_tiny, tmp_path, steps_of_100_ms):
    first = train(cfg_tiny("max_steps=20", "max_time_s=0.25"), tmp_path)
    assert first["steps_done"] == 3
    summary = train(
        cfg_tiny("max_steps=20", "max_time_s=0.55"),
        tmp_path,
        RunOptions(resume="auto"),
    )
    assert summary["resumed"]["from_step"] == 3 and summary["steps_done"] == 6
    assert summary["stopped_by"] == "max_time_s"
    rows = rows_of(tmp_path)
    assert [r["step"] for r in rows] == list(range(7))  # step 0 once: not logged again on resume
    assert [r["perf/train_time_s"] for r in rows] == pytest.approx([i / 10 for i in range(7)])


@pytest.mark.parametrize(
    "done, max_time_s, expected",
    [
        ({"status": "completed", "steps_completed": 20}, None, True),
        ({"status": "completed", "steps_completed": 4, "stopped_by": "max_time_s"}, None, False),
        (
            {
                "status": "completed",
                "steps_completed": 4,
                "stopped_by": "max_time_s",
                "train_time_s": 0.4,
            },
            0.35,
            True,
        ),
        (
            {
                "status": "completed",
                "steps_completed": 4,
                "stopped_by": "max_time_s",
                "train_time_s": 0.4,
            },
            0.8,
            False,
        ),
        ({"status": "interrupted", "steps_completed": 4}, 0.1, False),
    ],
)
def test_what_counts_as_already_completed(cfg_tiny, done, max_time_s, expected):
    full = cfg_tiny.cli("max_steps=20")
    full.max_time_s = max_time_s
    assert already_completed(done, full) is expected


def test_the_budget_evaluation_and_samples_are_not_in_the_resume_hash(cfg_tiny):
    from normlab.config import to_plain

    base = config_hash(to_plain(cfg_tiny()))
    for override in ("max_time_s=60", "eval_data=[kjv]", "sample_interval=5", "sample_tokens=9"):
        assert config_hash(to_plain(cfg_tiny(override))) == base, override
    assert config_hash(to_plain(cfg_tiny("max_steps=7"))) != base  # the schedule is


def test_the_progress_bar_names_the_variant_and_the_swept_values(cfg_tiny):
    from normlab.commands.overrides import job_swept, swept_keys

    args = ["-m", "norm=layer,rms", "seed=0,1", "optim.lr=1e-3,3e-3", "model=tiny"]
    assert swept_keys(args) == ["norm", "seed", "optim.lr"]
    assert swept_keys(args[1:]) == []  # a single run sweeps nothing
    job = job_swept(["norm=rms", "seed=1", "optim.lr=3e-3", "model=tiny"], swept_keys(args))
    assert job == ("norm=rms", "seed=1", "optim.lr=3e-3")
    cfg = cfg_tiny("norm=rms", "norm.impl=reference", "seed=1")
    assert variant_label(cfg, job) == "rms-reference-pre-fp32 optim.lr=3e-3 seed=1"
    assert variant_label(cfg) == "rms-reference-pre-fp32 seed=1"
    eps = cfg_tiny("norm=rms", "norm.impl=reference", "norm.eps=1e-6")
    assert variant_label(eps, ("norm.eps=1e-6", "norm.kind=rms")) == (
        "rms-reference-pre-fp32 norm.eps=1e-6 seed=0"
    )  # a swept key the design does not show is named
