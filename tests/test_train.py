"""The training loop in-process: schedule, timing, files written, divergence."""

from __future__ import annotations

import json
import math

import pytest
import torch

from normlab.compose import to_train_config
from normlab.config import OptimConfig, RunOptions
from normlab.training.loop import train
from normlab.training.metrics import NAMES
from normlab.training.step import lr_at
from normlab.training.tracking import StepTimer

from .conftest import TINY, run_cli


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, 110, cfg) == pytest.approx(0.1)
    assert lr_at(9, 110, cfg) == pytest.approx(1.0)
    assert lr_at(60, 110, cfg) == pytest.approx(0.1 + 0.5 * 0.9)  # half-way: cos(pi/2) = 0
    assert lr_at(110, 110, cfg) == pytest.approx(0.1)
    assert lr_at(50, 110, OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, decay=False)) == 1.0


def test_step_timer_leaves_warmup_steps_out_of_its_summary():
    timer = StepTimer(torch.device("cpu"), warmup_steps=2)
    timer.times_ms = [1000.0, 900.0, 10.0, 20.0, 30.0, 40.0]
    s = timer.summary(tokens_per_step=1000, flops_per_step=1e9, peak_tflops=1.0)
    assert s["step_time_ms_median"] == pytest.approx(25.0)
    assert s["step_time_ms_p90"] == pytest.approx(37.0)
    assert s["tokens_per_s"] == pytest.approx(1000 / 0.025)
    assert s["mfu"] == pytest.approx(1e9 / 0.025 / 1e12)


def test_a_tiny_run_writes_metrics_and_summary(compose_cfg, tmp_path):
    cfg = to_train_config(compose_cfg([*TINY, "logger=none", "norm=rms", "norm.impl=reference"]))
    summary = train(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert set(NAMES.values()) == {  # the namespaced names, written once in metrics.py
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "perf/step_time_ms",
        "perf/tokens_per_s",
        "val/loss",
    }
    for key in set(NAMES.values()) - {"val/loss"}:
        assert all(math.isfinite(r[key]) for r in rows), key
    assert [r["step"] for r in rows if "val/loss" in r] == [3, 6]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["status"] == "completed" and summary["steps_completed"] == 6
    assert summary["final_val_loss"] == rows[-1]["val/loss"]
    assert summary["norm_impl"] == "reference" and summary["norm"]["eps"] == 1e-5
    assert (
        summary["params"] > 0 and summary["step_time_ms_p90"] >= summary["step_time_ms_median"] > 0
    )
    assert len(summary["step_times_ms"]) == 5  # 6 steps minus 1 warm-up step
    assert summary["config"]["norm"]["kind"] == "rms"


def test_gradient_accumulation_consumes_every_micro_batch(compose_cfg, tmp_path):
    cfg = to_train_config(compose_cfg([*TINY, "logger=none", "optim.grad_accum=3", "max_steps=2"]))
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed"
    assert summary["tokens_per_s"] == pytest.approx(
        4 * 3 * 32 / (summary["step_time_ms_median"] / 1e3)
    )


def test_bf16_autocast_run_trains_on_cpu(compose_cfg, tmp_path):
    summary = train(
        to_train_config(compose_cfg([*TINY, "logger=none", "precision=bf16"])), tmp_path
    )
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])


def test_a_non_finite_loss_ends_the_run_as_diverged_with_the_last_finite_loss(
    compose_cfg, tmp_path
):
    cfg = to_train_config(
        compose_cfg(
            [
                *TINY,
                "logger=none",
                "optim.lr=1e30",
                "optim.min_lr=0",
                "optim.warmup_steps=0",
                "optim.grad_clip=0",
            ]
        )
    )
    summary = train(cfg, tmp_path)
    assert summary["status"] == "diverged"
    assert 1 < summary["diverged_at_step"] <= 6
    assert math.isfinite(summary["last_finite_loss"]) and summary["final_val_loss"] is None


def test_an_unknown_optimizer_is_refused_with_the_allowed_names(tmp_path):
    from normlab.config import ConfigError

    with pytest.raises(ConfigError, match=r"optim\.name='lion' is not allowed: allowed: adamw$"):
        OptimConfig(name="lion")
    r = run_cli([*TINY, "optim.name=lion"], cwd=tmp_path)  # through the real CLI
    assert r.returncode != 0 and not list(tmp_path.rglob("metrics.jsonl")), "nothing trained"
    assert "Invalid value 'lion', expected one of [adamw]" in r.stderr


def _tiny(compose_cfg, *overrides):
    return to_train_config(compose_cfg([*TINY, "logger=none", *overrides]))


def test_the_host_reads_metrics_once_per_log_interval(compose_cfg, tmp_path, monkeypatch):
    """Every read of a tensor's value by normlab code (item, tolist, float, int, bool) is counted
    with the step it happened in: none inside a log_interval window, one at its end, one more for
    an evaluation. (torch's own CPU-side reads, e.g. of step counters, are not normlab's.)"""
    import sys

    from normlab.training import step as training_step

    here = {"step": 0}
    syncs: list[int] = []
    real_step = training_step.train_step

    def step_and_note(run, step, lr, *args, **kwargs):
        here["step"] = step + 1
        return real_step(run, step, lr, *args, **kwargs)

    def counting(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if "/normlab/" in sys._getframe(1).f_code.co_filename.replace("\\", "/"):
                syncs.append(here["step"])
            return real(self, *args, **kwargs)

        return read

    monkeypatch.setattr(training_step, "train_step", step_and_note)
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    cfg = _tiny(compose_cfg, "max_steps=9", "log_interval=3", "eval_interval=9")
    summary = train(cfg, tmp_path)
    monkeypatch.undo()
    assert summary["status"] == "completed"
    # before step 1: build_run's checks (the norm preflight); then steps 3 and 6: one read of the
    # 3 buffered steps each; step 9: that, and the evaluation's one
    assert [s for s in syncs if s] == [3, 6, 9, 9] and not any(syncs[: syncs.index(3)])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6, 9]


def test_divergence_between_log_steps_is_found_at_its_exact_step(
    compose_cfg, tmp_path, monkeypatch
):
    from normlab.training import step as training_step

    real_step = training_step.train_step
    losses = []

    def nan_at_step_6(run, step, lr, *args, **kwargs):
        loss, grad = real_step(run, step, lr, *args, **kwargs)
        losses.append(float(loss))
        return (loss * float("nan") if step + 1 == 6 else loss), grad

    monkeypatch.setattr(training_step, "train_step", nan_at_step_6)
    cfg = _tiny(compose_cfg, "max_steps=12", "log_interval=4", "eval_interval=12")
    summary = train(cfg, tmp_path, RunOptions(ckpt_interval=0))
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 6
    assert summary["diverged_reason"] == "non-finite loss nan"
    assert summary["last_finite_loss"] == losses[4]  # step 5's loss (one micro-batch)
    assert len(losses) == 8, "noticed at the next sync, step 8"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 6] and rows[1]["train/loss"] is None
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_adamw_is_fused_on_cpu(compose_cfg):
    from normlab.training.setup import build_run

    run = build_run(_tiny(compose_cfg))
    assert run.optimizer.defaults["fused"] is True
