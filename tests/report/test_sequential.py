"""The anytime-valid verdict (``report/sequential.py``): Lai's confidence sequence is the set its
mixture martingale leaves below 1/alpha, it keeps its coverage however often it is looked at,
and "add seeds until the fixed-n TOST passes" does not.

``python3 -m tests.report.test_sequential`` prints the simulation's table (4,000 studies a cell,
a look after every pair from 3 to 60)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from normlab.report import sequential
from normlab.report.sequential import MIXTURE_C, half_width, looks, sequential_verdict
from normlab.report.stats import seeds_needed

STUDIES, MAX_PAIRS, FIRST_LOOK = 4000, 60, 3


def mixture_martingale(x: np.ndarray, mu: float, c: float = MIXTURE_C) -> float:
    """Lai's (1976) scale-invariant mixture likelihood ratio at ``mu``, written out:
    sqrt(c / (n + c)) (1 - S^2 / ((n + c) Q))^(-n/2), S = sum(x - mu), Q = sum((x - mu)^2)."""
    n, s, q = len(x), float((x - mu).sum()), float(((x - mu) ** 2).sum())
    return math.sqrt(c / (n + c)) * (1 - s * s / ((n + c) * q)) ** (-n / 2)


def simulate(
    sd: float, delta: float, margin: float, alpha: float = 0.05, seed: int = 0, c: float = MIXTURE_C
) -> dict:
    """STUDIES studies of MAX_PAIRS normal differences (mean ``delta``, std ``sd``), looked at
    after every pair from FIRST_LOOK: how often each rule ever declares equivalence, and the pairs
    it stops at (MAX_PAIRS when it never does)."""
    x = np.random.default_rng(seed).normal(delta, sd, size=(STUDIES, MAX_PAIRS))
    n = np.arange(1, MAX_PAIRS + 1)
    mean = np.cumsum(x, 1) / n
    ss = np.maximum(np.cumsum(x * x, 1) - n * mean**2, 0.0)
    w = half_width(n, ss, alpha, c)
    lo, hi = np.maximum.accumulate(mean - w, 1), np.minimum.accumulate(mean + w, 1)
    t = np.r_[np.inf, stats.t.ppf(1 - alpha, n[1:] - 1)]  # the fixed-n TOST's 1-2 alpha CI
    se = np.sqrt(ss / np.maximum(n - 1, 1) / n)
    rules = {"sequence": (lo > -margin) & (hi < margin)}
    with np.errstate(invalid="ignore"):  # n = 1: inf * 0, never a look
        rules["tost"] = (mean - t * se > -margin) & (mean + t * se < margin)
    out = {"miscovered": float(((lo > delta) | (hi < delta)).any(1).mean())}
    for name, equivalent in rules.items():
        hit = equivalent & (n >= FIRST_LOOK)
        ever = hit.any(1)
        out[name] = float(ever.mean())
        out[f"{name}_pairs"] = float(np.where(ever, hit.argmax(1) + 1, MAX_PAIRS).mean())
    return out


def test_the_half_width_is_where_the_mixture_martingale_reaches_one_over_alpha():
    x = np.random.default_rng(3).normal(0.001, 0.004, size=12)
    ss = float(((x - x.mean()) ** 2).sum())
    w = half_width(len(x), ss, 0.05)
    for mu in (x.mean() - w, x.mean() + w):
        assert mixture_martingale(x, mu) == pytest.approx(1 / 0.05, rel=1e-9)
    assert mixture_martingale(x, x.mean()) < 20 and mixture_martingale(x, x.mean() + 1.01 * w) > 20


def test_the_sequence_is_the_whole_line_until_the_pairs_can_bound_it():
    assert half_width(1, 0.0, 0.05) == math.inf
    assert half_width(2, 1e-6, 0.05) == math.inf  # two pairs cannot exclude any mean at 95%
    assert math.isfinite(half_width(6, 1e-6, 0.05))


def test_the_sequence_covers_the_true_mean_at_every_look_at_once():
    for sd in (0.5, 1.0, 2.5):
        assert simulate(sd, delta=0.3, margin=1.0)["miscovered"] <= 0.05 + 0.005


def test_peeking_with_the_fixed_n_tost_declares_equivalence_at_the_margin_far_above_alpha():
    assert simulate(1.0, delta=1.0, margin=1.0)["tost"] > 0.15  # alpha is 0.05


def test_the_sequence_keeps_the_false_equivalence_rate_at_the_margin_below_alpha():
    for sd in (0.5, 1.0, 2.5):
        assert simulate(sd, delta=1.0, margin=1.0)["sequence"] <= 0.055


def test_the_sequence_decides_a_true_equivalence_when_the_margin_is_a_std_away():
    sim = simulate(1.0, delta=0.0, margin=1.0)
    assert sim["sequence"] > 0.95 and sim["sequence_pairs"] < 30


def test_the_verdict_stops_at_the_first_decisive_look_and_gives_the_fixed_n_tost_there():
    rng = np.random.default_rng(1)
    diffs = list(rng.normal(0.0, 0.001, size=40))
    v = sequential_verdict(diffs, margin=0.002)
    assert v["decision"] == "equivalent" and v["n"] < 40 and v["n_available"] == 40
    assert all(s["decision"] == "undecided" for s in v["looks"][: v["n"] - 1])
    assert v["fixed"]["n"] == v["n"] and v["fixed"]["ci_tost"][1] - v["fixed"]["ci_tost"][0] < (
        v["hi"] - v["lo"]
    )  # the fixed-n interval is narrower: it does not pay for the looks


def test_a_difference_beyond_the_margin_is_decided_different():
    diffs = list(np.random.default_rng(2).normal(0.01, 0.001, size=20))
    assert sequential_verdict(diffs, margin=0.002)["decision"] == "different"


def test_the_running_interval_only_narrows():
    seq = looks(list(np.random.default_rng(4).normal(0, 1, size=30)), margin=0.5, alpha=0.05)
    assert all(
        a["lo"] <= b["lo"] and b["hi"] <= a["hi"] for a, b in zip(seq, seq[1:], strict=False)
    )


def test_the_verdict_is_the_same_in_any_unit():
    diffs = list(np.random.default_rng(5).normal(0.0005, 0.002, size=25))
    a = sequential_verdict(diffs, margin=0.002)
    b = sequential_verdict([d * 1000 for d in diffs], margin=2.0)
    assert (a["decision"], a["n"]) == (b["decision"], b["n"])
    assert b["lo"] == pytest.approx(1000 * a["lo"]) and b["hi"] == pytest.approx(1000 * a["hi"])


def test_no_pairs_is_undecided_and_says_so():
    v = sequential_verdict([], margin=0.002)
    assert v["decision"] == "undecided" and v["n"] == 0
    assert "undecided" in sequential.DECISIONS


def with_mean_and_std(n: int, mean: float, std: float) -> list[float]:
    """``n`` differences whose sample mean and std are exactly ``mean`` and ``std``."""
    z = np.random.default_rng(n).normal(size=n)
    return list(mean + std * (z - z.mean()) / z.std(ddof=1))


@pytest.mark.parametrize(("mean", "std"), [(0.0005, 0.0028), (0.0, 0.002), (0.004, 0.003)])
def test_the_projection_is_where_an_interval_at_the_observed_mean_and_std_first_decides(mean, std):
    v = sequential_verdict(with_mean_and_std(5, mean, std), margin=0.002)
    assert v["decision"] == "undecided"
    n, decision = v["projected"]
    assert decision == ("equivalent" if mean < 0.002 else "different")
    assert sequential_verdict(with_mean_and_std(n, mean, std), margin=0.002)["decision"] == decision
    w = half_width(n - 1, (n - 2) * std**2, 0.05)
    assert (mean + w >= 0.002) if decision == "equivalent" else (mean - w <= 0.002)
    assert "it would decide (" + decision + f") after about {n} pairs" in sequential.verdict_line(
        v, 0.002
    )


def test_a_decided_verdict_projects_nothing_and_a_hopeless_one_says_so():
    assert "projected" not in sequential_verdict([0.0001, -0.0001] * 20, margin=0.01)
    v = sequential_verdict(with_mean_and_std(5, 0.002, 0.003), margin=0.002)  # at the margin
    assert v["projected"] == (None, None) and "would not decide within 100000 pairs" in (
        sequential.verdict_line(v, 0.002)
    )


def main() -> None:
    """The simulation table of docs/reports.md "Anytime-valid verdicts"."""
    print(
        f"{STUDIES} studies a cell, looks after every pair from {FIRST_LOOK} to {MAX_PAIRS}, "
        f"alpha 0.05, mixture c = {MIXTURE_C}"
    )
    print(
        "std/margin | false equivalence at the margin: tost-peeking, sequence | "
        "true difference 0: mean pairs (decided) tost-peeking, sequence"
    )
    for sd in (0.5, 1.0, 1.5, 2.5):
        null, zero = simulate(sd, 1.0, 1.0), simulate(sd, 0.0, 1.0, seed=1)
        print(
            f"{sd:>10} | {null['tost']:.3f}, {null['sequence']:.3f} | "
            f"{zero['tost_pairs']:.1f} ({zero['tost']:.2f}), "
            f"{zero['sequence_pairs']:.1f} ({zero['sequence']:.2f}) | {seeds_needed(sd, 1.0)}"
        )
    print("mixture c | std = margin: false equivalence at the margin, mean pairs at 0")
    for c in (0.5, 1.0, 2.0, 4.0, 8.0):
        null, zero = simulate(1.0, 1.0, 1.0, c=c), simulate(1.0, 0.0, 1.0, seed=1, c=c)
        print(f"{c:>9} | {null['sequence']:.3f}, {zero['sequence_pairs']:.1f}")


if __name__ == "__main__":
    main()
