"""normlab.report.stats by simulation: the combined interval of the compute multiplier (Student t,
Welch-Satterthwaite df) against the normal rule it replaced, and the annealed step multiplier
against a within-run reading of cosine curves, on studies whose true multiplier is known.

``python3 -m tests.report.test_stats_intervals`` prints both tables.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from scipy import stats

from normlab.report.stats import (
    annealed_slope,
    annealed_step_multiplier,
    combined_interval,
    compute_multiplier,
    ratio_interval,
    step_multiplier,
)

ALPHA = 0.05
PAIRS = 30  # interleaved pairs of the simulated bench
DRAWS = 4000  # simulated studies per (case, n)
SEEDS = (2, 3, 7)
SIGMA_M = 0.02  # std of a seed's log step multiplier
TRUE_LOG_M, TRUE_LOG_S = math.log(0.97), math.log(1.02)
# the bench's per-pair log-ratio std, as a function of n, for two balances of the two ses
CASES = {
    "parts comparable": lambda n: SIGMA_M * math.sqrt(PAIRS / n),  # se_speed = se_steps
    "steps dominate": lambda n: SIGMA_M * math.sqrt(PAIRS / n) / 5,  # se_speed = se_steps / 5
}


def simulate(n: int, sigma_s: float, draws: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``draws`` studies of ``n`` seeds' log step multipliers and a bench of :data:`PAIRS` log
    step-time ratios t_var/t_base: per study the estimate of log k and the two parts' ses."""
    rng = np.random.default_rng(seed)
    log_m = rng.normal(TRUE_LOG_M, SIGMA_M, (draws, n))
    log_r = rng.normal(-TRUE_LOG_S, sigma_s, (draws, PAIRS))  # speed = t_base/t_var = 1/r
    return {
        "log_m": log_m,
        "log_r": log_r,
        "est": log_m.mean(1) - log_r.mean(1),
        "se_m": log_m.std(1, ddof=1) / math.sqrt(n),
        "se_s": log_r.std(1, ddof=1) / math.sqrt(PAIRS),
    }


def new_half(sim: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The half-width of compute_multiplier's interval: t with Welch-Satterthwaite df."""
    return combined_interval([(sim["se_m"], n - 1), (sim["se_s"], PAIRS - 1)], sim["est"])["half"]


def old_z_half(sim: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The rule it replaced: the bench's t interval backed out to an se with z, then z times
    the two ses added in quadrature (the seeds' t of n − 1 df lost)."""
    z, t_bench = stats.norm.ppf(1 - ALPHA / 2), stats.t.ppf(1 - ALPHA / 2, PAIRS - 1)
    return z * np.hypot(sim["se_m"], sim["se_s"] * t_bench / z)


def floor_half(sim: dict[str, np.ndarray], n: int) -> np.ndarray:
    """An alternative, not the rule in stats.py: Welch-Satterthwaite, but never narrower than
    either part's own t interval (printed beside the others for comparison)."""
    t_m, t_s = stats.t.ppf(1 - ALPHA / 2, n - 1), stats.t.ppf(1 - ALPHA / 2, PAIRS - 1)
    return np.maximum(new_half(sim, n), np.maximum(t_m * sim["se_m"], t_s * sim["se_s"]))


def coverage(sim: dict[str, np.ndarray], half: np.ndarray) -> float:
    """Fraction of studies whose interval est ± half covers the true log k."""
    return float(np.mean(np.abs(sim["est"] - (TRUE_LOG_M + TRUE_LOG_S)) <= half))


@functools.cache
def coverage_table(draws: int = DRAWS) -> dict[tuple[str, int], dict[str, float]]:
    """Per (case, n): the coverage of the rule in stats.py (``ws``), of the old z rule (``z``)
    and of the floored alternative (``floor``)."""
    out = {}
    for i, (case, sigma_s) in enumerate(CASES.items()):
        for n in SEEDS:
            sim = simulate(n, sigma_s(n), draws, seed=100 * i + n)
            rules = {"ws": new_half, "z": old_z_half, "floor": floor_half}
            out[case, n] = {name: coverage(sim, half(sim, n)) for name, half in rules.items()}
    return out


# Welch-Satterthwaite with a part of 1-2 df undercovers: when a seed pair happens to agree, its
# se is small, the df jumps towards the bench's 29 and t falls from 12.7 towards 2 just when the
# seeds' part is underestimated (the Behrens-Fisher problem has no exact answer at n = 2)
SHORT = {("parts comparable", 2), ("steps dominate", 2), ("steps dominate", 3)}


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(
            (case, n),
            marks=pytest.mark.xfail((case, n) in SHORT, reason="W-S df at 1-2 df", strict=True),
            id=f"{case.replace(' ', '-')}-n{n}",
        )
        for case in CASES
        for n in SEEDS
    ],
)
def test_the_combined_95pc_interval_covers_in_93_to_97pc(key):
    c = coverage_table()[key]
    assert 0.93 <= c["ws"] <= 0.97, f"{key}: {c}"


def test_the_combined_interval_covers_better_than_the_old_z_rule_everywhere():
    for key, c in coverage_table().items():
        assert c["ws"] > c["z"], f"{key}: {c}"
    assert coverage_table()["steps dominate", 2]["z"] < 0.8  # z = 1.96 where t_1 = 12.7


def test_compute_multiplier_gives_the_simulated_interval():
    n = 3
    sim = simulate(n, CASES["parts comparable"](n), draws=20)
    half = new_half(sim, n)
    for i in range(20):
        bench = ratio_interval(list(np.exp(sim["log_r"][i])))
        r = compute_multiplier(
            list(np.exp(sim["log_m"][i])), 1 / bench["gmean"], (bench["se_log"], bench["df"])
        )
        assert math.log(r["k"]) == pytest.approx(sim["est"][i])
        assert r["se_log"] == pytest.approx(math.hypot(sim["se_m"][i], sim["se_s"][i]))
        assert math.log(r["ci"][1]) - math.log(r["k"]) == pytest.approx(half[i])
        assert n - 1 < r["df"] < n - 1 + PAIRS - 1


def test_one_part_gives_its_own_t_and_a_zero_part_adds_nothing():
    one = combined_interval([(0.1, 4)], 1.0)
    assert one["half"] == pytest.approx(stats.t.ppf(0.975, 4) * 0.1) and one["df"] == 4
    assert combined_interval([(0.1, 4), (0.0, 9)], 1.0) == one
    assert math.isnan(combined_interval([(0.1, 4), (0.1, math.nan)], 1.0)["half"])
    # two equal parts of 4 df: df = (2 se²)² / (2 se⁴ / 4) = 8
    assert combined_interval([(0.1, 4), (0.1, 4)], 0.0)["df"] == pytest.approx(8.0)


# --- the annealed step multiplier ----------------------------------------------------------------
# Annealed law L(T) = E + A T^-a: -dL/d ln T = a A T^-a = 0.4 nats per e-fold at T = 600.
E, A, POW = 1.5, 0.4 / 0.5 * 600**0.5, 0.5
BUDGETS = np.array([150.0, 300.0, 450.0, 600.0])
EVALS = np.arange(25.0, 601.0, 25.0)  # a 600-step cosine run evaluated every 25 steps
TRUE_M = 1.05  # the variant's annealed loss at T is the baseline's at 1.05 T
NOISE = 0.004  # std of each point's own noise, per run; a shared part of the same std per seed
COSINE_GAP = 0.3  # c: the unannealed excess at lr = lr_max; at mid-run c/2 = 0.15 nats
ANNEAL_SEEDS, ANNEAL_DRAWS = 7, 2000


def law(t: np.ndarray) -> np.ndarray:
    return E + A * np.asarray(t, float) ** -POW


def cosine_curve(t: np.ndarray, shift: float) -> np.ndarray:
    """A cosine run read within itself: loss at step s = L(shift · s) + c · lr(s)/lr_max with
    lr(s)/lr_max = (1 + cos(pi s/600)) / 2: the annealed law plus an excess that the decay of
    the learning rate removes by the end (a model of a cosine curve, not a fit)."""
    return law(shift * t) + COSINE_GAP * (1 + np.cos(np.pi * t / 600.0)) / 2


def noisy_pair(rng: np.random.Generator, steps: np.ndarray, base: np.ndarray, var: np.ndarray):
    """One seed's two curves with a shared (same batches) and an own noise per point."""
    shared = rng.normal(0, NOISE, steps.shape)
    b = base + shared + rng.normal(0, NOISE, steps.shape)
    v = var + shared + rng.normal(0, NOISE, steps.shape)
    return (list(steps), list(b)), (list(steps), list(v))


@functools.cache
def annealed_study(draws: int = ANNEAL_DRAWS) -> dict[str, float]:
    """Per draw, :data:`ANNEAL_SEEDS` seeds read both ways: annealed points
    (:func:`annealed_step_multiplier`) and the within-run cosine curve (:func:`step_multiplier`),
    each through compute_multiplier with speed 1. Coverage of 1.05 and of the noise-free
    annealed reading, and the medians of k."""
    rng = np.random.default_rng(2024)
    exact = noise_free_annealed()
    covered, covered_exact, k_annealed, k_within = 0, 0, [], []
    for _ in range(draws):
        ann, within = [], []
        for _ in range(ANNEAL_SEEDS):
            ann.append(
                annealed_step_multiplier(
                    *noisy_pair(rng, BUDGETS, law(BUDGETS), law(TRUE_M * BUDGETS))
                )
            )
            within.append(
                step_multiplier(
                    *noisy_pair(rng, EVALS, cosine_curve(EVALS, 1.0), cosine_curve(EVALS, TRUE_M))
                )
            )
        r = compute_multiplier(ann, 1.0)
        covered += r["ci"][0] <= TRUE_M <= r["ci"][1]
        covered_exact += r["ci"][0] <= exact <= r["ci"][1]
        k_annealed.append(r["k"])
        k_within.append(compute_multiplier(within, 1.0)["k"])
    return {
        "coverage": covered / draws,
        "coverage_noise_free": covered_exact / draws,
        "median_annealed": float(np.nanmedian(k_annealed)),
        "median_within": float(np.nanmedian(k_within)),
    }


def noise_free_annealed() -> float:
    """The annealed reading of the law itself: below 1.05, since a chord in (ln T, loss) lies
    above a convex law, so the variant seems to reach the baseline's loss later."""
    base, var = list(law(BUDGETS)), list(law(TRUE_M * BUDGETS))
    return annealed_step_multiplier((list(BUDGETS), base), (list(BUDGETS), var))


def test_the_annealed_reading_recovers_the_true_multiplier():
    r = annealed_study()
    assert abs(r["median_annealed"] - TRUE_M) < 0.01
    # the interval itself is right: it covers what the interpolation reads
    assert 0.93 <= r["coverage_noise_free"] <= 0.97, r


@pytest.mark.xfail(reason="chord bias in (ln T, loss) between 450 and 600: 0.921", strict=True)
def test_the_annealed_interval_covers_the_true_multiplier_in_93pc():
    assert annealed_study()["coverage"] >= 0.93  # the issue asked for 95%


def test_the_within_run_reading_of_a_cosine_curve_reads_the_multiplier_towards_one():
    r = annealed_study()
    # at the end of a cosine run the decay of lr adds its own fall to the law's, so the curve
    # falls faster per step than the annealed law and the same loss gap is worth fewer steps:
    # read towards 1, more than the annealed reading (the gap grows with the multiplier)
    assert r["median_within"] < min(TRUE_M - 0.002, r["median_annealed"]), r


def test_the_annealed_multiplier_without_noise_and_its_mirror():
    base, var = list(law(BUDGETS)), list(law(TRUE_M * BUDGETS))
    m = annealed_step_multiplier((list(BUDGETS), base), (list(BUDGETS), var))
    assert m == pytest.approx(TRUE_M, abs=0.005)
    mirror = annealed_step_multiplier((list(BUDGETS), var), (list(BUDGETS), base))
    assert mirror == pytest.approx(1 / TRUE_M, abs=0.005)


def test_the_annealed_multiplier_does_not_extrapolate():
    t = [150.0, 300.0, 450.0, 600.0]
    # the variant at 600 is worse than the baseline's smallest budget: where the baseline was
    # that bad is not measured
    assert math.isnan(annealed_step_multiplier((t, [3.0, 2.5, 2.2, 2.0]), (t, [4, 3.6, 3.3, 3.1])))
    assert math.isnan(annealed_step_multiplier((t[:2], [3.0, 2.5]), ([50.0, 100.0], [3.0, 2.5])))
    # the largest shared budget is 300: the variant's 450 is not read
    m = annealed_step_multiplier((t[:2], [3.0, 2.5]), (t[:3], [3.0, 2.6, 2.0]))
    assert m == pytest.approx(2**0.8 / 2)  # 2.6 at 0.8 of the way in ln T
    with pytest.raises(ValueError, match=">= 2"):
        annealed_step_multiplier(([600.0], [2.0]), ([600.0], [2.0]))


def test_annealed_slope_is_the_fall_per_e_fold_of_steps():
    assert annealed_slope([100, 100 * math.e, 100 * math.e**2], [3.0, 2.6, 2.2]) == pytest.approx(
        0.4
    )
    with pytest.raises(ValueError, match=">= 2"):
        annealed_slope([600], [2.0])


def main() -> None:
    """Print the coverage table of the combined interval and the annealed study."""
    print(f"95% interval coverage of log k ({DRAWS} studies each, bench of {PAIRS} pairs)")
    print(f"{'case':<18} {'n':>2} {'t, W-S df':>10} {'old z':>7} {'floored':>8}")
    for (case, n), c in coverage_table().items():
        print(f"{case:<18} {n:>2} {c['ws']:>10.3f} {c['z']:>7.3f} {c['floor']:>8.3f}")
    r = annealed_study()
    print(f"\nTrue multiplier {TRUE_M}, {ANNEAL_SEEDS} seeds, {ANNEAL_DRAWS} draws")
    print(
        f"annealed points:   median k {r['median_annealed']:.4f} (noise-free "
        f"{noise_free_annealed():.4f}); the 95% CI covers {TRUE_M} in {r['coverage']:.3f}, the "
        f"noise-free reading in {r['coverage_noise_free']:.3f}"
    )
    print(f"within-run cosine: median k {r['median_within']:.4f}")


if __name__ == "__main__":
    main()
