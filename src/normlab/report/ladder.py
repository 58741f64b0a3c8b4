"""The model-size ladder: one comparison (the same variants, paired by seed) repeated at several
model sizes, read as a trend. Runs are grouped by model shape (``model.n_layer``, ``model.d_model``,
``model.n_head``); each size gets the full report of :func:`~normlab.report.compare.build_report`
(its paired loss difference and compute-equivalent multiplier); across sizes:

- per variant, final validation loss against training compute C (FLOPs: the model's
  6 N + 12 L C T per token, Kaplan et al. 2020, times the tokens the run trained on) with a
  fitted power law L = E + A (C/C0)^-alpha, or L = A (C/C0)^-alpha where the data do not support
  the irreducible term E (:func:`fit_power_law` says which and why);
- per variant, the trend of the compute-equivalent multiplier k with parameters: a weighted
  straight line of ln k on ln N (:func:`multiplier_trend`), its slope with a CI, and its value at
  :data:`TARGET_PARAMS` (GPT-2 small), an extrapolation with its interval.

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
from normlab.report.runs import NAN, ReportError, Run, load_runs, never_trained, override_key

#: The extrapolation target: GPT-2 small, 124M parameters as ``model.num_params`` counts them.
TARGET_PARAMS = 124e6
#: The config keys whose values make a model size.
SIZE_KEYS = ("model.n_layer", "model.d_model", "model.n_head")
#: Runs of one size sharing every override but these are one variant's seeds (or one rung's).
NOT_A_VARIANT = ("seed",)


@dataclass
class Ladder:
    """Everything the ladder report says. ``sizes``: per size, smallest first,
    ``{"shape": "4x128", "params": N, "tokens": median tokens, "report": Report}``; ``points``:
    per variant label, ``{"params", "compute", "loss", "seed", "shape"}`` per completed run;
    ``laws``: per label, :func:`fit_power_law`; ``trends``: per non-baseline label,
    :func:`multiplier_trend` plus ``"sizes"`` (params, k, ci, n per size)."""

    sources: list[Path]
    alpha: float
    baseline: str
    labels: list[str]
    sizes: list[dict[str, Any]]
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
        return (_median([r.summary_float("params") for r in item[1]]), item[0])

    return dict(sorted(groups.items(), key=order))


def is_ladder(runs: list[Run]) -> bool:
    """True when ``runs`` hold at least 2 model sizes and some size holds at least 2 variants
    (runs whose overrides differ in more than the seed): a comparison repeated across sizes.
    A sweep whose only variants are sizes (``model=tiny,small``) is an ordinary comparison."""
    groups = group_by_size(runs)
    return len(groups) >= 2 and any(len({_variant_key(r) for r in g}) >= 2 for g in groups.values())


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else NAN


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
    return _law("A (C/C0)^-alpha", params, se, n=c.size, dof=dof, c0=c0, why=why, alpha=alpha)


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
    """A fitted law as :func:`fit_power_law` returns it, with alpha's Student t interval."""
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


def fit_power_law(compute: list[float], losses: list[float], alpha: float = 0.05) -> dict:
    """Final validation loss L (nats/token) against training compute C (FLOPs), one point per
    run: L = E + A (C/C0)^-alpha (``scipy.optimize.curve_fit``, bounded: 0 <= E < min L, A > 0,
    0 < alpha < 10; C0 = the geometric mean of C, so that A is the reducible loss there), when
    there are at least 4 points (a degree of freedom over its 3 parameters), the fit converges
    with a finite covariance and E stays inside its bounds. Otherwise the simplest form,
    L = A (C/C0)^-alpha (a straight line on log-log axes, 2 parameters), with ``why`` saying why.

    Returns:
        ``form``, ``E`` (nan in the 2-parameter form), ``A``, ``alpha``; ``se`` of each (from
        the fit's covariance, scaled by the residual variance; nan with no degree of freedom);
        ``alpha_ci`` (1−``alpha`` Student t on the degrees of freedom ``dof``); ``n``; ``c0``;
        ``why`` (None for the full form).

    Raises:
        ReportError: fewer than 2 points with finite positive C and L.
    """
    c, loss = np.asarray(compute, float), np.asarray(losses, float)
    ok = np.isfinite(c) & np.isfinite(loss) & (c > 0) & (loss > 0)
    c, loss = c[ok], loss[ok]
    if c.size < 2 or np.unique(c).size < 2:
        raise ReportError(f"a power law needs >= 2 runs at 2 computes; got {c.size} run(s)")
    c0 = float(np.exp(np.log(c).mean()))
    if c.size < 4:
        why = f"{c.size} points: E + A C^-alpha's 3 parameters would leave no degree of freedom"
        return _pure_law(c, loss, c0, why, alpha)
    x = c / c0
    try:
        p, cov = optimize.curve_fit(
            lambda x, e, a, al: e + a * x**-al,
            x,
            loss,
            p0=_full_start(x, loss),
            bounds=([0.0, 1e-12, 1e-6], [loss.min(), np.inf, 10.0]),
            maxfev=20000,
        )
    except (RuntimeError, ValueError) as e:
        return _pure_law(c, loss, c0, f"E + A C^-alpha did not converge ({e})", alpha)
    se = np.sqrt(np.diag(cov))
    if not np.all(np.isfinite(se)):
        why = "E + A C^-alpha has no finite covariance (E, A, alpha not separately identified)"
        return _pure_law(c, loss, c0, why, alpha)
    if p[0] <= 1e-6 * loss.min() or p[0] >= (1 - 1e-6) * loss.min():
        why = f"E + A C^-alpha put E at its bound ({p[0]:.3g}): the data show no loss floor"
        return _pure_law(c, loss, c0, why, alpha)
    names = ("E", "A", "alpha")
    params = dict(zip(names, map(float, p), strict=True))
    errs = dict(zip(names, map(float, se), strict=True))
    form, dof = "E + A (C/C0)^-alpha", c.size - 3
    return _law(form, params, errs, n=c.size, dof=dof, c0=c0, why=None, alpha=alpha)


def law_value(law: dict[str, Any], compute: np.ndarray) -> np.ndarray:
    """The fitted law (:func:`fit_power_law`) at ``compute`` (FLOPs): loss in nats/token."""
    e = 0.0 if math.isnan(law["E"]) else law["E"]
    return e + law["A"] * (np.asarray(compute, float) / law["c0"]) ** -law["alpha"]


# --- the multiplier across sizes: its trend and the extrapolation ---------------------------------


def _log_se(k: float, ci: tuple[float, float], n: int, alpha: float) -> float:
    """The standard error of ln k behind a 1−alpha Student t interval ``ci`` of ``n`` seeds
    (:func:`~normlab.report.stats.compute_multiplier`); nan without an interval."""
    lo, hi = ci
    if n < 2 or not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < k < hi):
        return NAN
    return (math.log(hi) - math.log(lo)) / (2 * stats.t.ppf(1 - alpha / 2, n - 1))


def multiplier_trend(
    params: list[float],
    ks: list[float],
    se: list[float],
    alpha: float = 0.05,
    target: float = TARGET_PARAMS,
) -> dict[str, Any]:
    """The trend of the compute-equivalent multiplier k with parameters N: least squares
    ln k = a + b (ln N − x̄), one point per size, weighted by 1/se² (``se``: the standard error
    of each ln k) when every size has one, else unweighted. Slope b: k grows as N^b (b = 0: no
    trend). Its covariance: weighted, (X'WX)^-1 times max(1, chi²/(m − 2)) (the scatter between
    sizes, when it exceeds what the seeds' errors explain, widens it); unweighted, times the
    residual variance. Intervals: Student t with m − 2 degrees of freedom (m sizes). At
    ``target`` parameters: the line's value, exp(a + b (ln target − x̄)), with the interval of
    the line there (the trend's uncertainty, not a new run's seed noise): an extrapolation when
    ``target`` lies beyond the largest size.

    Returns:
        ``n`` (sizes), ``weighted``, ``slope``, ``slope_ci``, ``x_ref`` (x̄), ``intercept`` (a),
        ``at_target``: ``{"params", "k", "ci", "beyond"}`` (beyond: target / largest N);
        intervals nan with fewer than 3 sizes, everything nan with fewer than 2.
    """
    x, y, s = (np.asarray(v, float) for v in (params, ks, se))
    ok = np.isfinite(x) & (x > 0) & np.isfinite(y) & (y > 0)
    x, y, s = np.log(x[ok]), np.log(y[ok]), s[ok]
    m = int(x.size)
    weighted = m > 0 and bool(np.all(np.isfinite(s) & (s > 0)))
    out: dict[str, Any] = {"n": m, "weighted": weighted, "slope": NAN, "slope_ci": (NAN, NAN)}
    out |= {"x_ref": NAN, "intercept": NAN}
    out["at_target"] = {"params": target, "k": NAN, "ci": (NAN, NAN), "beyond": NAN}
    if m < 2 or np.unique(x).size < 2:
        return out
    w = 1 / s**2 if weighted else np.ones(m)
    xr = float(w @ x / w.sum())
    sxx = float(w @ (x - xr) ** 2)
    b = float(w @ ((x - xr) * y) / sxx)
    a = float(w @ y / w.sum())
    chi2 = float(w @ (y - a - b * (x - xr)) ** 2)
    scale = (max(1.0, chi2 / (m - 2)) if weighted else chi2 / (m - 2)) if m > 2 else NAN
    q = stats.t.ppf(1 - alpha / 2, m - 2) if m > 2 else NAN
    se_b, se_a = math.sqrt(scale / sxx), math.sqrt(scale / w.sum())
    x0 = math.log(target) - xr
    y0, se0 = a + b * x0, math.hypot(se_a, x0 * se_b)
    out |= {"slope": b, "slope_ci": (b - q * se_b, b + q * se_b), "x_ref": xr, "intercept": a}
    out["at_target"] |= {"k": math.exp(y0), "beyond": target / math.exp(x.max())}
    out["at_target"]["ci"] = (math.exp(y0 - q * se0), math.exp(y0 + q * se0))
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
        "params": _median([r.summary_float("params") for r in rep.runs]),
        "tokens": _median([tokens_seen(r) for r in done]),
        "compute": _median([training_flops(r) for r in done]),
        "report": rep,
    }


def _common_labels(sizes: list[dict[str, Any]]) -> list[str]:
    """The variant labels (baseline first) every size shares.

    Raises:
        ReportError: sizes with other baselines or other variants.
    """
    first = sizes[0]["report"]
    for s in sizes[1:]:
        rep = s["report"]
        if rep.baseline != first.baseline or set(rep.labels) != set(first.labels):
            raise ReportError(
                f"model size {s['shape']} has variants {', '.join(rep.labels)} (baseline "
                f"{rep.baseline}) but {sizes[0]['shape']} has {', '.join(first.labels)} "
                f"(baseline {first.baseline}): a ladder compares the same variants at every size"
            )
    return first.labels


def _trend(lad: Ladder, label: str) -> dict[str, Any]:
    """:func:`multiplier_trend` of variant ``label`` over the sizes, with the sizes' points."""
    rows = []
    for s in lad.sizes:
        c = next(c for c in s["report"].comparisons if c["label"] == label)
        k = c["compute"]
        se = _log_se(k["k"], k["ci"], k["n"], lad.alpha)
        rows.append({"params": s["params"], "k": k["k"], "ci": k["ci"], "n": k["n"], "se": se})
    trend = multiplier_trend(
        [r["params"] for r in rows], [r["k"] for r in rows], [r["se"] for r in rows], lad.alpha
    )
    return {**trend, "sizes": rows}


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
    variant's loss-compute law (:func:`fit_power_law` over its completed runs at every size) and
    each non-baseline variant's multiplier trend (:func:`multiplier_trend`).

    Raises:
        ReportError: fewer than 2 sizes, a size's report refused (the message names the size),
            sizes that do not hold the same variants, or a law with too few points.
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
    labels = _common_labels(sizes)
    lad = Ladder(sources, alpha, labels[0], labels, sizes)
    for lab in labels:
        lad.points[lab] = [
            {
                "params": r.summary_float("params"),
                "compute": training_flops(r),
                "seed": r.seed,
                "loss": r.final_val_loss,
                "shape": s["shape"],
            }
            for s in sizes
            for r in s["report"].included(lab)
        ]
        pts = lad.points[lab]
        lad.laws[lab] = fit_power_law([p["compute"] for p in pts], [p["loss"] for p in pts], alpha)
    for lab in labels[1:]:
        lad.trends[lab] = _trend(lad, lab)
    return lad
