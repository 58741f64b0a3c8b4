"""normlab.report.stats by simulation: the combined interval of the compute multiplier (Student t,
Welch-Satterthwaite df, floored at each part's own t) against plain Welch-Satterthwaite and the
normal rule before both; and the annealed step multiplier against a within-run reading of a
cosine curve, both from one law of loss under learning-rate annealing, whose true multiplier is
known.

``python3 -m tests.report.test_stats_intervals`` prints both tables.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from scipy import signal, stats

from normlab.report.stats import (
    annealed_slope,
    annealed_step_multiplier,
    combined_interval,
    compute_multiplier,
    end_slope,
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


def adopted_half(sim: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The half-width of compute_multiplier's interval (:func:`combined_interval`): t with
    Welch-Satterthwaite df, floored at either part's own t interval."""
    return combined_interval([(sim["se_m"], n - 1), (sim["se_s"], PAIRS - 1)], sim["est"])["half"]


def ws_half(sim: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Plain Welch-Satterthwaite, written out here: t_{df} · se with
    df = se⁴ / (se_m⁴/(n − 1) + se_s⁴/(PAIRS − 1)), no floor."""
    var = sim["se_m"] ** 2 + sim["se_s"] ** 2
    df = var**2 / (sim["se_m"] ** 4 / (n - 1) + sim["se_s"] ** 4 / (PAIRS - 1))
    return stats.t.ppf(1 - ALPHA / 2, df) * np.sqrt(var)


def old_z_half(sim: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The rule before both: the bench's t interval backed out to an se with z, then z times
    the two ses added in quadrature (the seeds' t of n − 1 df lost)."""
    z, t_bench = stats.norm.ppf(1 - ALPHA / 2), stats.t.ppf(1 - ALPHA / 2, PAIRS - 1)
    return z * np.hypot(sim["se_m"], sim["se_s"] * t_bench / z)


def coverage(sim: dict[str, np.ndarray], half: np.ndarray) -> float:
    """Fraction of studies whose interval est ± half covers the true log k."""
    return float(np.mean(np.abs(sim["est"] - (TRUE_LOG_M + TRUE_LOG_S)) <= half))


RULES = {"z": old_z_half, "ws": ws_half, "adopted": adopted_half}


@functools.cache
def coverage_table(draws: int = DRAWS) -> dict[tuple[str, int], dict[str, float]]:
    """Per (case, n): the coverage of each of :data:`RULES`: the old z rule (``z``), plain
    Welch-Satterthwaite (``ws``) and the floored rule in stats.py (``adopted``)."""
    out = {}
    for i, (case, sigma_s) in enumerate(CASES.items()):
        for n in SEEDS:
            sim = simulate(n, sigma_s(n), draws, seed=100 * i + n)
            out[case, n] = {name: coverage(sim, half(sim, n)) for name, half in RULES.items()}
    return out


# Measured with 4,000 studies per case (40,000 give 0.975): at n = 2 with comparable parts the
# seeds' own t_1 interval often sets the floor, and it over-covers; conservative, so kept
OVER = {("parts comparable", 2): "the floor over-covers at 1 df: 0.972 (0.975 at 40,000)"}


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(
            (case, n),
            marks=pytest.mark.xfail((case, n) in OVER, reason=OVER.get((case, n), ""), strict=True),
            id=f"{case.replace(' ', '-')}-n{n}",
        )
        for case in CASES
        for n in SEEDS
    ],
)
def test_the_combined_95pc_interval_covers_in_93_to_97pc(key):
    c = coverage_table()[key]
    assert 0.93 <= c["adopted"] <= 0.97, f"{key}: {c}"


def test_plain_welch_satterthwaite_and_the_z_rule_undercover_where_the_floor_does_not():
    table = coverage_table()
    for key, c in table.items():
        assert c["adopted"] >= c["ws"] > c["z"], f"{key}: {c}"
    # Behrens-Fisher at 1 df: a seed pair that happens to agree shrinks both se and t
    assert table["steps dominate", 2]["ws"] < 0.9
    assert table["steps dominate", 2]["z"] < 0.8  # z = 1.96 where t_1 = 12.7


def test_the_floor_is_each_parts_own_t_interval_and_df_gives_the_half_width_back():
    n = 2
    sim = simulate(n, CASES["steps dominate"](n), draws=200)
    r = combined_interval([(sim["se_m"], n - 1), (sim["se_s"], PAIRS - 1)], sim["est"])
    t_m, t_s = stats.t.ppf(1 - ALPHA / 2, n - 1), stats.t.ppf(1 - ALPHA / 2, PAIRS - 1)
    floor = np.maximum(t_m * sim["se_m"], t_s * sim["se_s"])
    assert r["half"] == pytest.approx(np.maximum(ws_half(sim, n), floor), rel=1e-12)
    assert (floor > ws_half(sim, n)).mean() > 0.1  # the floor is at work in this case
    # (se, df) reproduce the interval: a later combination or a report can rebuild it
    assert stats.t.ppf(1 - ALPHA / 2, r["df"]) * r["se"] == pytest.approx(r["half"], rel=1e-9)
    assert np.all((n - 1 <= r["df"]) & (r["df"] <= n - 1 + PAIRS - 1))


def test_compute_multiplier_gives_the_simulated_interval():
    n = 3
    sim = simulate(n, CASES["parts comparable"](n), draws=20)
    half = adopted_half(sim, n)
    for i in range(20):
        bench = ratio_interval(list(np.exp(sim["log_r"][i])))
        r = compute_multiplier(
            list(np.exp(sim["log_m"][i])), 1 / bench["gmean"], (bench["se_log"], bench["df"])
        )
        assert math.log(r["k"]) == pytest.approx(sim["est"][i])
        assert r["se_log"] == pytest.approx(math.hypot(sim["se_m"][i], sim["se_s"][i]))
        assert math.log(r["ci"][1]) - math.log(r["k"]) == pytest.approx(half[i])
        t = stats.t.ppf(1 - ALPHA / 2, r["df"])
        assert t * r["se_log"] == pytest.approx(half[i], rel=1e-9)
        assert n - 1 <= r["df"] < n - 1 + PAIRS - 1


def test_one_part_gives_its_own_t_and_a_zero_part_adds_nothing():
    one = combined_interval([(0.1, 4)], 1.0)
    assert one["half"] == pytest.approx(stats.t.ppf(0.975, 4) * 0.1) and one["df"] == 4
    assert combined_interval([(0.1, 4), (0.0, 9)], 1.0) == one
    assert math.isnan(combined_interval([(0.1, 4), (0.1, math.nan)], 1.0)["half"])
    # two equal parts of 4 df: df = (2 se²)² / (2 se⁴ / 4) = 8, and t_8 · √2 se > t_4 · se
    two = combined_interval([(0.1, 4), (0.1, 4)], 0.0)
    assert two["df"] == pytest.approx(8.0)
    # a 1-df part beside a precise one: its own t_1 interval is the floor
    floored = combined_interval([(0.1, 1), (0.05, 29)], 0.0)
    assert floored["half"] == pytest.approx(stats.t.ppf(0.975, 1) * 0.1)
    assert 1 < floored["df"] < 1.1


# --- the annealed step multiplier ----------------------------------------------------------------
# Losses from the scaling law with learning-rate annealing (Tissue et al. 2024, arXiv:2408.11029):
#   L(s) = L0 + A · S1(s)^-alpha − C · S2(s),   eta_i = lr_i / lr_max of update i = 1..s,
#   S1(s) = Σ_{i<=s} eta_i (the forward area),  S2(s) = Σ_{i<=s} m_i (the annealing area),
#   m_i = LAMBDA · m_{i-1} + max(eta_{i-1} − eta_i, 0),  m_0 = 0, eta_0 = eta_1.
# The paper's m_i adds eta_{i-1} − eta_i; here only decreases count (our choice: a rising lr in the
# warm-up is no annealing; after it neither schedule rises, so nothing else changes). Calibrated
# (alpha fixed at 0.5; A and C solved, L0 set for 1.98 at 600) to the repo's tiny CPU runs: annealed
# slope 0.44 nats per e-fold between budgets 400 and 600, and 0.23 at the end of a 600-step cosine
# curve (its last 4 evaluations): the within-run curve ends FLATTER than the annealed law.
L0, A_LAW, ALPHA_LAW, C_LAW, LAMBDA = 1.29581, 15.90796, 0.5, 3.627972e-4, 0.999
WARMUP, MIN_LR, DECAY = 50, 0.1, 0.2  # steps; fraction of lr_max; fraction of a WSD budget
BUDGETS = np.array([160.0, 300.0, 460.0, 600.0])  # x 1.05: whole steps (168, 315, 483, 630)
EVALS = np.arange(25, 601, 25)  # a 600-step cosine run evaluated every 25 steps
# The variant: each of its steps is worth 1.05 of the baseline's, so its run of a schedule of T
# steps ends where the baseline's run of the same schedule stretched to 1.05 T ends: a known
# compute multiplier of 1.05 on annealed budgets.
STRETCH = 1.05
NOISE = 0.004  # std of each point's own noise, per run; a shared part of the same std per seed
ANNEAL_SEEDS, ANNEAL_DRAWS = 7, 2000


def wsd(budget: int) -> np.ndarray:
    """eta per update of a WSD run of ``budget`` steps, as training.step.lr_at: linear warm-up,
    stable, then 1 − sqrt decay over the last round(0.2 · budget) steps to 0.1."""
    s = np.arange(budget)
    start = budget - round(DECAY * budget)
    p = np.clip((s + 1 - start) / (budget - start), 0.0, 1.0)
    eta = np.where(s < start, 1.0, MIN_LR + (1 - MIN_LR) * (1 - np.sqrt(p)))
    return np.where(s < WARMUP, (s + 1) / WARMUP, eta)


def cosine(steps: int = 600) -> np.ndarray:
    """eta per update of a cosine run: linear warm-up, then cosine to 0.1 at ``steps``."""
    s = np.arange(steps)
    progress = np.clip((s - WARMUP) / (steps - WARMUP), 0.0, 1.0)
    eta = MIN_LR + (1 - MIN_LR) * 0.5 * (1 + np.cos(np.pi * progress))
    return np.where(s < WARMUP, (s + 1) / WARMUP, eta)


def law_curve(eta: np.ndarray) -> np.ndarray:
    """L after each update of a schedule ``eta`` (index s − 1: after s updates)."""
    drop = np.maximum(np.diff(eta, prepend=eta[0]) * -1, 0.0)
    m = signal.lfilter([1.0], [1.0, -LAMBDA], drop)  # m_i = LAMBDA · m_{i-1} + drop_i
    return L0 + A_LAW * np.cumsum(eta) ** -ALPHA_LAW - C_LAW * np.cumsum(m)


def annealed(budgets: np.ndarray, stretch: float = 1.0) -> np.ndarray:
    """The final loss of a WSD run of each budget (of the variant: the baseline's of
    ``stretch`` x the budget)."""
    return np.array([law_curve(wsd(round(stretch * t)))[-1] for t in budgets])


def within_run(stretch: float = 1.0) -> np.ndarray:
    """The 600-step cosine run's loss at :data:`EVALS` (the variant's: the baseline's cosine run
    of ``stretch`` x 600 steps at ``stretch`` x each evaluation step)."""
    curve = law_curve(cosine(round(600 * stretch)))
    return np.interp(stretch * EVALS, np.arange(1, curve.size + 1), curve)


@functools.cache
def true_multiplier(end: int = 600) -> float:
    """What the variant's annealed loss at ``end`` is worth in the baseline's annealed budgets:
    T* / end with L_base(T*) = L_var(end), linear between integer budgets: :data:`STRETCH` by
    construction, found here by search as a check of the construction."""
    target = annealed(np.array([end]), STRETCH)[0]
    budgets = np.arange(end, int(end * 1.2))
    loss = annealed(budgets)
    j = int(np.flatnonzero(loss <= target)[0])
    return float(budgets[j - 1] + (loss[j - 1] - target) / (loss[j - 1] - loss[j])) / end


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
    each through compute_multiplier with speed 1. Coverage of the true multiplier and of the
    noise-free annealed reading, and the medians of k."""
    rng = np.random.default_rng(2024)
    truth, exact = true_multiplier(), noise_free_annealed()
    curves = {"ann": (annealed(BUDGETS), annealed(BUDGETS, STRETCH))}
    curves["within"] = (within_run(), within_run(STRETCH))
    covered, covered_exact, k_annealed, k_within = 0, 0, [], []
    for _ in range(draws):
        ann = [
            annealed_step_multiplier(*noisy_pair(rng, BUDGETS, *curves["ann"]))
            for _ in range(ANNEAL_SEEDS)
        ]
        within = [
            step_multiplier(*noisy_pair(rng, EVALS, *curves["within"])) for _ in range(ANNEAL_SEEDS)
        ]
        r = compute_multiplier(ann, 1.0)
        covered += r["ci"][0] <= truth <= r["ci"][1]
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
    """The annealed reading of the law itself (the interpolation's own error, no noise)."""
    base, var = list(annealed(BUDGETS)), list(annealed(BUDGETS, STRETCH))
    return annealed_step_multiplier((list(BUDGETS), base), (list(BUDGETS), var))


def model_slopes() -> dict[str, float]:
    """The calibration's two figures, nats per e-fold of steps: the annealed slope between
    budgets 400 and 600, and the cosine curve's end slope over its last 4 evaluations."""
    ann = annealed(np.array([400.0, 600.0]))
    return {
        "annealed": float((ann[0] - ann[1]) / math.log(1.5)),
        "within_end": end_slope(list(EVALS), list(within_run()), 4),
    }


def test_the_law_is_calibrated_to_the_real_runs_slopes():
    s = model_slopes()
    assert s["annealed"] == pytest.approx(0.44, abs=0.002)
    assert s["within_end"] == pytest.approx(0.23, abs=0.002)
    assert annealed(np.array([600.0]))[0] == pytest.approx(1.98, abs=1e-3)
    assert true_multiplier() == pytest.approx(STRETCH, abs=1e-9)


def test_the_annealed_reading_recovers_the_true_multiplier():
    r = annealed_study()
    assert abs(r["median_annealed"] - true_multiplier()) < 0.01, r
    # the interval itself is right: it covers what the interpolation reads
    assert 0.93 <= r["coverage_noise_free"] <= 0.97, r


def test_the_annealed_interval_covers_the_true_multiplier_in_93pc():
    r = annealed_study()
    # measured 0.948 with PCHIP; the issue asked for 95%: the interval is right (it covers the
    # noise-free reading in 0.950), the interpolation reads 1.0506 for 1.05
    assert r["coverage"] >= 0.93, f"coverage of {true_multiplier():.4f}: {r['coverage']:.3f}"


def test_the_within_run_reading_of_a_cosine_curve_overstates_the_multiplier():
    r, truth = annealed_study(), true_multiplier()
    # the cosine curve ends flatter than the annealed law (0.23 against 0.44 nats per e-fold):
    # at its end the lr is small, so a step buys little, and the same
    # loss gap spans more of its steps. The within-run reading lands beyond the truth, away
    # from 1: here about twice as far in log k
    assert r["median_within"] > max(truth, r["median_annealed"]) + 0.02, r
    assert math.log(r["median_within"]) > 1.5 * math.log(truth), r


def test_the_annealed_multiplier_without_noise_and_its_mirror():
    base, var = list(annealed(BUDGETS)), list(annealed(BUDGETS, STRETCH))
    m = annealed_step_multiplier((list(BUDGETS), base), (list(BUDGETS), var))
    assert m == pytest.approx(true_multiplier(), abs=0.002)
    mirror = annealed_step_multiplier((list(BUDGETS), var), (list(BUDGETS), base))
    assert mirror == pytest.approx(1 / true_multiplier(), abs=0.002)


def test_a_monotone_cubic_follows_a_convex_law_where_a_chord_reads_late():
    # L(T) = 1.5 + a · T^-0.5, convex in ln T; the variant's loss at T is the baseline's at 1.05 T
    a = 0.8 * 600**0.5
    base, var = 1.5 + a * BUDGETS**-0.5, 1.5 + a * (1.05 * BUDGETS) ** -0.5
    m = annealed_step_multiplier((list(BUDGETS), list(base)), (list(BUDGETS), list(var)))
    assert m == pytest.approx(1.05, abs=0.001)  # linear chords in (ln T, loss) read 1.0470
    # no overshoot: the first crossing of a running minimum with a flat stretch stays inside it
    t, flat = [150.0, 300.0, 450.0, 600.0], [3.0, 2.5, 2.5, 2.0]
    m = annealed_step_multiplier((t, flat), (t, [3.0, 2.6, 2.4, 2.25]))
    assert 450 < m * 600 < 600


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
    print(f"{'case':<18} {'n':>2} {'old z':>7} {'plain W-S':>10} {'adopted':>8}")
    for (case, n), c in coverage_table().items():
        print(f"{case:<18} {n:>2} {c['z']:>7.3f} {c['ws']:>10.3f} {c['adopted']:>8.3f}")
    r, truth, slopes = annealed_study(), true_multiplier(), model_slopes()
    print(
        f"\nLR-annealing law: annealed slope 400-600 {slopes['annealed']:.3f}, cosine end slope "
        f"{slopes['within_end']:.3f} nats per e-fold; a run stretched {STRETCH}x is worth "
        f"k = {truth:.4f} in "
        f"annealed budgets at 600 ({ANNEAL_SEEDS} seeds, {ANNEAL_DRAWS} draws)"
    )
    print(
        f"annealed points:   median k {r['median_annealed']:.4f} (noise-free "
        f"{noise_free_annealed():.4f}); the 95% CI covers {truth:.4f} in {r['coverage']:.3f}, "
        f"the noise-free reading in {r['coverage_noise_free']:.3f}"
    )
    print(f"within-run cosine: median k {r['median_within']:.4f}")


if __name__ == "__main__":
    main()
