"""normlab.report.stats: the verdict that states equivalence and difference apart, and the TOST
power / seeds-needed planning, against simulation and the large-n normal formula."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from normlab.commands.report import main
from normlab.report import build_report, paired_difference, seeds_needed, tost_power
from normlab.report.stats import holm, std_upper


def test_verdict_states_equivalence_and_a_detectable_difference_when_both_hold():
    # [0.004, 0.005, 0.006]: mean 0.005, s 0.001, se 0.000577; 95% half-width 4.302653 * se =
    # 0.002484 -> [+0.0025, +0.0075] excludes 0; 90% half-width 2.919986 * se = 0.001686,
    # within 0.02
    r = paired_difference([0.004, 0.005, 0.006], margin=0.02)
    assert r["equivalent"] and r["detectable"]
    assert r["verdict"] == (
        "equivalent within 0.02 nats; the difference is detectable: 95% CI [+0.0025, +0.0075] "
        "excludes 0"
    )


def test_verdict_equivalent_only_when_the_ci_holds_zero():
    r = paired_difference([-0.01, 0.0, 0.01], margin=0.05)
    assert r["equivalent"] and not r["detectable"]
    assert r["verdict"] == "equivalent within 0.05 nats"


def simulated_power(n: int, std: float, margin: float, delta: float, draws: int = 200_000) -> float:
    """Fraction of simulated normal samples whose 90% t interval lies within +-margin."""
    x = np.random.default_rng(0).normal(delta, std, (draws, n))
    mean, s = x.mean(1), x.std(1, ddof=1)
    half = stats.t.ppf(0.95, n - 1) * s / math.sqrt(n)
    return float(np.mean((mean - half > -margin) & (mean + half < margin)))


@pytest.mark.parametrize(
    ("n", "std", "margin", "delta"),
    [(3, 0.01, 0.02, 0.0), (5, 1.0, 1.0, 0.3), (10, 1.0, 0.8, 0.0), (2, 0.005, 0.02, 0.0)],
)
def test_tost_power_matches_simulation(n, std, margin, delta):
    sim = simulated_power(n, std, margin, delta)
    se = math.sqrt(sim * (1 - sim) / 200_000)
    assert tost_power(n, std, margin, 0.05, delta) == pytest.approx(sim, abs=5 * se + 1e-3)


def test_seeds_needed_is_the_smallest_n_reaching_80_percent_power():
    n = seeds_needed(1.0, 0.5)
    assert tost_power(n, 1.0, 0.5) >= 0.8 > tost_power(n - 1, 1.0, 0.5)
    # large n: n ~ (z_0.95 + z_0.90)^2 * std^2 / margin^2 = (1.6449 + 1.2816)^2 * 4 = 34.26,
    # a little more with t quantiles
    assert 34 <= n <= 38
    assert seeds_needed(0.01, 0.02) == 4  # power(3) = 0.558 (also simulated above)
    assert tost_power(3, 0.01, 0.02) < 0.8 <= tost_power(4, 0.01, 0.02)


def test_seeds_needed_is_none_when_no_n_suffices():
    assert seeds_needed(0.01, 0.02, delta=0.02) is None  # a true difference at the margin
    assert seeds_needed(float("nan"), 0.02) is None  # n < 2: no std
    assert math.isnan(tost_power(1, 0.01, 0.02))
    assert tost_power(3, 0.0, 0.02) == 1.0 and tost_power(3, 0.0, 0.02, delta=0.03) == 0.0


def test_holm_adjusted_p_values_equal_a_hand_computation():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # capped at 1
    got = holm([0.02, math.nan, 0.04])  # no test (n < 2): nan, and not one of the m = 2
    assert got[0] == pytest.approx(0.04) and math.isnan(got[1]) and got[2] == pytest.approx(0.04)
    # 17 variants against one baseline, the best at p = 0.012: Holm's first threshold is
    # 0.05 / 17 = 0.0029, so its adjusted p, 17 x 0.012 = 0.204, rejects nothing
    family = holm([0.012] + [0.5] * 16)
    assert family[0] == pytest.approx(0.204) and min(family) > 0.05
    assert holm([0.03]) == [0.03] and holm([]) == []


def test_std_upper_bound_by_hand_and_the_seeds_it_needs(tmp_path):
    """(n − 1)s²/σ² is χ²_{n−1}; with 2 degrees of freedom its alpha quantile is −2 ln(1 − alpha),
    so at n = 3 the 95% upper bound is s · sqrt(2 / (−2 ln 0.95)) = 4.415 s."""
    assert std_upper(0.01, 3) == pytest.approx(0.01 * math.sqrt(2 / (-2 * math.log(0.95))))
    assert std_upper(1.0, 2) == pytest.approx(1 / math.sqrt(stats.chi2.ppf(0.05, 1)))  # 15.9
    assert math.isnan(std_upper(1.0, 1)) and math.isnan(std_upper(math.nan, 5))
    from .test_report import make_sweep  # rms − layer = [0.01, 0.02, 0.03]: std 0.01, n = 3

    rep = build_report(make_sweep(tmp_path))
    upper = 0.01 * math.sqrt(2 / (-2 * math.log(0.95)))
    power = rep.comparisons[0]["power"]
    assert power["std_upper"] == pytest.approx(upper)
    assert power["seeds_needed_upper"] == seeds_needed(upper, 0.02) > power["seeds_needed"]
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert (
        f"Planned at the std's 95% upper confidence bound (0.0442, 4.42x the estimate), ±0.02 "
        f"nats needs {power['seeds_needed_upper']} seeds." in md
    )
