"""The warm-up/stable/decay schedule and its cool-down branches (``training/anneal.py``): each
annealed point is a fresh run of its budget, bit for bit, and the main run never notices one
(CPU, fp32, one thread, dropout on so the RNG states matter)."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from normlab.config import ConfigError, OptimConfig, TrainConfig
from normlab.training import anneal
from normlab.training import checkpoint as ckpt
from normlab.training import step as training_step
from normlab.training.loop import RunOptions, train
from normlab.training.step import lr_at

from ..conftest import ONE_THREAD, TINY, run_cli
from .test_resume import cli, losses

#: A 40-step wsd run with a 4-step warm-up: budget 0.5 is T=20 steps, branching after D=16.
WSD = [
    "max_steps=40",
    "eval_interval=10",
    "model.dropout=0.1",
    "norm.impl=torch",
    "optim.warmup_steps=4",
    "optim.schedule=wsd",
]
HALF = "optim.anneal_at=[0.5]"


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One intra-op thread for every test here (see conftest.one_thread)."""


@pytest.fixture(scope="module")
def uninterrupted(cfg_tiny, tmp_path_factory) -> tuple[Path, dict]:
    """``(run dir, summary)`` of the 40-step wsd run with budget 0.5, never interrupted (the
    session runs on one thread: ``conftest._one_intra_op_thread``)."""
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    return run_dir, train(cfg_tiny(*WSD, HALF), run_dir, RunOptions(ckpt_interval=0))


def points(run_dir: Path, timing: bool = False) -> list[dict]:
    """The lines of ``annealed.jsonl``; without ``branch_time_s`` unless ``timing``."""
    rows = [json.loads(line) for line in (run_dir / anneal.ANNEALED).read_text().splitlines()]
    return rows if timing else [{k: v for k, v in r.items() if k != "branch_time_s"} for r in rows]


# --- the schedule ---------------------------------------------------------------------------------


def test_the_cosine_schedule_is_unchanged_by_the_wsd_keys():
    def old(step, n, c):  # lr_at before optim.schedule existed
        if step < c.warmup_steps:
            return c.lr * (step + 1) / c.warmup_steps
        progress = (step - c.warmup_steps) / max(1, n - c.warmup_steps)
        return c.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (c.lr - c.min_lr)

    cfg = OptimConfig(
        lr=6e-4, min_lr=6e-5, warmup_steps=7, decay_fraction=0.5, decay_shape="linear"
    )
    assert [lr_at(s, 50, cfg) for s in range(60)] == [old(s, 50, cfg) for s in range(60)]


@pytest.mark.parametrize(
    ("shape", "at_16", "at_17"),
    [
        ("sqrt", 0.1 + 0.9 * 0.5, 0.1 + 0.9 * (1 - math.sqrt(0.5))),
        ("linear", 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.5),
        ("cosine", 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2, 0.1 + 0.9 * 0.5),
    ],
)
def test_wsd_warms_up_holds_lr_then_decays_in_its_shape_to_min_lr_at_the_last_step(
    shape, at_16, at_17
):
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=2, schedule="wsd", decay_shape=shape)
    lrs = [lr_at(s, 20, cfg) for s in range(20)]  # D = 20 - round(0.2 * 20) = 16
    assert lrs[:16] == [0.5] + [1.0] * 15
    assert lrs[16] == pytest.approx(at_16) and lrs[17] == pytest.approx(at_17)  # p = 1/4, 2/4
    assert lrs[19] == pytest.approx(0.1) and lrs == sorted(lrs[:2]) + sorted(lrs[2:], reverse=True)


def test_a_branch_takes_the_learning_rates_of_a_fresh_run_of_its_budget():
    cfg = OptimConfig(warmup_steps=4, schedule="wsd", anneal_at=[0.25, 0.5, 0.75])
    fresh = OptimConfig(warmup_steps=4, schedule="wsd")
    assert cfg.budgets(40) == [(10, 8), (20, 16), (30, 24)]
    for budget, start in cfg.budgets(40):
        main_before = [lr_at(s, 40, cfg) for s in range(start)]
        assert main_before == [lr_at(s, budget, fresh) for s in range(start)]  # shared steps
        branch = [lr_at(s, budget, cfg) for s in range(start, budget)]
        assert branch == [lr_at(s, budget, fresh) for s in range(start, budget)]
        assert branch[-1] == fresh.min_lr


# --- branches -------------------------------------------------------------------------------------


def test_an_annealed_point_is_a_fresh_run_of_its_budget_bit_for_bit(
    cfg_tiny, tmp_path, uninterrupted
):
    main, summary = uninterrupted
    fresh = train(cfg_tiny(*WSD, "max_steps=20"), tmp_path / "fresh", RunOptions(ckpt_interval=0))
    (half, full) = points(main, timing=True)
    assert half["budget_steps"] == 20 and half["branch_from"] == 16 and not half["diverged"]
    assert half["val/loss"] == fresh["final_val_loss"] and half["val/bpb"] == fresh["final_val_bpb"]
    assert half["branch_time_s"] > 0 and full["branch_time_s"] is None
    assert (full["budget_steps"], full["branch_from"]) == (40, None)
    assert full["val/loss"] == summary["final_val_loss"]
    assert summary["annealed"] == [
        {"budget_steps": 20, "val_loss": half["val/loss"], "val_bpb": half["val/bpb"]},
        {"budget_steps": 40, "val_loss": full["val/loss"], "val_bpb": full["val/bpb"]},
    ]
    assert fresh["annealed"] == [
        {"budget_steps": 20, "val_loss": half["val/loss"], "val_bpb": half["val/bpb"]}
    ]


def test_branches_leave_the_main_run_and_its_checkpoint_bit_identical(cfg_tiny, tmp_path):
    opts = RunOptions(ckpt_interval=16, ckpt_keep=3)  # one at D=16, saved after the branch
    two = "optim.anneal_at=[0.25,0.5]"  # T=10 from D=8, T=20 from D=16
    with_branches = train(cfg_tiny(*WSD, two), tmp_path / "branched", opts)
    without = train(cfg_tiny(*WSD), tmp_path / "plain", opts)
    assert losses(tmp_path / "branched") == losses(tmp_path / "plain")
    assert with_branches["final_val_loss"] == without["final_val_loss"]
    assert len(with_branches["step_times_ms"]) == len(without["step_times_ms"])  # not timed
    assert [p["budget_steps"] for p in points(tmp_path / "branched")] == [10, 20, 40]
    # the repo's safe loader (digest, weights_only) reads the checkpoint of step 16
    saved = {}
    for name in ("branched", "plain"):
        path = dict(ckpt.list_checkpoints(tmp_path / name / "checkpoints"))[16]
        saved[name] = ckpt.load_checkpoint(path)
    a, b = saved["branched"], saved["plain"]
    assert a["step"] == b["step"] == 16
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    states = zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True)
    moments = [(s[k], t[k]) for s, t in states for k in ("step", "exp_avg", "exp_avg_sq")]
    assert all(torch.equal(x, y) for x, y in moments)
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def test_a_branch_that_diverges_is_recorded_as_diverged_and_the_run_goes_on(
    cfg_tiny, tmp_path, monkeypatch
):
    def nan_loss(run, step, lr):
        loss, grad_norm = training_step.train_step(run, step, lr)
        return loss * float("nan"), grad_norm

    fake = SimpleNamespace(lr_at=lr_at, train_step=nan_loss)
    monkeypatch.setattr(anneal, "training_step", fake)  # the branch's steps only
    summary = train(cfg_tiny(*WSD, HALF), tmp_path / "main", RunOptions(ckpt_interval=0))
    plain = train(cfg_tiny(*WSD), tmp_path / "plain", RunOptions(ckpt_interval=0))
    assert summary["status"] == "completed"
    assert summary["final_val_loss"] == plain["final_val_loss"]
    half, _ = points(tmp_path / "main")
    assert half["diverged"] and half["val/loss"] is None and half["val/bpb"] is None
    assert summary["annealed"][0] == {"budget_steps": 20, "val_loss": None, "val_bpb": None}


def test_annealed_jsonl_is_never_written_through_a_link(cfg_tiny, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / anneal.ANNEALED).symlink_to(outside)
    train(cfg_tiny(*WSD, "max_steps=20"), run_dir, RunOptions(ckpt_interval=0))
    assert outside.read_text() == "keep\n"
    assert not (run_dir / anneal.ANNEALED).is_symlink()
    assert [p["budget_steps"] for p in points(run_dir)] == [20]


# --- interruptions and resume ---------------------------------------------------------------------


def test_a_sigterm_during_a_branch_abandons_it_and_resume_runs_it_first(
    cfg_tiny, tmp_path, uninterrupted
):
    cfg, (full, _) = cfg_tiny(*WSD, HALF), uninterrupted
    calls = []

    def signal_in_branch(run, step, lr):
        calls.append(step)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
        return training_step.train_step(run, step, lr)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(
            anneal, "training_step", SimpleNamespace(lr_at=lr_at, train_step=signal_in_branch)
        )
        cut = train(cfg, tmp_path / "cut", RunOptions(ckpt_interval=0))
    assert cut["status"] == "interrupted" and cut["interrupted_at_step"] == 16
    assert calls == [16, 17] and not (tmp_path / "cut" / anneal.ANNEALED).exists()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "cut" / "checkpoints")] == [16]
    done = train(cfg, tmp_path / "cut", RunOptions(ckpt_interval=0, resume="auto"))
    assert done["status"] == "completed" and done["resumed"]["from_step"] == 16
    assert points(tmp_path / "cut") == points(full)
    assert losses(tmp_path / "cut") == losses(full)


#: The real ``train`` CLI, killed (SIGKILL) inside its first cool-down branch, after the branch's
#: steps and before its point is written.
KILL_IN_BRANCH = """
import os, signal
import normlab.training.anneal as anneal
anneal.eval_row = lambda run: os.kill(os.getpid(), signal.SIGKILL)
from normlab.commands.train import main
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill", "ckpt_interval", "resumed_from", "redone"),
    [
        ("in_branch", 5, 15, True),  # killed in the branch from 16: redone from step 15
        ("after_branch", 5, 15, True),  # killed at step 18: the point of step 16 is dropped
        ("after_branch", 8, 16, False),  # the checkpoint of step 16 follows its branch: kept
    ],
)
def test_a_run_killed_during_or_after_a_branch_resumes_to_the_uninterrupted_points(
    tmp_path, train_main, uninterrupted, kill, ckpt_interval, resumed_from, redone
):
    full, run_dir = uninterrupted[0], tmp_path / "killed"
    args = [*TINY, *WSD, HALF, "threads=1", f"ckpt_interval={ckpt_interval}", "resume=auto"]
    args.append(f"hydra.run.dir={run_dir}")
    if kill == "in_branch":
        r = run_cli(args, tmp_path, code=KILL_IN_BRANCH, env=ONE_THREAD)
        assert not (run_dir / anneal.ANNEALED).exists()
    else:
        r = cli(args, tmp_path, signal_at=("SIGKILL", 18))
        assert [p["budget_steps"] for p in points(run_dir)] == [20]
    assert r.returncode == -signal.SIGKILL, r.stderr
    before = points(run_dir, timing=True) if kill == "after_branch" else None
    assert train_main(args, tmp_path)[0] == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed"]["from_step"] == resumed_from
    assert points(run_dir) == points(full)
    assert losses(run_dir) == losses(full)
    if before is not None:  # a kept point is the same line, time included; a redone one is not
        assert (points(run_dir, timing=True)[0] == before[0]) is not redone


# --- refusals -------------------------------------------------------------------------------------

#: ``(optim keys, top-level keys, the line)``: on top of 40 wsd steps with a 4-step warm-up.
REFUSED = [
    (
        {"schedule": "cosine", "anneal_at": [0.5]},
        {},
        "optim.anneal_at=[0.5] is not allowed: needs optim.schedule=wsd (a cool-down branch "
        "leaves a stable phase; got optim.schedule=cosine)",
    ),
    (
        {"anneal_at": [0.5, 1.0]},
        {},
        "optim.anneal_at=[0.5, 1.0] is not allowed: must be distinct fractions of max_steps in "
        "(0, 1), increasing, e.g. [0.25,0.5,0.75]",
    ),
    (
        {"anneal_at": [0.5, 0.25]},
        {},
        "optim.anneal_at=[0.5, 0.25] is not allowed: must be distinct fractions of max_steps in "
        "(0, 1), increasing, e.g. [0.25,0.5,0.75]",
    ),
    (
        {"anneal_at": [0.5]},
        {"max_time_s": 60.0},
        "optim.anneal_at=[0.5] is not allowed: needs max_time_s=null (a time budget cuts the run "
        "short; branches are budgets in steps)",
    ),
    (
        {"anneal_at": [0.1]},
        {},
        "optim.anneal_at=[0.1] is not allowed: 0.1 x max_steps=40 is a budget of T=4 steps "
        "branching after step D=3; each needs 2 <= T < max_steps, its own T, a cool-down of at "
        "least one step (D < T), and optim.warmup_steps=4 <= D <= 32 (the main run's decay "
        "start)",
    ),
    (
        {"anneal_at": [0.5, 0.51]},
        {},
        "optim.anneal_at=[0.5, 0.51] is not allowed: 0.51 x max_steps=40 is a budget of T=20 "
        "steps branching after step D=16; each needs 2 <= T < max_steps, its own T, a cool-down "
        "of at least one step (D < T), and optim.warmup_steps=4 <= D <= 32 (the main run's decay "
        "start)",
    ),
    (
        {"decay": False, "anneal_at": [0.5]},
        {},
        "optim.anneal_at=[0.5] is not allowed: needs optim.decay=true (without a decay a branch "
        "is the main run itself)",
    ),
    (
        {"decay_fraction": 0.0},
        {},
        "optim.decay_fraction=0.0 is not allowed: must be in (0, 1] (of a budget's steps)",
    ),
    (
        {"warmup_steps": 33},
        {},
        "optim.decay_fraction=0.2 is not allowed: with max_steps=40 the decay would start after "
        "step 32, inside the warm-up (optim.warmup_steps=33): lower one of them",
    ),
]


@pytest.mark.parametrize(("optim", "top", "line"), REFUSED, ids=[str(o) for o, _, _ in REFUSED])
def test_a_bad_wsd_or_anneal_value_is_refused_in_one_line(optim, top, line):
    keys = {"schedule": "wsd", "warmup_steps": 4, **optim}
    with pytest.raises(ConfigError) as e:
        TrainConfig(max_steps=40, optim=OptimConfig(**keys), **top)
    assert str(e.value) == line


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ([HALF], REFUSED[0][2]),  # OptimConfig
        ([*WSD, HALF, "max_time_s=60"], REFUSED[3][2]),  # TrainConfig, against max_steps
        (
            [*WSD, "optim.anneal_at=[half]"],  # typed before Hydra
            "optim.anneal_at=['half']: Value 'half' of type 'str' could not be converted to "
            "Float: could not convert string to float: 'half'",
        ),
        (
            [*WSD, "optim.decay_shape=sqr"],
            "optim.decay_shape=sqr is not allowed (allowed: sqrt, linear, cosine); did you mean "
            "optim.decay_shape=sqrt?",
        ),
    ],
    ids=["cosine", "max_time_s", "float", "shape"],
)
def test_train_refuses_a_bad_wsd_or_anneal_value_with_exit_2_before_training(
    tmp_path, train_main, overrides, line
):
    code, _, err = train_main([*TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert code == 2 and err.splitlines() == [f"normlab: error: {line}"]
    assert not (tmp_path / "run").exists()
