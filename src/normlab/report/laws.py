"""The ladder's statistics across sizes: the law L = E + A (C/C0)^-alpha fitted to the size means
with its lack-of-fit F test and leave-largest-out check, and the weighted trend of a multiplier with
parameters. Losses in nats/token, compute in FLOPs.

Why: docs/reports.md
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import optimize, stats

from normlab.report.runs import ReportError
from normlab.report.stats import NAN, combined_interval

#: The extrapolation target: GPT-2 small, 124M parameters as ``model.num_params`` counts them.
TARGET_PARAMS = 124e6
#: The two forms of the loss-compute law, with a fitted floor E and without.
FULL, PURE = "E + A (C/C0)^-alpha", "A (C/C0)^-alpha"
#: The parameters each form fits.
N_PARAMS = {FULL: 3, PURE: 2}


# --- loss against compute: the fitted power law --------------------------------------------------


def _log_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Least squares y = b0 + b1 x: coefficients, covariance (nan with no df), df."""
    coef, cov = np.polyfit(x, y, 1, cov="unscaled") if x.size > 2 else (np.polyfit(x, y, 1), None)
    dof = x.size - 2
    if cov is None:
        return coef[::-1], np.full((2, 2), NAN), dof
    resid = y - np.polyval(coef, x)
    return coef[::-1], cov[::-1, ::-1] * float(resid @ resid) / dof, dof


def _pure_law(c: np.ndarray, loss: np.ndarray, c0: float, why: str, alpha: float) -> dict:
    """L = A (C/C0)^-alpha: a straight line of ln L on ln(C/C0) (``why``: why not the full form)."""
    (ln_a, slope), cov, dof = _log_fit(np.log(c / c0), np.log(loss))
    a = math.exp(ln_a)
    se = {"E": NAN, "A": a * math.sqrt(cov[0, 0]), "alpha": math.sqrt(cov[1, 1])}
    params = {"E": NAN, "A": a, "alpha": -slope}
    return _law(PURE, params, se, n=c.size, dof=dof, c0=c0, why=why, alpha=alpha)


def _law(
    form: str,
    params: dict[str, float],
    se: dict[str, float],
    *,
    n: int,
    dof: int,
    c0: float,
    why: str | None,
    alpha: float,
) -> dict[str, Any]:
    """A fitted law as ``fit_power_law`` returns it, with alpha's t interval (nan with no df)."""
    q = stats.t.ppf(1 - alpha / 2, dof) if dof >= 1 else NAN
    half = q * se["alpha"]
    ci = (params["alpha"] - half, params["alpha"] + half) if math.isfinite(half) else (NAN, NAN)
    out = {"form": form, **params, "se": se, "alpha_ci": ci, "n": n, "dof": dof, "c0": c0}
    return {**out, "why": why}


def _full_start(x: np.ndarray, loss: np.ndarray) -> tuple[float, float, float]:
    """Start for L = E + A x^-alpha: the E below the lowest loss whose log-log line fits best."""
    best = (math.inf, 0.0, 1.0, 0.1)
    for e in np.linspace(0.0, 0.98 * loss.min(), 50):
        coef = np.polyfit(np.log(x), np.log(loss - e), 1)
        sse = float(np.sum((np.polyval(coef, np.log(x)) - np.log(loss - e)) ** 2))
        best = min(best, (sse, float(e), math.exp(coef[1]), max(-coef[0], 1e-3)))
    return best[1], best[2], best[3]


def _full_law(
    x: np.ndarray, loss: np.ndarray, c0: float, alpha: float, strict: bool
) -> dict[str, Any] | str:
    """L = E + A x^-alpha by bounded least squares (covariance on x.size − 3 df), or why not: no
    convergence, no finite covariance, or (``strict``) E at a bound."""
    try:
        p, cov = optimize.curve_fit(
            lambda x, e, a, al: e + a * x**-al,
            x,
            loss,
            p0=_full_start(x, loss),
            bounds=([0.0, 1e-12, 1e-6], [loss.min(), np.inf, 10.0]),
            maxfev=20000,
            absolute_sigma=True,  # (J'J)^-1 unscaled: curve_fit's own scaling needs a dof
        )
    except (RuntimeError, ValueError) as e:
        return f"E + A C^-alpha did not converge ({e})"
    if not np.all(np.isfinite(cov)):
        return "E + A C^-alpha has no finite covariance (E, A, alpha not separately identified)"
    if strict and (p[0] <= 1e-6 * loss.min() or p[0] >= (1 - 1e-6) * loss.min()):
        return f"E + A C^-alpha put E at its bound ({p[0]:.3g}): the data show no loss floor"
    dof = x.size - 3
    resid = loss - (p[0] + p[1] * x ** -p[2])
    var = float(resid @ resid) / dof if dof > 0 else NAN
    names = ("E", "A", "alpha")
    params = dict(zip(names, map(float, p), strict=True))
    errs = dict(zip(names, map(float, np.sqrt(np.diag(cov) * var)), strict=True))
    return _law(FULL, params, errs, n=x.size, dof=dof, c0=c0, why=None, alpha=alpha)


def fit_power_law(
    compute: list[float], losses: list[float], alpha: float = 0.05, form: str | None = None
) -> dict:
    """``form``, ``E``, ``A``, ``alpha``, ``se``, ``alpha_ci``, ``dof``, ``n``, ``c0``, ``why``: the
    law of L (nats/token) on C (FLOPs), one point per size. Raises ReportError: too few points or
    distinct C, or a forced full form that fails."""
    c, loss = np.asarray(compute, float), np.asarray(losses, float)
    ok = np.isfinite(c) & np.isfinite(loss) & (c > 0) & (loss > 0)
    c, loss = c[ok], loss[ok]
    need = N_PARAMS[form] if form else 2
    if c.size < need or np.unique(c).size < 2:
        raise ReportError(f"{form or 'a power law'} needs >= {need} sizes, has {c.size}")
    c0 = float(np.exp(np.log(c).mean()))
    if form == PURE or (form is None and c.size < 4):
        why = f"{c.size} sizes: E + A C^-alpha's 3 parameters would leave no degree of freedom"
        return _pure_law(c, loss, c0, why if form is None else "the form asked for", alpha)
    full = _full_law(c / c0, loss, c0, alpha, strict=form is None)
    if isinstance(full, dict):
        return full
    if form == FULL:
        raise ReportError(full)
    return _pure_law(c, loss, c0, full, alpha)


def law_value(law: dict[str, Any], compute: np.ndarray) -> np.ndarray:
    """The fitted law (``fit_power_law``) at ``compute`` (FLOPs): loss in nats/token."""
    e = 0.0 if math.isnan(law["E"]) else law["E"]
    return e + law["A"] * (np.asarray(compute, float) / law["c0"]) ** -law["alpha"]


def usable(point: dict[str, Any]) -> bool:
    """Whether a ``Ladder.points`` point can enter a law: compute > 0 and a finite final loss."""
    return point["compute"] > 0 and math.isfinite(point["loss"])


def size_means(points: list[dict[str, Any]], shapes: list[str]) -> list[dict[str, Any]]:
    """Per shape of ``shapes`` with a finite run: ``shape``, ``compute`` (geometric mean, FLOPs),
    ``loss`` (mean, nats/token), ``losses``, ``n``."""
    out = []
    for shape in shapes:
        pts = [p for p in points if p["shape"] == shape and usable(p)]
        if pts:
            losses = [p["loss"] for p in pts]
            c = float(np.exp(np.mean(np.log([p["compute"] for p in pts]))))
            row = {"shape": shape, "compute": c, "loss": float(np.mean(losses)), "losses": losses}
            out.append({**row, "n": len(pts)})
    return out


def lack_of_fit(law: dict[str, Any], means: list[dict[str, Any]]) -> dict[str, Any]:
    """Lack-of-fit F test of ``law`` against the seeds' scatter: ``F``, ``p`` (nan when a df is 0),
    ``df_lof``, ``df_pe``, ``ss_lof``, ``ss_pe`` (nats²)."""
    k, runs = len(means), sum(m["n"] for m in means)
    df_lof, df_pe = k - N_PARAMS[law["form"]], runs - k
    fitted = law_value(law, np.array([m["compute"] for m in means]))
    ss_lof = float(sum(m["n"] * (m["loss"] - f) ** 2 for m, f in zip(means, fitted, strict=True)))
    ss_pe = float(sum((x - m["loss"]) ** 2 for m in means for x in m["losses"]))
    out = {"F": NAN, "p": NAN, "df_lof": df_lof, "df_pe": df_pe, "ss_lof": ss_lof, "ss_pe": ss_pe}
    if df_lof > 0 and df_pe > 0:
        with np.errstate(divide="ignore", invalid="ignore"):  # no seed scatter: F = inf, p = 0
            f = np.float64(ss_lof / df_lof) / np.float64(ss_pe / df_pe)
        out |= {"F": float(f), "p": float(stats.f.sf(f, df_lof, df_pe))}
    return out


def leave_largest_out(
    law: dict[str, Any], means: list[dict[str, Any]], alpha: float = 0.05
) -> dict[str, Any]:
    """``law`` refitted without the largest size, read at its compute: ``shape``, ``predicted``,
    ``measured``, ``error`` (nats/token), ``why`` (None, or why there is none)."""
    last = means[-1]
    out = {"shape": last["shape"], "measured": last["loss"], "predicted": NAN, "error": NAN}
    rest = means[:-1]
    try:
        fit = fit_power_law(
            [m["compute"] for m in rest], [m["loss"] for m in rest], alpha, law["form"]
        )
    except ReportError as e:
        return {**out, "why": str(e)}
    pred = float(law_value(fit, np.array([last["compute"]]))[0])
    return {**out, "predicted": pred, "error": pred - last["loss"], "why": None}


def ladder_law(points: list[dict[str, Any]], shapes: list[str], alpha: float) -> dict[str, Any]:
    """One variant's ``fit_power_law`` over ``shapes`` with ``means``, ``runs``, ``lof``, ``loo``;
    too few sizes: ``form`` None, ``why``, numbers nan."""
    means = size_means(points, shapes)
    runs = sum(m["n"] for m in means)
    try:
        law = fit_power_law([m["compute"] for m in means], [m["loss"] for m in means], alpha)
    except ReportError as e:
        se = {"E": NAN, "A": NAN, "alpha": NAN}
        none = {"form": None, "E": NAN, "A": NAN, "alpha": NAN, "se": se, "alpha_ci": (NAN, NAN)}
        none |= {"n": len(means), "dof": len(means) - 2, "c0": NAN, "why": str(e)}
        return {**none, "means": means, "runs": runs, "lof": None, "loo": None}
    extra = {"lof": lack_of_fit(law, means), "loo": leave_largest_out(law, means, alpha)}
    return {**law, "means": means, "runs": runs, **extra}


def law_sizes(
    shapes: list[str], points: dict[str, list[dict[str, Any]]]
) -> tuple[list[str], dict[str, str]]:
    """Shapes where every variant has a ``usable`` point, and per other shape why not."""
    keep, left_out = [], {}
    for shape in shapes:
        runs = {lab: [p for p in pts if p["shape"] == shape] for lab, pts in points.items()}
        absent = [lab for lab, pts in runs.items() if not pts]
        blind = [lab for lab, pts in runs.items() if pts and not any(map(usable, pts))]
        why = ["no completed run of " + ", ".join(absent)] if absent else []
        if blind:
            why.append(f"no training compute for {', '.join(blind)} (params or tokens unknown)")
        if why:
            left_out[shape] = "; ".join(why)
        else:
            keep.append(shape)
    return keep, left_out


# --- the multiplier across sizes: its trend and the extrapolation --------------------------------


def _trend_df(m: int, coef: np.ndarray, se: np.ndarray, df: np.ndarray, weighted: bool) -> float:
    """A trend's df over ``m`` sizes: m − 2, or less (Welch-Satterthwaite); nan if m < 3."""
    if m <= 2:
        return NAN
    if not (weighted and np.all(np.isfinite(df) & (df > 0))):
        return float(m - 2)
    parts = list(zip(np.abs(coef) * se, df, strict=True))
    return min(float(m - 2), combined_interval(parts, 0.0)["df"])


def multiplier_trend(
    params: list[float],
    ks: list[float],
    se: list[float],
    alpha: float = 0.05,
    target: float = TARGET_PARAMS,
    df: list[float] | None = None,
) -> dict[str, Any]:
    """Weighted least squares ln k = a + b (ln N − x̄), one point per size: ``n``, ``weighted``,
    ``slope``, ``slope_ci``, ``slope_df``, ``x_ref``, ``intercept``, ``at_target``; nan if n < 3."""
    x, y, s = (np.asarray(v, float) for v in (params, ks, se))
    d = np.asarray([NAN] * x.size if df is None else df, float)
    ok = np.isfinite(x) & (x > 0) & np.isfinite(y) & (y > 0)
    x, y, s, d = np.log(x[ok]), np.log(y[ok]), s[ok], d[ok]
    m = int(x.size)
    weighted = m > 0 and bool(np.all(np.isfinite(s) & (s > 0)))
    out: dict[str, Any] = {"n": m, "weighted": weighted, "slope": NAN, "slope_ci": (NAN, NAN)}
    out |= {"slope_df": NAN, "x_ref": NAN, "intercept": NAN}
    out["at_target"] = {"params": target, "k": NAN, "ci": (NAN, NAN), "df": NAN, "beyond": NAN}
    if m < 2 or np.unique(x).size < 2:
        return out
    w = 1 / s**2 if weighted else np.ones(m)
    xr = float(w @ x / w.sum())
    sxx = float(w @ (x - xr) ** 2)
    b = float(w @ ((x - xr) * y) / sxx)
    a = float(w @ y / w.sum())
    chi2 = float(w @ (y - a - b * (x - xr)) ** 2)
    scale = (max(1.0, chi2 / (m - 2)) if weighted else chi2 / (m - 2)) if m > 2 else NAN
    x0 = math.log(target) - xr
    coef_b = w * (x - xr) / sxx  # b = sum coef_b ln k; the line at target: a + x0 b
    df_b, df_0 = (_trend_df(m, c, s, d, weighted) for c in (coef_b, w / w.sum() + x0 * coef_b))
    q_b, q_0 = (stats.t.ppf(1 - alpha / 2, v) if v >= 1 else NAN for v in (df_b, df_0))
    se_b, se_a = math.sqrt(scale / sxx), math.sqrt(scale / w.sum())
    y0, se0 = a + b * x0, math.hypot(se_a, x0 * se_b)
    out |= {"slope": b, "slope_ci": (b - q_b * se_b, b + q_b * se_b), "slope_df": df_b}
    out |= {"x_ref": xr, "intercept": a}
    out["at_target"] |= {"k": math.exp(y0), "df": df_0, "beyond": target / math.exp(x.max())}
    out["at_target"]["ci"] = (math.exp(y0 - q_0 * se0), math.exp(y0 + q_0 * se0))
    return out


def trend_value(trend: dict[str, Any], params: np.ndarray) -> np.ndarray:
    """The multiplier k of the trend at ``params``."""
    x = np.log(np.asarray(params, float)) - trend["x_ref"]
    return np.exp(trend["intercept"] + trend["slope"] * x)
