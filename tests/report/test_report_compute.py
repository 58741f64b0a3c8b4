"""The compute-equivalent verdict (normlab.report.stats) on synthetic curves of known shift, and
the conversion of margins between nats and compute with the end slope."""

from __future__ import annotations

import math

import numpy as np
import pytest

from normlab.report.stats import (
    compute_for_nats,
    compute_multiplier,
    end_slope,
    nats_for_compute,
    step_multiplier,
    steps_to_reach,
)

STEPS = np.arange(0, 601, 10, dtype=float)


def curve(steps, shift=1.0, noise=0.0, rng=None):
    """A power-law learning curve L(s) = 1.6 + 4 (1 + s/shift/40)^-0.5, stretched in steps by
    ``shift`` (a variant that needs ``shift`` times the steps), plus evaluation noise."""
    loss = 1.6 + 4.0 * (1 + steps / shift / 40.0) ** -0.5
    if noise:
        loss = loss + rng.normal(0, noise, size=loss.shape)
    return list(steps), list(loss)


def test_steps_to_reach_interpolates_between_evaluations():
    assert steps_to_reach([0, 10, 20], [3.0, 2.0, 1.0], 1.5) == pytest.approx(15.0)
    assert math.isnan(steps_to_reach([0, 10, 20], [3.0, 2.0, 1.0], 0.5))
    # a noisy uptick after the crossing does not move it: the curve is its running minimum
    assert steps_to_reach([0, 10, 20, 30], [3.0, 1.0, 2.5, 0.9], 1.5) == pytest.approx(7.5)


def test_a_variant_delayed_by_5pc_and_2pc_faster_per_step_is_recovered_within_its_ci():
    rng = np.random.default_rng(0)
    mults = []
    for _ in range(6):
        base = curve(STEPS, 1.0, 0.002, rng)
        var = curve(STEPS, 1.05, 0.002, rng)
        mults.append(step_multiplier(base, var))
    r = compute_multiplier(mults, speed=1.02)
    truth = 1.02 / 1.05
    assert r["ci"][0] < truth < r["ci"][1]
    assert r["k"] == pytest.approx(truth, rel=0.01)
    assert r["ci"][1] < 1.0  # the 3% loss of effective compute is detected at this noise


def test_identical_variants_give_a_ci_containing_one():
    rng = np.random.default_rng(1)
    mults = [
        step_multiplier(curve(STEPS, 1, 0.003, rng), curve(STEPS, 1, 0.003, rng)) for _ in range(5)
    ]
    r = compute_multiplier(mults, speed=[1.0] * 5)
    assert r["ci"][0] < 1.0 < r["ci"][1]


def test_a_better_variant_gets_a_multiplier_above_one_without_extrapolating():
    m = step_multiplier(curve(STEPS, 1.0), curve(STEPS, 0.9))
    assert m == pytest.approx(1 / 0.9, rel=2e-3)


def test_a_speed_interval_widens_the_compute_interval():
    mults = [0.99, 1.0, 1.01, 1.0]
    narrow = compute_multiplier(mults, speed=1.02)
    wide = compute_multiplier(mults, speed=1.02, speed_ci=(0.97, 1.07))
    assert wide["ci"][0] < narrow["ci"][0] and wide["ci"][1] > narrow["ci"][1]
    assert wide["k"] == pytest.approx(narrow["k"])


def test_margins_convert_between_nats_and_compute_with_the_end_slope():
    steps, loss = curve(STEPS)
    slope = end_slope(steps, loss)
    # L = 1.6 + 4 (1 + s/40)^-0.5 has -dL/dln s = 2 (s/40)(1 + s/40)^-1.5 ~ 0.48 at s ~ 575
    s = 575.0
    assert slope == pytest.approx(2 * (s / 40) * (1 + s / 40) ** -1.5, rel=0.05)
    assert nats_for_compute(0.01, slope) == pytest.approx(slope * math.log(1.01))
    assert compute_for_nats(nats_for_compute(0.03, slope), slope) == pytest.approx(0.03)
