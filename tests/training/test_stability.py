"""Stability record of a run: the loss-spike rule, the largest pre-clip gradient norm."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from normlab.compose import to_train_config
from normlab.training.diagnostics import ActivationRecorder
from normlab.training.metrics import (
    NAMES,
    SPIKE_WINDOW,
    Limits,
    MetricsBuffer,
    SpikeCounter,
)
from normlab.training.setup import build_run
from normlab.training.step import train_step

from ..conftest import TINY


def smooth_curve(n: int = 1000, noise: float = 0.02, seed: int = 0) -> np.ndarray:
    """A decaying training-loss curve with Gaussian noise (nats/token)."""
    t = np.arange(n)
    rng = np.random.default_rng(seed)
    return 1.5 + 3.0 * np.exp(-t / 200) + noise * rng.standard_normal(n)


def count(losses, counter: SpikeCounter | None = None) -> SpikeCounter:
    c = counter or SpikeCounter()
    for step, loss in enumerate(losses, start=1):
        c.update(step, float(loss))
    return c


@pytest.mark.parametrize("seed", range(5))
def test_a_smooth_decaying_noisy_curve_counts_no_spike(seed):
    assert count(smooth_curve(seed=seed)).count == 0


def test_an_injected_spike_lasting_several_steps_is_counted_exactly_once():
    losses = smooth_curve()
    losses[600:604] += 0.5  # 25 noise sigmas, for 4 steps: one excursion
    c = count(losses)
    assert c.count == 1 and c.steps == [601]  # 1-based steps: index 600 is step 601


def test_two_excursions_count_twice_and_the_cumulative_count_is_logged_per_step():
    losses = smooth_curve()
    losses[300] += 1.0
    losses[700:702] += 1.0
    buf = MetricsBuffer(grad_accum=1, tokens_per_step=1, limits=Limits(vocab_size=256))
    for step, loss in enumerate(losses, start=1):
        buf.add(step, torch.tensor(float(loss)), torch.tensor(float(step % 7)), 1e-3, 1.0)
    rows, diverged = buf.flush()
    assert diverged is None
    spikes = [r[NAMES["spikes"]] for r in rows]
    assert spikes[299] == 0 and spikes[300] == 1 and spikes[699] == 1 and spikes[700] == 2
    assert spikes[-1] == 2 and buf.spikes.steps == [301, 701]
    assert buf.max_grad_norm == 6.0  # the largest finite gradient norm fed (step % 7)


def test_the_first_window_of_steps_is_never_judged():
    losses = smooth_curve()
    losses[SPIKE_WINDOW - 1] += 5.0  # the last step without a full window before it
    assert count(losses).count == 0
    losses[SPIKE_WINDOW] += 5.0  # the first step judged
    assert count(losses).steps == [SPIKE_WINDOW + 1]


def test_the_rule_is_median_plus_k_scaled_mads_of_the_window_before():
    c = SpikeCounter(window=5, k=2.0)
    for step, loss in enumerate([1.0, 2.0, 3.0, 4.0, 10.0], start=1):
        assert not c.update(step, loss)
    # window 1, 2, 3, 4, 10: median 3, |x - 3| = 2, 1, 0, 1, 7 -> MAD 1; line 3 + 2 * 1.4826
    assert c.threshold() == pytest.approx(3 + 2 * 1.4826)
    assert not c.update(6, 3 + 2 * 1.4826 - 1e-9)
    assert c.update(7, 100.0) and c.count == 1


def test_a_non_finite_loss_is_neither_judged_nor_kept():
    c = count(smooth_curve(200))
    before = list(c.recent)
    assert not c.update(201, math.nan) and not c.update(202, math.inf)
    assert list(c.recent) == before and c.count == 0


def test_a_counter_resumed_from_its_state_counts_as_the_uninterrupted_one():
    losses = smooth_curve()
    losses[400:403] += 1.0
    losses[800] += 1.0
    whole = count(losses)
    first = count(losses[:401])  # stopped inside the first excursion
    resumed = SpikeCounter.from_state(first.state())
    for step, loss in enumerate(losses[401:], start=402):
        resumed.update(step, float(loss))
    assert (resumed.count, resumed.steps) == (whole.count, whole.steps) == (2, [401, 801])
    assert SpikeCounter.from_state(None).count == 0  # a checkpoint written before the rule


@pytest.mark.parametrize(
    "kwargs",
    [{"window": 2}, {"window": 10.0}, {"window": True}, {"k": 0}, {"k": -1.0}, {"k": math.nan}],
)
def test_the_rule_parameters_are_validated(kwargs):
    with pytest.raises(ValueError, match="spike (window|k)="):
        SpikeCounter(**kwargs)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_global_and_block_grad_norms_are_taken_before_clipping_and_after_unscaling(
    compose_cfg, precision
):
    """Clipping to 1e-3 and an fp16 loss scale of 1024: a norm taken after clipping would read
    1e-3, one taken before unscaling 1024 times too much. Both must equal the norm of the plain
    gradient of the step's loss (a power-of-2 scale is exact, so fp16 agrees to rounding)."""
    overrides = [*TINY, "optim.grad_clip=1e-3", f"precision={precision}"]
    run = build_run(to_train_config(compose_cfg([*overrides, "precision.init_scale=1024"])))
    ref = copy.deepcopy(run.model)
    x, y = run.sampler.train_batch(0, 0)
    with run.autocast():
        _, loss = ref(x, y)
    loss.backward()
    hand = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in ref.parameters()))
    blocks = [
        math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in b.parameters()))
        for b in ref.blocks
    ]
    diag = ActivationRecorder()
    _, grad_norm = train_step(run, 0, 1e-3, diag)
    assert hand > 1.0  # far above the clip: clipping changed the gradients
    assert grad_norm.item() == pytest.approx(hand, rel=1e-4)
    for i, expected in enumerate(blocks):
        assert diag.stats[f"diag/block{i}/grad_norm"] == pytest.approx(expected, rel=1e-4)


def test_a_run_without_diag_interval_registers_no_hook(compose_cfg, tmp_path, monkeypatch):
    """The off path is the plain step: a run without ``diag_interval`` never enters the recorder's
    hooks (they would raise here) and no module holds a hook at any step."""
    from torch import nn

    from normlab.training.loop import train

    def refuse(*args, **kwargs):
        raise AssertionError("a hook was registered on a run without diag_interval")

    monkeypatch.setattr(ActivationRecorder, "hooks", refuse)
    monkeypatch.setattr(nn.Module, "register_forward_hook", refuse)
    monkeypatch.setattr(nn.Module, "register_forward_pre_hook", refuse)
    cfg = to_train_config(compose_cfg([*TINY, "max_steps=3"]))
    assert cfg.diag_interval is None
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["loss_spikes"] == 0
