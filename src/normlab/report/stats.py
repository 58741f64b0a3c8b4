"""The report's statistics on plain lists of floats, in the caller's units (no file is read): t
intervals, Welch-Satterthwaite sums, the paired TOST and its power, ratios on logs, the sign test,
Holm, and the compute-equivalent multiplier with the nats <-> compute conversion.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import integrate, interpolate, optimize, special, stats

from normlab.report.text import ci_name, fmt_ci

#: The report's one not-a-number: a statistic with no value (n < 2, no data).
NAN = float("nan")
POWER = 0.8  # the power that ``seeds_needed`` plans for by default
MAX_SEEDS = 100_000  # ``seeds_needed`` gives up (returns None) beyond this


def finite_median(values: list[float]) -> float:
    """Median of the finite ``values`` (nan when none is)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else NAN


def describe(values: list[float]) -> dict[str, float]:
    """n, mean, sample std (ddof=1; nan when n < 2), min, max, in the units of ``values``."""
    x = np.asarray(values, float)
    if x.size == 0:
        return {"n": 0, "mean": NAN, "std": NAN, "min": NAN, "max": NAN}
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else NAN,
        "min": float(x.min()),
        "max": float(x.max()),
    }


def t_interval(values: list[float], confidence: float) -> tuple[float, float]:
    """Student t interval for the mean: mean ± t_{(1+confidence)/2, n−1} · s/√n; nan when n < 2."""
    x = np.asarray(values, float)
    if x.size < 2:
        return NAN, NAN
    half = stats.t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def combined_interval(
    parts: list[tuple[Any, Any]], estimate: Any, alpha: float = 0.05
) -> dict[str, Any]:
    """``{"se", "df", "half", "ci"}``: the 1−alpha interval ``estimate ± half`` of a sum of
    independent ``(se, df)`` parts, Welch-Satterthwaite t (Welch 1947, Satterthwaite 1946), never
    narrower than a part's own; ``df`` gives ``half`` back. Elementwise over numpy arrays."""
    both = np.broadcast_arrays(*[np.asarray(x, float) for part in parts for x in part])
    se, df = np.stack(both[0::2]), np.stack(both[1::2])
    total = (se**2).sum(axis=0)
    dfw = _welch_satterthwaite_df(se, df)
    q = 1 - alpha / 2
    half = np.where(total == 0, 0.0, special.stdtrit(dfw, q) * np.sqrt(total))
    with np.errstate(invalid="ignore"):
        own = np.where(se > 0, special.stdtrit(np.where(se > 0, df, 1.0), q) * se, 0.0)
    floor = own.max(axis=0)
    wins = floor > half * (1 + 1e-12)  # a part's own interval is wider: the floor holds
    half, dfw = np.where(wins, floor, half), np.array(dfw, float)
    low = np.where(se > 0, df, np.inf).min(axis=0)
    for i in map(tuple, np.argwhere(wins)):  # argwhere of a 0-d array: one index ()
        dfw[i] = _df_for_half(half[i] / math.sqrt(total[i]), q, low[i], dfw[i])
    est = np.asarray(estimate, float)
    out = {"se": np.sqrt(total), "df": dfw, "half": half}
    out = {k: float(v) if np.ndim(v) == 0 else v for k, v in out.items()}
    lo, hi = est - half, est + half
    out["ci"] = (float(lo), float(hi)) if np.ndim(lo) == 0 else (lo, hi)
    return out


def _welch_satterthwaite_df(se: np.ndarray, df: np.ndarray) -> np.ndarray:
    """``(Σ se_i²)² / Σ (se_i⁴ / df_i)`` over axis 0 (parts); inf when every se is 0."""
    var = se**2
    total = var.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a part with se = 0 has var²/df = 0 whatever its df: it carries no weight
        weight = np.where(var > 0, var**2 / np.where(df > 0, df, NAN), 0.0)
        dfw = np.where(total > 0, total**2 / weight.sum(axis=0), np.inf)
    return np.where(np.isnan(total), NAN, dfw)


def _df_for_half(t: float, q: float, low: float, high: float) -> float:
    """The df at which ``t_{q, df} = t``, by brentq on [low, high]."""

    def excess(d: float) -> float:  # decreasing in d
        return float(special.stdtrit(d, q)) - t

    if excess(high) >= 0:
        return high
    return float(optimize.brentq(excess, low, high, xtol=1e-12, rtol=1e-14))


def verdict_text(
    r: dict[str, Any], margin: float, alpha: float, unit: str = "nats", evidence: str | None = None
) -> str:
    """The verdict words of a ``paired_difference`` result at ``margin`` (in ``unit``);
    ``evidence``: what shows the difference (default: the 1−alpha CI excludes 0)."""
    if r["n"] < 2:
        return "not shown equivalent (n < 2)"
    conf = evidence or f"{ci_name(alpha)} {fmt_ci(r['ci'])} excludes 0"
    equivalent, detectable = r["equivalent"], r["detectable"]
    if equivalent and detectable:
        return f"equivalent within {margin:.4g} {unit}; the difference is detectable: {conf}"
    if equivalent:
        return f"equivalent within {margin:.4g} {unit}"
    if detectable:
        return f"different: {conf}; not shown equivalent within {margin:.4g} {unit}"
    return "not shown equivalent"


def paired_difference(
    diffs: list[float], margin: float, alpha: float = 0.05, unit: str = "nats"
) -> dict[str, Any]:
    """Per-seed differences, variant − baseline, in ``unit``: n, mean, std, ``ci`` (1−alpha),
    ``ci_tost`` (1−2·alpha), ``p_lower`` / ``p_upper`` (TOST, Schuirmann 1987), ``equivalent``,
    ``detectable``, ``verdict``."""
    d = describe(diffs)
    out = {**d, "ci": (NAN, NAN), "ci_tost": (NAN, NAN), "p_lower": NAN, "p_upper": NAN}
    out |= {"equivalent": False, "detectable": False}
    if d["n"] < 2:
        return {**out, "verdict": verdict_text(out, margin, alpha, unit)}
    df, se = d["n"] - 1, d["std"] / math.sqrt(d["n"])
    with np.errstate(divide="ignore", invalid="ignore"):  # se = 0: t = ±inf, p = 0 or 1
        out["p_lower"] = float(stats.t.sf(np.float64(d["mean"] + margin) / se, df))
        out["p_upper"] = float(stats.t.cdf(np.float64(d["mean"] - margin) / se, df))
    out["ci"], out["ci_tost"] = t_interval(diffs, 1 - alpha), t_interval(diffs, 1 - 2 * alpha)
    out["equivalent"] = bool(-margin < out["ci_tost"][0] and out["ci_tost"][1] < margin)
    out["detectable"] = bool(out["ci"][0] > 0 or out["ci"][1] < 0)
    return {**out, "verdict": verdict_text(out, margin, alpha, unit)}


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in order; a nan p stays nan, uncounted."""
    finite = sorted((p, i) for i, p in enumerate(pvalues) if math.isfinite(p))
    out = [NAN] * len(pvalues)
    running = 0.0
    for j, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - j) * p))
        out[i] = running
    return out


def holm_verdicts(
    comparisons: list[dict[str, Any]], margin: float, alpha: float, unit: str = "nats"
) -> list[dict[str, Any]]:
    """Per ``paired_difference`` result of a family: ``p_tost``, ``p_diff`` (two-sided),
    Holm-adjusted, ``equivalent`` / ``detectable`` at adjusted p < alpha, the ``verdict`` words."""
    p_tost = [max(c["p_lower"], c["p_upper"]) if c["n"] >= 2 else NAN for c in comparisons]
    p_diff = [p_two_sided(c) for c in comparisons]
    out = []
    for c, pt, pd, at, ad in zip(
        comparisons, p_tost, p_diff, holm(p_tost), holm(p_diff), strict=True
    ):
        r = {"n": c["n"], "ci": c["ci"], "equivalent": at < alpha, "detectable": ad < alpha}
        r |= {"p_tost": pt, "p_diff": pd, "p_tost_holm": at, "p_diff_holm": ad}
        why = f"Holm-adjusted p = {ad:.3g} < {alpha:g}"
        out.append({**r, "verdict": verdict_text(r, margin, alpha, unit, why)})
    return out


def p_two_sided(c: dict[str, Any]) -> float:
    """Two-sided paired t-test p of a zero mean (nan when n < 2; 0 or 1 when the std is 0)."""
    if c["n"] < 2:
        return NAN
    se = c["std"] / math.sqrt(c["n"])
    with np.errstate(divide="ignore", invalid="ignore"):
        t = abs(np.float64(c["mean"]) / se)
    return float(2 * stats.t.sf(t, c["n"] - 1)) if math.isfinite(t) else float(c["mean"] == 0)


def ratio_interval(ratios: list[float], alpha: float = 0.05) -> dict[str, Any]:
    """Ratios: n, geometric mean, ``se_log`` and ``df`` = n − 1 of log r, the 1−alpha t interval on
    log r exponentiated; se_log, df, ci nan when n < 2."""
    logs = np.log(np.asarray(ratios, float))
    out = {"n": int(logs.size), "gmean": float(np.exp(logs.mean())) if logs.size else NAN}
    if logs.size < 2:
        return {**out, "ci": (NAN, NAN), "se_log": NAN, "df": NAN}
    se, df = float(logs.std(ddof=1) / math.sqrt(logs.size)), logs.size - 1
    lo, hi = combined_interval([(se, df)], float(logs.mean()), alpha)["ci"]
    return {**out, "ci": (math.exp(lo), math.exp(hi)), "se_log": se, "df": df}


def sign_test(ratios: list[float]) -> dict[str, Any]:
    """Exact two-sided sign test of a median ratio of 1: ``below``, ``above`` (ties out), ``p``."""
    r = np.asarray(ratios, float)
    below, above = int((r < 1).sum()), int((r > 1).sum())
    p = stats.binomtest(below, below + above, 0.5).pvalue if below + above else NAN
    return {"below": below, "above": above, "p": float(p)}


def tost_power(n: int, std: float, margin: float, alpha: float = 0.05, delta: float = 0.0) -> float:
    """Paired TOST power at ``margin``, ``n`` normal differences (``delta``, ``std``), exact over
    the sample std (Phillips 1990, J. Pharmacokinet. Biopharm. 18:137); nan when n < 2."""
    if n < 2 or not math.isfinite(std) or std < 0 or not margin > 0:
        return NAN
    if std == 0:
        return float(abs(delta) < margin)
    df, se = n - 1, std / math.sqrt(n)
    tc = stats.t.ppf(1 - alpha, df)
    q_max = df * (margin * math.sqrt(n) / (tc * std)) ** 2  # beyond it the region is empty
    u_max = float(stats.chi2.cdf(q_max, df))

    def given_s(u: float) -> float:
        s = std * math.sqrt(stats.chi2.ppf(u, df) / df)
        h = margin - tc * s / math.sqrt(n)  # half-width of the region the mean must fall in
        return float(stats.norm.cdf((h - delta) / se) - stats.norm.cdf((-h - delta) / se))

    if u_max <= 0:
        return 0.0
    val, _ = integrate.quad(given_s, 0.0, u_max, limit=200)
    return float(min(1.0, max(0.0, val)))


def std_upper(std: float, n: int, alpha: float = 0.05) -> float:
    """1−alpha upper bound of a normal std: std · sqrt((n − 1) / χ²_{alpha, n−1}); nan if n < 2."""
    if n < 2 or not math.isfinite(std):
        return NAN
    return float(std * math.sqrt((n - 1) / stats.chi2.ppf(alpha, n - 1)))


def seeds_needed(
    std: float, margin: float, alpha: float = 0.05, power: float = POWER, delta: float = 0.0
) -> int | None:
    """Fewest paired seeds n >= 2 whose ``tost_power`` reaches ``power``; None when std is not
    finite, |delta| >= margin, or n > ``MAX_SEEDS``."""
    if not math.isfinite(std) or not math.isfinite(delta) or abs(delta) >= margin:
        return None
    if tost_power(2, std, margin, alpha, delta) >= power:
        return 2
    lo, hi = 2, 4
    while tost_power(hi, std, margin, alpha, delta) < power:
        lo, hi = hi, hi * 2
        if lo > MAX_SEEDS:
            return None
    while hi - lo > 1:  # power(lo) < target <= power(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if tost_power(mid, std, margin, alpha, delta) >= power else (mid, hi)
    return hi


# --- the compute-equivalent verdict --------------------------------------------------------------


def steps_to_reach(steps: list[float], losses: list[float], target: float) -> float:
    """Step at which the curve's running minimum first reaches ``target`` (linear between
    evaluations; nan: never). Raises ValueError: lengths differ or fewer than 2 points."""
    s, loss = np.asarray(steps, float), np.asarray(losses, float)
    if s.shape != loss.shape or s.size < 2:
        raise ValueError(
            f"need >= 2 (step, loss) points of equal length, got {s.size}, {loss.size}"
        )
    best = np.minimum.accumulate(loss)
    hit = np.flatnonzero(best <= target)
    if hit.size == 0:
        return NAN
    i = int(hit[0])
    if i == 0:
        return float(s[0])
    y0, y1 = best[i - 1], best[i]
    frac = (y0 - target) / (y0 - y1) if y0 > y1 else 1.0
    return float(s[i - 1] + frac * (s[i] - s[i - 1]))


def step_multiplier(
    base: tuple[list[float], list[float]], var: tuple[list[float], list[float]]
) -> float:
    """Baseline steps one variant step is worth at the variant's final loss, inside two paired
    curves ``(steps, losses)`` up to their last shared step; else nan."""
    (sb, lb), (sv, lv) = base, var
    end = min(sb[-1], sv[-1])
    lb_end = float(np.interp(end, sb, lb))
    lv_end = float(np.interp(end, sv, lv))
    if lv_end >= lb_end:
        return steps_to_reach(sb, lb, lv_end) / end
    return end / steps_to_reach(sv, lv, lb_end)


def _annealed_steps_to_reach(budgets: np.ndarray, losses: np.ndarray, target: float) -> float:
    """Budget where annealed points reach ``target``: PCHIP on ln T (Fritsch & Carlson 1980) or
    nan."""
    x, best = np.log(budgets), np.minimum.accumulate(losses)
    hit = np.flatnonzero(best <= target)
    if losses[0] < target or hit.size == 0:  # reached before the smallest budget, or never
        return NAN
    i = int(hit[0])
    if best[i] == target:
        return float(budgets[i])
    if not math.isfinite(best[i - 1]):  # crossed from an infinite loss: where is unknown
        return NAN
    keep = np.isfinite(best)  # a nan stops the running minimum: the points after it are left out
    curve = interpolate.PchipInterpolator(x[keep], best[keep])  # non-increasing: monotone pieces
    return math.exp(optimize.brentq(lambda u: float(curve(u)) - target, x[i - 1], x[i]))


def annealed_step_multiplier(
    base: tuple[list[float], list[float]], var: tuple[list[float], list[float]]
) -> float:
    """``step_multiplier`` on annealed points ``(budgets, losses)`` at the largest shared budget;
    nan when none. Raises ValueError: budgets and losses differ in length or are fewer than 2."""
    tb, lb = (np.asarray(x, float) for x in base)
    tv, lv = (np.asarray(x, float) for x in var)
    if tb.shape != lb.shape or tv.shape != lv.shape or min(tb.size, tv.size) < 2:
        raise ValueError("need >= 2 (budget, loss) points of equal length per run")
    shared = np.intersect1d(tb, tv)
    if shared.size == 0:
        return NAN
    end = float(shared[-1])
    lb_end, lv_end = float(lb[tb == end][0]), float(lv[tv == end][0])
    if lv_end >= lb_end:
        return _annealed_steps_to_reach(tb, lb, lv_end) / end
    return end / _annealed_steps_to_reach(tv, lv, lb_end)


def annealed_slope(budgets: list[float], losses: list[float]) -> float:
    """``-dL/d ln T`` of annealed points (nats per e-fold of steps), least squares. Raises
    ValueError: fewer than 2 finite points with a positive budget."""
    t, loss = np.asarray(budgets, float), np.asarray(losses, float)
    keep = (t > 0) & np.isfinite(loss)
    if keep.sum() < 2:
        raise ValueError("annealed_slope needs >= 2 annealed points")
    return float(-np.polyfit(np.log(t[keep]), loss[keep], 1)[0])


def compute_multiplier(
    step_mults: list[float],
    speed: list[float] | float,
    speed_se: tuple[float, float] | None = None,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """``{"n", "k", "ci", "step_mult", "speed", "se_log", "df"}``: k = m x t_base / t_var paired
    across seeds, geometric mean, interval on log k; ``speed_se``: the bench's log ``(se, df)``."""
    m = np.asarray(step_mults, float)
    sp = np.broadcast_to(np.asarray(speed, float), m.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        logk = np.log(m) + np.log(sp)
    ok = np.isfinite(logk)
    n = int(ok.sum())
    out: dict[str, Any] = {"n": n, "k": NAN, "ci": (NAN, NAN), "step_mult": NAN, "speed": NAN}
    out |= {"se_log": NAN, "df": NAN}
    if n == 0:
        return out
    logk = logk[ok]
    out["step_mult"] = float(np.exp(np.log(m[ok]).mean()))
    out["speed"] = float(np.exp(np.log(sp[ok]).mean()))
    out["k"] = float(np.exp(logk.mean()))
    if n < 2:
        return out
    parts = [(float(logk.std(ddof=1) / math.sqrt(n)), n - 1)]
    if speed_se is not None and np.ndim(speed) == 0 and all(map(math.isfinite, speed_se)):
        parts.append(speed_se)
    c = combined_interval(parts, float(logk.mean()), alpha)
    out["ci"] = (math.exp(c["ci"][0]), math.exp(c["ci"][1]))
    return out | {"se_log": c["se"], "df": c["df"]}


def end_slope(steps: list[float], losses: list[float], points: int = 4) -> float:
    """``-dL/d ln(step)`` over a curve's last ``points`` evaluations after step 0 (nats per e-fold
    of steps). Raises ValueError: fewer than 2 evaluations after step 0."""
    s, loss = np.asarray(steps, float), np.asarray(losses, float)
    keep = (s > 0) & np.isfinite(loss)
    s, loss = s[keep][-points:], loss[keep][-points:]
    if s.size < 2:
        raise ValueError("end_slope needs >= 2 evaluations after step 0")
    return float(-np.polyfit(np.log(s), loss, 1)[0])


def nats_for_compute(fraction: float, slope: float) -> float:
    """Nats/token ``fraction`` more compute is worth: ``slope * ln(1 + fraction)``."""
    return slope * math.log1p(fraction)


def compute_for_nats(nats: float, slope: float) -> float:
    """Compute fraction ``nats`` is worth, inverse of ``nats_for_compute`` (inf when slope <= 0)."""
    return math.expm1(nats / slope) if slope > 0 else math.inf
