"""The fp16 grad scaler's start-up calibration: the steps it skips while it halves its initial
scale down are not instability, and do not end a short run as diverged; an overflow after
training began still does (issue 37, kind 15)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from normlab.compose import to_train_config
from normlab.config import Precision, PrecisionConfig
from normlab.training.loop import train
from normlab.training.metrics import Limits, MetricsBuffer
from normlab.training.precision import BACKOFF, calibration_skips_max, grad_scaler
from normlab.training.record import Progress, RunRecord

from ..conftest import TINY

INF = math.inf


@pytest.mark.parametrize(
    ("init_scale", "dtype", "expected"),
    [(2.0**16, "fp16", 16), (1024.0, "fp16", 10), (3.0, "fp16", 2), (1.0, "fp16", 0),
     (0.5, "fp16", 0), (INF, "fp16", 0), (2.0**16, "bf16", 0), (2.0**16, "fp32", 0)],
)  # fmt: skip
def test_calibration_is_at_most_the_halvings_of_the_initial_scale_down_to_1(
    init_scale, dtype, expected
):
    cfg = PrecisionConfig(dtype=Precision[dtype], init_scale=init_scale)
    assert calibration_skips_max(cfg) == expected
    scaler = grad_scaler(cfg, torch.device("cpu"))  # the scaler halves as the count assumes
    assert scaler.is_enabled() == (dtype == "fp16")
    assert not scaler.is_enabled() or scaler.get_backoff_factor() == BACKOFF


def _flushed(grads: list[float], calibration: int) -> MetricsBuffer:
    """A metrics buffer fed one step per gradient norm (loss 1.0), flushed."""
    metrics = MetricsBuffer(
        grad_accum=1,
        tokens_per_step=8,
        limits=Limits(scaler_enabled=True, scaler_calibration=calibration),
    )
    for step, grad in enumerate(grads, start=1):
        metrics.add(step, torch.tensor(1.0), torch.tensor(grad), lr=1e-3, step_time_ms=1.0)
    rows, diverged = metrics.flush()
    assert diverged is None and len(rows) == len(grads)
    return metrics


@pytest.mark.parametrize(
    ("grads", "calibration", "skipped", "at_start_up"),
    [([INF, INF, 1.0, 1.0], 16, 2, 2),
     ([INF, INF, 1.0, INF, INF, 1.0], 16, 4, 2),  # a skip after a step that trained: real
     ([1.0, INF, INF], 16, 2, 0),  # training began at step 1
     ([INF] * 5, 3, 5, 3),  # the scale reached 1: the rest is the model's overflow
     ([INF, INF], 0, 2, 0)],  # init_scale 1: no calibration
)  # fmt: skip
def test_only_the_skips_from_step_1_while_the_scale_halves_down_are_calibration(
    grads, calibration, skipped, at_start_up
):
    metrics = _flushed(grads, calibration)
    assert (metrics.skipped_steps, metrics.calibration_skips) == (skipped, at_start_up)


def test_a_resumed_run_goes_on_counting_the_calibration_it_was_in():
    first = _flushed([INF, INF], 16)
    resumed = MetricsBuffer(
        grad_accum=1,
        tokens_per_step=8,
        limits=Limits(scaler_enabled=True, scaler_calibration=16),
        skipped_steps=first.skipped_steps,
        calibration_skips=first.calibration_skips,
    )
    for step, grad in [(3, INF), (4, 1.0), (5, INF)]:
        resumed.add(step, torch.tensor(1.0), torch.tensor(grad), lr=1e-3, step_time_ms=1.0)
    resumed.flush()
    assert (resumed.skipped_steps, resumed.calibration_skips) == (4, 3)


@pytest.mark.parametrize(
    ("skipped", "calibration", "steps", "status"),
    [(3, 3, 4, "completed"),  # the 4-step run: only calibration skips
     (3, 0, 4, "diverged"),  # the same skips after training began: more than half
     (4, 2, 6, "completed"),  # 2 of the 4 steps after calibration: not more than half
     (5, 2, 6, "diverged"),  # 3 of those 4
     (4, 4, 4, "diverged")],  # every step skipped: the model never trained
)  # fmt: skip
def test_the_skipped_fraction_leaves_the_calibration_out(skipped, calibration, steps, status):
    progress = Progress(
        step=steps - 1, done=steps, train_time_s=0.0, val_loss=None, val_row={},
        wall_before=0.0, t_start=0.0,
    )  # fmt: skip
    record = RunRecord(progress=progress, summary={"status": "running"})
    metrics = SimpleNamespace(
        skipped_steps=skipped, calibration_skips=calibration, last_finite_loss=1.0
    )
    record.complete("max_steps", metrics, 0.5)
    assert record.status == status
    if status == "diverged" and skipped < steps:
        after = f" after its start-up calibration ({calibration} skips)" if calibration else ""
        assert record.summary["diverged_reason"] == (
            f"the fp16 grad scaler skipped {skipped - calibration} of {steps - calibration} "
            f"optimizer steps{after} (non-finite gradients; limit: max_skipped_fraction=0.5)"
        )


def test_a_4_step_fp16_hybrid_run_is_not_diverged_by_the_scalers_calibration(compose_cfg, tmp_path):
    """The issue's run: ``design=hybrid`` in fp16 for 4 steps, init scale 2^16. Its start-up skips
    were more than half of its steps, so it was labelled diverged; 12 steps completed."""
    cfg = to_train_config(compose_cfg([*TINY, "design=hybrid", "precision=fp16", "max_steps=4"]))
    summary = train(cfg, tmp_path)
    assert summary["calibration_skips"] >= 1  # the scaler did calibrate in this run
    assert summary["skipped_steps"] == summary["calibration_skips"] < 4
    assert summary["status"] == "completed", summary.get("diverged_reason")


def test_an_fp16_overflow_after_training_began_still_ends_the_run_as_diverged(
    compose_cfg, tmp_path, monkeypatch
):
    """From step 3 on every gradient overflows (the loss scale set to 3e38 before each step),
    after steps 1-2 trained at scale 1024: 4 skips of 6 steps, none of them calibration."""
    from normlab.training import step as training_step

    real_step = training_step.train_step

    def overflowing_from_step_3(run, step, lr, *args, **kwargs):
        if step + 1 >= 3:
            run.scaler.update(3e38)  # the scale a skip would have to halve 127 times
        return real_step(run, step, lr, *args, **kwargs)

    monkeypatch.setattr(training_step, "train_step", overflowing_from_step_3)
    overrides = [*TINY, "precision=fp16", "precision.init_scale=1024"]
    summary = train(to_train_config(compose_cfg(overrides)), tmp_path)
    assert (summary["skipped_steps"], summary["calibration_skips"]) == (4, 0)
    assert summary["status"] == "diverged" and summary["final_val_loss"] is None
    assert summary["diverged_reason"].startswith("the fp16 grad scaler skipped 4 of 6 optimizer")
