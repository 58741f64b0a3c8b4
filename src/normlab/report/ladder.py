"""The model-size ladder: one comparison (the same variants, paired by seed) repeated at several
model sizes, read as a trend. Runs are grouped by model shape (``model.n_layer``, ``model.d_model``,
``model.n_head``); each size gets the full report of :func:`~normlab.report.compare.build_report`
(its paired loss difference and compute-equivalent multiplier); across sizes:

- per variant, final validation loss against training compute C (FLOPs: the model's
  6 N + 12 L d T per token, Kaplan et al. 2020, times the tokens the run trained on) with a
  power law L = E + A (C/C0)^-alpha, or L = A (C/C0)^-alpha where the data do not support the
  fitted floor E (:func:`fit_power_law` says which and why), fitted to the size means (one point
  per size, over the sizes every variant has: :func:`law_sizes`), beside its lack-of-fit F test
  against seed noise (:func:`lack_of_fit`) and its leave-largest-out prediction
  (:func:`leave_largest_out`): :func:`ladder_law`;
- per variant, the trend of the step multiplier m (the steps part of the compute-equivalent
  multiplier; the speed part is a machine's, reported per size) with parameters: a weighted
  straight line of ln m on ln N (:func:`multiplier_trend`), its slope with a CI, and its value at
  :data:`TARGET_PARAMS` (GPT-2 small) only when both laws pass the leave-largest-out check.

N is ``summary.json``'s ``params`` (``model.num_params``: every weight but the position
embedding, the token embedding tied with the head counted once). Losses in nats/token, compute in
FLOPs. Nothing here writes files (see :func:`normlab.report.write_ladder`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, stats

from normlab.report.compare import DEFAULT_MARGIN, Report, build_report, tokens_seen
from normlab.report.runs import (
    NAN,
    ReportError,
    Run,
    design_tag,
    load_runs,
    never_trained,
    override_key,
)
from normlab.report.stats import combined_interval, finite_median, ratio_interval

#: The extrapolation target: GPT-2 small, 124M parameters as ``model.num_params`` counts them.
TARGET_PARAMS = 124e6
#: The two forms of the loss-compute law, with a fitted floor E and without.
FULL, PURE = "E + A (C/C0)^-alpha", "A (C/C0)^-alpha"
#: The parameters each form fits.
N_PARAMS = {FULL: 3, PURE: 2}
#: The config keys whose values make a model size.
SIZE_KEYS = ("model.n_layer", "model.d_model", "model.n_head")
#: Runs of one size sharing every override but these are one variant's seeds (or one rung's).
NOT_A_VARIANT = ("seed",)


@dataclass
class Ladder:
    """Everything the ladder report says. ``sizes``: per size, smallest first,
    ``{"shape": "4x128", "params": N, "tokens": median tokens, "compute", "report": Report,
    "names": {ladder label: the report's label}}`` (:func:`included`, :func:`comparison_at`
    read a size through its names); ``points``:
    per variant label, ``{"params", "compute", "loss", "seed", "shape"}`` per completed run;
    ``law_sizes``, ``left_out``: :func:`law_sizes`; ``laws``: per label, :func:`ladder_law`;
    ``trends``: per non-baseline label, :func:`multiplier_trend` of the step multiplier plus
    ``"sizes"`` (shape, params, m, ci, n, se, df per size with the variant) and
    ``at_target["refused"]`` (why there is no 124M value; None when there is)."""

    sources: list[Path]
    alpha: float
    baseline: str
    labels: list[str]
    sizes: list[dict[str, Any]]
    law_sizes: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    points: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    laws: dict[str, dict[str, Any]] = field(default_factory=dict)
    trends: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: dict[str, Path | None] = field(default_factory=dict)


def size_of(run: Run) -> tuple[int, ...] | None:
    """``(n_layer, d_model, n_head)`` of the run's model (:data:`SIZE_KEYS`, resolved config);
    None when a key is missing."""
    vals = [run.resolved(k) for k in SIZE_KEYS]
    return tuple(int(v) for v in vals) if all(isinstance(v, int) for v in vals) else None


def shape_name(size: tuple[int, ...]) -> str:
    """``(4, 128, 4)`` -> ``"4x128"`` (layers x width)."""
    return f"{size[0]}x{size[1]}"


def _variant_key(run: Run) -> frozenset[str]:
    return frozenset(o for o in run.overrides if override_key(o) not in NOT_A_VARIANT)


def group_by_size(runs: list[Run]) -> dict[tuple[int, ...], list[Run]]:
    """The runs that trained (:func:`~normlab.report.runs.never_trained` aside) grouped by
    :func:`size_of`, smallest size (params, then shape) first; runs without a size left out."""
    groups: dict[tuple[int, ...], list[Run]] = {}
    for r in runs:
        size = size_of(r)
        if size is not None and never_trained(r) is None:
            groups.setdefault(size, []).append(r)

    def order(item: tuple[tuple[int, ...], list[Run]]) -> tuple[float, tuple[int, ...]]:
        return (finite_median([r.summary_float("params") for r in item[1]]), item[0])

    return dict(sorted(groups.items(), key=order))


def is_ladder(runs: list[Run]) -> bool:
    """True when ``runs`` hold at least 2 model sizes and some size holds at least 2 variants
    (runs whose overrides differ in more than the seed): a comparison repeated across sizes.
    A sweep whose only variants are sizes (``model=tiny,small``) is an ordinary comparison."""
    groups = group_by_size(runs)
    return len(groups) >= 2 and any(len({_variant_key(r) for r in g}) >= 2 for g in groups.values())


def training_flops(run: Run) -> float:
    """Training compute of ``run`` in FLOPs: (6 N + 12 L d T) per token (``GPT.flops_per_token``:
    N = ``summary.json`` ``params``, L layers, d width, T context) times the tokens it trained on
    (:func:`~normlab.report.compare.tokens_seen`); nan when any part is unknown."""
    n = run.summary_float("params")
    dims = [run.resolved(k) for k in ("model.n_layer", "model.d_model", "model.context_length")]
    if not all(isinstance(v, int) for v in dims):
        return NAN
    layers, width, ctx = dims
    return (6.0 * n + 12.0 * layers * width * ctx) * tokens_seen(run)


# --- loss against compute: the fitted power law ---------------------------------------------------


def _log_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Least squares y = b0 + b1 x: the coefficients, their covariance (residual variance; nan
    with no degree of freedom) and the degrees of freedom."""
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
    """A fitted law as :func:`fit_power_law` returns it, with alpha's Student t interval (nan
    with no degree of freedom)."""
    q = stats.t.ppf(1 - alpha / 2, dof) if dof >= 1 else NAN
    half = q * se["alpha"]
    ci = (params["alpha"] - half, params["alpha"] + half) if math.isfinite(half) else (NAN, NAN)
    out = {"form": form, **params, "se": se, "alpha_ci": ci, "n": n, "dof": dof, "c0": c0}
    return {**out, "why": why}


def _full_start(x: np.ndarray, loss: np.ndarray) -> tuple[float, float, float]:
    """A start for L = E + A x^-alpha: the floor E on a grid below the lowest loss whose
    straight line of ln(L − E) on ln x fits best, with that line's A and alpha."""
    best = (math.inf, 0.0, 1.0, 0.1)
    for e in np.linspace(0.0, 0.98 * loss.min(), 50):
        coef = np.polyfit(np.log(x), np.log(loss - e), 1)
        sse = float(np.sum((np.polyval(coef, np.log(x)) - np.log(loss - e)) ** 2))
        best = min(best, (sse, float(e), math.exp(coef[1]), max(-coef[0], 1e-3)))
    return best[1], best[2], best[3]


def _full_law(
    x: np.ndarray, loss: np.ndarray, c0: float, alpha: float, strict: bool
) -> dict[str, Any] | str:
    """L = E + A x^-alpha (x = C/C0) by bounded least squares, or why not: no convergence, no
    finite covariance, or (``strict``) E at a bound. The covariance is (J'J)^-1 times the
    residual variance on x.size − 3 degrees of freedom (nan standard errors with none)."""
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
    """Final validation loss L (nats/token) against training compute C (FLOPs), one point per
    size (its mean: :func:`ladder_law`): L = E + A (C/C0)^-alpha (``scipy.optimize.curve_fit``,
    bounded: 0 <= E < min L, A > 0, 0 < alpha < 10; C0 = the geometric mean of C, so that A is
    the reducible loss there), when there are at least 4 points (a degree of freedom over its 3
    parameters), the fit converges with a finite covariance and E stays inside its bounds.
    Otherwise L = A (C/C0)^-alpha (a straight line on log-log axes), with ``why`` saying why.
    ``form`` (:data:`FULL` or :data:`PURE`) forces a form (E may then sit at a bound).

    Returns:
        ``form``, ``E`` (nan in the 2-parameter form), ``A``, ``alpha``; ``se`` of each (from
        the fit's covariance, scaled by the residual variance; nan with no degree of freedom);
        ``alpha_ci`` (1−``alpha`` Student t on ``dof`` = points − parameters; nan at 0);
        ``n`` (points); ``c0``; ``why`` (None for the full form).

    Raises:
        ReportError: fewer points with finite positive C and L than the form has parameters
            (2 unless forced), or fewer than 2 distinct C, or a forced full form that fails.
    """
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
    """The fitted law (:func:`fit_power_law`) at ``compute`` (FLOPs): loss in nats/token."""
    e = 0.0 if math.isnan(law["E"]) else law["E"]
    return e + law["A"] * (np.asarray(compute, float) / law["c0"]) ** -law["alpha"]


def usable(point: dict[str, Any]) -> bool:
    """Whether a point of :attr:`Ladder.points` can enter a law: a training compute > 0 (nan
    when the run records no ``params`` or tokens) and a finite final loss."""
    return point["compute"] > 0 and math.isfinite(point["loss"])


def size_means(points: list[dict[str, Any]], shapes: list[str]) -> list[dict[str, Any]]:
    """Per shape of ``shapes`` (in that order, smallest first), the mean of one variant's runs
    there (``points``: :attr:`Ladder.points`): ``{"shape", "compute"`` (geometric mean, FLOPs),
    ``"loss"`` (mean, nats/token), ``"losses"``, ``"n"}``; a shape without a finite run left out."""
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
    """The lack-of-fit F test of ``law`` (fitted to ``means``: :func:`size_means`) against pure
    seed error: SS_lof = sum over sizes of n_i (mean_i − law_i)² on K − P degrees of freedom,
    SS_pe = sum over runs of (loss − its size's mean)² on N − K; F = (SS_lof / df_lof) /
    (SS_pe / df_pe), p = P(F_{df_lof, df_pe} > F). Returns ``F``, ``p`` (nan when a df is 0),
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
    """``law``'s form refitted to every size of ``means`` but the largest (the last), read at
    the largest's compute. Returns ``shape`` (left out), ``predicted``, ``measured`` (its mean),
    ``error`` (predicted − measured, nats/token), ``why``: None, or why there is no prediction
    (fewer sizes left than the form has parameters), with the numbers nan."""
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
    """One variant's law over ``shapes``: :func:`fit_power_law` on its :func:`size_means`, plus
    ``means``, ``runs``, ``lof`` (:func:`lack_of_fit`) and ``loo`` (:func:`leave_largest_out`).
    With too few sizes for any law: ``form`` None, ``why`` the refusal, numbers nan, ``lof`` and
    ``loo`` None."""
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
    """The shapes (of ``shapes``, in order) where every variant of ``points`` (per label,
    :attr:`Ladder.points`) has a :func:`usable` point: the laws' sizes, so that every variant's
    law spans the same sizes and their alphas compare. Per other shape, why not: the variants
    with no completed run there, and those whose runs there record no training compute."""
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


# --- the multiplier across sizes: its trend and the extrapolation ---------------------------------


def _trend_df(m: int, coef: np.ndarray, se: np.ndarray, df: np.ndarray, weighted: bool) -> float:
    """Degrees of freedom of a trend's estimate sum coef_i ln k_i over ``m`` sizes: m − 2, or,
    weighted, the smaller of that and Welch–Satterthwaite's on each ln k's ``se`` and ``df``
    (the seeds' estimate of the weights: :func:`~normlab.report.stats.combined_interval`); nan
    with fewer than 3 sizes."""
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
    """The trend of a multiplier k (the ladder's: the step multiplier) with parameters N: least
    squares ln k = a + b (ln N − x̄), one point per size, weighted by 1/se² (``se``: the standard
    error of each ln k, on ``df`` degrees of freedom) when every size has one, else unweighted.
    Slope b: k grows as N^b (b = 0: no trend). Its covariance: weighted, (X'WX)^-1 times
    max(1, chi²/(m − 2)) (the scatter between sizes, when it exceeds what the seeds' errors
    explain, widens it); unweighted, times the residual variance. Intervals: Student t on
    :func:`_trend_df` (m sizes). At ``target`` parameters: the line's value,
    exp(a + b (ln target − x̄)), with the line's interval there (the trend's uncertainty, not a
    new run's seed noise): an extrapolation when ``target`` lies beyond the largest size.

    Returns:
        ``n`` (sizes), ``weighted``, ``slope``, ``slope_ci``, ``slope_df``, ``x_ref`` (x̄),
        ``intercept`` (a), ``at_target``: ``{"params", "k", "ci", "df", "beyond"}`` (beyond:
        target / largest N); intervals nan with fewer than 3 sizes, all nan with fewer than 2.
    """
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
    """The fitted trend (:func:`multiplier_trend`) at ``params``: the multiplier k."""
    x = np.log(np.asarray(params, float)) - trend["x_ref"]
    return np.exp(trend["intercept"] + trend["slope"] * x)


# --- the ladder ---------------------------------------------------------------------------------


def _size_row(size: tuple[int, ...], rep: Report) -> dict[str, Any]:
    done = [r for r in rep.runs if r.excluded is None and r.set_aside is None]
    return {
        "shape": shape_name(size),
        "params": finite_median([r.summary_float("params") for r in rep.runs]),
        "tokens": finite_median([tokens_seen(r) for r in done]),
        "compute": finite_median([training_flops(r) for r in done]),
        "report": rep,
    }


def _single_name(size: dict[str, Any], labels: list[str]) -> dict[str, str]:
    """A size of one variant labels it by its kind (no override differs there): the ladder label
    of ``labels`` whose overrides (or design tag) all its runs carry -> its own label.

    Raises:
        ReportError: no label, or several, fit.
    """
    rep = size["report"]
    own = rep.labels[0]
    fits = [
        lab
        for lab in labels
        if all(lab == design_tag(r) or set(lab.split(",")) <= set(r.overrides) for r in rep.runs)
    ]
    if len(fits) != 1:
        raise ReportError(
            f"model size {size['shape']}: its one variant ({own}) is "
            f"{'none' if not fits else 'more than one'} of the other sizes' ({', '.join(labels)})"
        )
    return {fits[0]: own}


def _labels(sizes: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, str]]]:
    """The variant labels of the ladder, the baseline (the same at each size) first, and per
    size its names for them (ladder label -> the size report's label; a variant the size lacks
    is absent: :func:`law_sizes` leaves that size out of the laws).

    Raises:
        ReportError: sizes with other baselines, or a one-variant size that matches no label.
    """
    multi = [s for s in sizes if len(s["report"].labels) > 1] or sizes
    base = multi[0]["report"].baseline
    for s in multi[1:]:
        if s["report"].baseline != base:
            raise ReportError(
                f"model size {s['shape']} has baseline {s['report'].baseline} but "
                f"{multi[0]['shape']} has {base}: a ladder compares against one baseline at "
                "every size (--baseline)"
            )
    labels = [base, *sorted({lab for s in multi for lab in s["report"].labels} - {base})]
    names = [
        {lab: lab for lab in s["report"].labels} if s in multi else _single_name(s, labels)
        for s in sizes
    ]
    return labels, names


def included(size: dict[str, Any], label: str) -> list[Run]:
    """The completed runs of ladder variant ``label`` at one size (none if it lacks it)."""
    own = size["names"].get(label)
    return size["report"].included(own) if own is not None else []


def comparison_at(size: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The comparison of variant ``label`` in one size's report (None: no such variant there)."""
    own = size["names"].get(label)
    return next((c for c in size["report"].comparisons if c["label"] == own), None)


def _step_row(size: dict[str, Any], comp: dict[str, Any], alpha: float) -> dict[str, Any]:
    """One size's step multiplier m, the steps part of k alone: the geometric mean of its
    per-seed values with its interval and its log's se and df
    (:func:`~normlab.report.stats.ratio_interval`)."""
    m = ratio_interval(list(comp["compute"]["step_mults"].values()), alpha)
    row = {"shape": size["shape"], "params": size["params"], "m": m["gmean"], "ci": m["ci"]}
    return {**row, "n": m["n"], "se": m["se_log"], "df": m["df"]}


def _refusal(lad: Ladder, label: str) -> str | None:
    """Why the trend of ``label`` gets no value at :data:`TARGET_PARAMS`: the baseline's or the
    variant's law missed the left-out largest size by more than that size's margin, or had no
    such check; None when both passed."""
    for lab in dict.fromkeys((lad.baseline, label)):
        law = lad.laws[lab]
        loo = law["loo"]
        if loo is None or loo["why"] is not None:
            return f"{lab}'s law has no leave-largest-out check ({(loo or law)['why']})"
        margin = next(s["report"].margin for s in lad.sizes if s["shape"] == loo["shape"])
        if not abs(loo["error"]) <= margin:
            return (
                f"{lab}'s law, fitted without {loo['shape']}, predicts it at "
                f"{loo['predicted']:.3f} against a measured {loo['measured']:.3f} nats/token "
                f"({loo['error']:+.3f}), beyond that size's ±{margin:.4g} margin"
            )
    return None


def _trend(lad: Ladder, label: str) -> dict[str, Any]:
    """:func:`multiplier_trend` of variant ``label``'s step multiplier over the sizes that have
    it, with those sizes' rows; its value at :data:`TARGET_PARAMS` nan unless :func:`_refusal`
    passes (``at_target["refused"]``: why not)."""
    rows = [
        _step_row(s, c, lad.alpha) for s in lad.sizes if (c := comparison_at(s, label)) is not None
    ]
    trend = multiplier_trend(
        [r["params"] for r in rows],
        [r["m"] for r in rows],
        [r["se"] for r in rows],
        lad.alpha,
        df=[r["df"] for r in rows],
    )
    why = _refusal(lad, label)
    if why is not None:
        trend["at_target"] |= {"k": NAN, "ci": (NAN, NAN)}
    trend["at_target"]["refused"] = why
    return {**trend, "sizes": rows}


def _points(sizes: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """Every completed run of variant ``label`` at every size, as :attr:`Ladder.points` has it."""
    return [
        {
            "params": r.summary_float("params"),
            "compute": training_flops(r),
            "seed": r.seed,
            "loss": r.final_val_loss,
            "shape": s["shape"],
        }
        for s in sizes
        for r in included(s, label)
    ]


def build_ladder(
    paths: str | Path | list[str | Path],
    margin: float = DEFAULT_MARGIN,
    alpha: float = 0.05,
    baseline: str | None = None,
    margin_compute: float | None = None,
) -> Ladder:
    """Load the runs of ``paths`` (sweep or run dirs), group them by model size
    (:func:`group_by_size`), build each size's report (:func:`~normlab.report.compare.build_report`
    on its run dirs, with ``margin``, ``alpha``, ``baseline``, ``margin_compute``), then fit each
    variant's loss-compute law (:func:`ladder_law` over the sizes every variant has) and each
    non-baseline variant's step-multiplier trend (:func:`multiplier_trend`, via :func:`_trend`).

    Raises:
        ReportError: fewer than 2 sizes, a size's report refused (the message names the size),
            or sizes with other baselines.
    """
    sources = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    groups = group_by_size(load_runs(sources))
    if len(groups) < 2:
        keys = ", ".join(SIZE_KEYS)
        raise ReportError(f"a ladder needs runs of >= 2 model sizes ({keys}); found {len(groups)}")
    sizes = []
    for size, runs in groups.items():
        try:
            rep = build_report(
                [r.path for r in runs], margin, alpha, baseline, None, margin_compute
            )
        except ReportError as e:
            raise ReportError(f"model size {shape_name(size)}: {e}") from None
        sizes.append(_size_row(size, rep))
    labels, names = _labels(sizes)
    sizes = [{**s, "names": n} for s, n in zip(sizes, names, strict=True)]
    lad = Ladder(sources, alpha, labels[0], labels, sizes)
    lad.points = {lab: _points(sizes, lab) for lab in labels}
    lad.law_sizes, lad.left_out = law_sizes([s["shape"] for s in sizes], lad.points)
    for lab in labels:
        lad.laws[lab] = ladder_law(lad.points[lab], lad.law_sizes, alpha)
    for lab in labels[1:]:
        lad.trends[lab] = _trend(lad, lab)
    return lad
