"""The report's figures, written by one writer (:func:`write_figures`): validation loss and
smoothed training loss against step, the paired validation-loss difference with its CI bands and
the margin, the step-time distribution with robust limits, validation loss against training
seconds and against tokens seen, final loss against the learning rate of a tuned sweep, the
per-block diagnostics (residual-stream RMS vs depth, norm gains over training), and final loss
against a swept numeric override.

Uses matplotlib's object API (``Figure`` rendered by the Agg canvas), so it neither needs a
display nor changes the pyplot backend of the calling process. Losses in nats/token, times in ms
(step times) or seconds (training time).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from normlab.report.compare import (
    NOT_COMPARABLE_MARK,
    Report,
    lr_curves,
    not_comparable,
    swept_points,
    time_curves,
)
from normlab.report.ladder import Ladder, law_value, trend_value
from normlab.report.runs import Run, write_atomic
from normlab.report.series import (
    Diag,
    aggregate,
    diag_entries,
    diag_rows,
    ema,
    gain_names,
    gain_series,
    loss_limits,
    n_blocks,
    panel_steps,
    profile_at,
    robust_limits,
    series,
)

#: variant label -> one list of metrics.jsonl rows per run
Metrics = dict[str, list[list[dict[str, Any]]]]
#: variant label -> one (steps, values) per run
Curves = dict[str, list[tuple[np.ndarray, np.ndarray]]]
STEP = "optimizer step"


def _axes(figsize: tuple[float, float] = (8, 5)) -> tuple[Figure, Any]:
    """A new figure (constrained layout, Agg: no display) and its one axes."""
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def zoom_to_losses(ax: Any, curves: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Zoom ``ax`` to :func:`~normlab.report.series.loss_limits` of ``curves`` (``(x, loss)``
    pairs): the initial model's point is drawn off the top instead of squashing the rest."""
    lo, hi = loss_limits(curves)
    if math.isfinite(lo) and math.isfinite(hi):
        ax.set_ylim(lo, hi)


def _save(fig: Figure, path: Path) -> Path:
    """Render ``fig`` (a PNG at 120 dpi) and replace ``path`` with it atomically, never through a
    link (:func:`~normlab.report.runs.write_atomic`); returns ``path``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return write_atomic(path, buf.getvalue())


def _finish(fig: Figure, ax: Any, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _mark(fig: Figure, ax: Any, mark: str | None) -> None:
    """Stamp ``mark`` (a "not comparable" verdict of the report) on the figure: in red above the
    plot and across it, so the figure cannot be read, or cropped, without it. Nothing when None."""
    if not mark:
        return
    fig.suptitle(mark, color="C3", fontweight="bold", fontsize="medium")
    ax.text(
        0.5,
        0.5,
        "NOT COMPARABLE",
        transform=ax.transAxes,
        ha="center",
        va="center",
        rotation=20,
        fontsize=32,
        color="C3",
        alpha=0.25,
        fontweight="bold",
    )


def _band_plot(
    curves: Curves, path: Path, title: str, ylabel: str, xlabel: str = STEP
) -> Path | None:
    """Per label, the mean of its runs' curves with a min–max band (a label's colour is its
    place in ``curves``, so it is the same in every figure); None when no curve has a point."""
    if not any(len(s) for runs in curves.values() for s, _ in runs):
        return None
    fig, ax = _axes()
    drawn = []
    for i, (label, runs) in enumerate(curves.items()):
        runs = [c for c in runs if len(c[0])]
        if not runs:
            continue
        x, mean, lo, hi = aggregate(runs)
        marker = "o" if len(x) < 30 else None
        colour = f"C{i % 10}"
        ax.plot(x, mean, color=colour, marker=marker, ms=3, label=f"{label} (n={len(runs)})")
        ax.fill_between(x, lo, hi, color=colour, alpha=0.2, linewidth=0)
        drawn += [(x, lo), (x, hi)]
    zoom_to_losses(ax, drawn)
    return _finish(fig, ax, path, title, xlabel, ylabel)


def plot_val_loss(metrics: Metrics, path: Path, corpus: str | None = None) -> Path | None:
    """Validation loss (nats/token) vs step: mean over runs per variant, min–max band; of the
    held-out corpus ``corpus`` (``val/<corpus>/loss``) when given, else the validation split."""
    key = f"val/{corpus}/loss" if corpus else "val/loss"
    curves = {lab: [series(rows, key) for rows in runs] for lab, runs in metrics.items()}
    what = f"Held-out corpus {corpus}: loss" if corpus else "Validation loss"
    title = f"{what} (mean over seeds, band: min–max)"
    return _band_plot(curves, path, title, f"{key} (nats/token)")


def plot_train_loss(metrics: Metrics, path: Path, beta: float = 0.95) -> Path | None:
    """Training loss (nats/token) vs step, each run smoothed by :func:`ema`, then mean and min–max
    over runs."""
    curves = {
        lab: [(s, ema(v, beta)) for s, v in (series(rows, "train/loss") for rows in runs)]
        for lab, runs in metrics.items()
    }
    title = f"Training loss, EMA beta={beta:g} (mean over seeds, band: min–max)"
    return _band_plot(curves, path, title, "training loss (nats/token)")


def plot_step_times(
    times: dict[str, list[float]], path: Path, mark: str | None = None
) -> Path | None:
    """Box plot per variant of post-warm-up step times (ms), all seeds pooled. The y range is
    :func:`~normlab.report.series.robust_limits` of all times; times beyond it are drawn
    as triangles at the edge with their count, so a few outliers (a busy machine) do not squash
    the boxes. ``mark``: the report's "not comparable" mark, stamped on the figure (:func:`_mark`).
    None if no data."""
    times = {lab: [x for x in t if math.isfinite(x)] for lab, t in times.items()}
    times = {lab: t for lab, t in times.items() if t}
    if not times:
        return None
    lo, hi = robust_limits([x for t in times.values() for x in t])
    fig, ax = _axes((max(6, 1.8 * len(times)), 5))
    ax.boxplot(list(times.values()), flierprops={"markersize": 2})
    ax.set_ylim(lo, hi)
    for i, t in enumerate(times.values(), start=1):
        for edge, n, marker in (
            (hi, sum(x > hi for x in t), "^"),
            (lo, sum(x < lo for x in t), "v"),
        ):
            if n:
                ax.plot([i], [edge], marker=marker, color="C3", ms=7, clip_on=False)
                ax.annotate(
                    f"{n} beyond",
                    (i, edge),
                    xytext=(8, -4),
                    textcoords="offset points",
                    fontsize="x-small",
                    color="C3",
                )
    ticks = [f"{lab}\n({len(t)} steps)" for lab, t in times.items()]
    ax.set_xticks(range(1, len(times) + 1), ticks, fontsize="small")
    ax.set(
        title="Step time per variant (post-warm-up steps, seeds pooled)\n"
        "y range set without outliers; triangles: steps beyond it",
        xlabel="variant",
        ylabel="step time (ms)",
    )
    ax.grid(axis="y", alpha=0.3)
    _mark(fig, ax, mark)
    return _save(fig, path)


def plot_val_diff(rep: Report, path: Path) -> Path | None:
    """Validation loss of each variant minus the baseline's, paired by seed, against step (and
    tokens seen, on the top axis, when every run consumes the same tokens per step): the
    mean over seeds, its 1−alpha Student t band (where n >= 2) with the 1−2·alpha band inside it
    (the interval the TOST verdict reads, so a verdict and the figure agree), 0 and the ±margin
    lines (nats/token). None without a comparison that has a paired validation step."""
    comps = [c for c in rep.comparisons if len(c["curve"]["step"])]
    if not comps:
        return None
    fig, ax = _axes()
    for i, c in enumerate(comps):
        cur, color = c["curve"], f"C{i % 10}"
        ns = sorted(set(cur["n"].tolist()))
        n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}–{ns[-1]}"
        ax.plot(
            cur["step"], cur["mean"], marker="o", ms=3, color=color, label=f"{c['label']} ({n})"
        )
        ok = np.isfinite(cur["lo"])
        lo, hi = cur["lo"][ok], cur["hi"][ok]
        ax.fill_between(cur["step"][ok], lo, hi, color=color, alpha=0.15, lw=0)
        lo, hi = cur["lo_tost"][ok], cur["hi_tost"][ok]  # inner: the interval TOST reads
        ax.fill_between(cur["step"][ok], lo, hi, color=color, alpha=0.3, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    for sign in (-1, 1):
        ax.axhline(sign * rep.margin, color="grey", ls="--", lw=1)
    ax.plot([], [], color="grey", ls="--", label=f"±margin ({rep.margin:g} nats)")
    conf = f"{100 * (1 - rep.alpha):g}% CI, inner {100 * (1 - 2 * rep.alpha):g}% (TOST)"
    per_step = {r.tokens_per_step for r in rep.runs if r.excluded is None}
    if len(per_step) == 1 and None not in per_step:  # one token count per step: a tokens axis
        k = per_step.pop()
        top = ax.secondary_xaxis("top", functions=(lambda s: s * k, lambda t: t / k))
        top.set_xlabel("tokens seen")
    title = f"Validation loss, variant − {rep.baseline}\n(mean over seeds; bands: {conf})"
    return _finish(fig, ax, path, title, STEP, "validation-loss difference (nats/token)")


# --- fair comparisons: training seconds, tokens, learning rate -----------------------------------


def plot_val_time(
    included: dict[str, list[Run]], target: float, path: Path, mark: str | None = None
) -> Path | None:
    """Validation loss against cumulative training seconds (``perf/train_time_s``), one thin line
    per run and one colour per variant, the target loss dotted; ``mark``: the report's "not
    comparable" mark, stamped on the figure (:func:`_mark`). None when no run records it."""
    curves = {lab: [c for c in time_curves(runs) if len(c[0])] for lab, runs in included.items()}
    if not any(curves.values()):
        return None
    fig, ax = _axes()
    for i, (lab, runs) in enumerate(curves.items()):
        for j, (t, v) in enumerate(runs):
            name = f"{lab} ({len(runs)} runs)" if j == 0 else None
            ax.plot(t, v, color=f"C{i % 10}", lw=1, marker="o", ms=2, alpha=0.8, label=name)
    zoom_to_losses(ax, [c for runs in curves.values() for c in runs])
    if math.isfinite(target):
        ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.4f}")
    title = "Validation loss vs training time (each run; evaluations excluded from the time)"
    _mark(fig, ax, mark)
    return _finish(fig, ax, path, title, "training seconds", "validation loss (nats/token)")


def plot_val_tokens(included: dict[str, list[Run]], path: Path) -> Path | None:
    """Validation loss against tokens seen (step × tokens per step): mean over a variant's runs
    with a min–max band. None without validation points or tokens per step."""
    curves = {
        lab: [
            (s * r.tokens_per_step, v)
            for r in runs
            if r.tokens_per_step
            for s, v in [series(r.metrics, "val/loss")]
        ]
        for lab, runs in included.items()
    }
    title = "Validation loss vs tokens seen (mean over seeds, band: min–max)"
    return _band_plot(curves, path, title, "validation loss (nats/token)", xlabel="tokens seen")


def plot_lr_curve(tuned: dict[str, Any], path: Path, conf: str) -> Path | None:
    """Mean final validation loss against ``optim.lr`` (log scale) per variant, error bars the
    ``conf`` interval (where n >= 2), each variant's best learning rate circled."""
    curves = lr_curves(tuned)
    if not any(len(c[0]) for c in curves.values()):
        return None
    fig, ax = _axes()
    for i, (lab, (lrs, mean, lo, hi, _n)) in enumerate(curves.items()):
        color = f"C{i % 10}"
        err = np.vstack([mean - lo, hi - mean])
        err = np.where(np.isfinite(err), err, 0.0)
        ax.errorbar(lrs, mean, yerr=err, color=color, marker="o", ms=4, capsize=3, label=lab)
        best = tuned["best"].get(lab)
        if best is not None:
            y = mean[list(lrs).index(best)]
            ax.plot([best], [y], "o", ms=12, mfc="none", color=color)
    ax.set_xscale("log")
    title = f"Final validation loss vs learning rate (mean over seeds, bars: {conf}; ring: best)"
    return _finish(fig, ax, path, title, "optim.lr (peak)", "final validation loss (nats/token)")


# --- diagnostics and swept value -----------------------------------------------------------------


def plot_resid_depth(diag: Diag, path: Path) -> Path | None:
    """Residual-stream RMS vs depth, one panel per step (first, middle, last diagnosed), one line
    per variant (mean over its runs). A variant not diagnosed at a panel's step shows its latest
    earlier diagnosed step, named in the legend. None without diagnostics."""
    n = max((n_blocks(rows) for runs in diag.values() for rows in runs), default=0)
    steps = panel_steps(diag)
    if not n or not steps:
        return None
    fig = Figure(figsize=(5 * len(steps), 4.8), layout="constrained")
    axes = fig.subplots(1, len(steps), sharey=True, squeeze=False)[0]
    positive = True
    for ax, step in zip(axes, steps, strict=True):
        for i, (label, runs) in enumerate(diag.items()):
            got = profile_at(runs, step, n)
            if got is None:
                continue
            prof, at = got
            positive &= bool(np.all(prof[np.isfinite(prof)] > 0))
            name = label if at == step else f"{label} (step {at})"
            ax.plot(np.arange(n + 1), prof, marker="o", ms=3, color=f"C{i % 10}", label=name)
        ax.set_xticks(np.arange(n + 1), [f"b{i}" for i in range(n)] + ["final"], fontsize="small")
        ax.set(
            title=f"step {step}", xlabel="residual stream entering block (final: the final norm)"
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel("residual RMS  sqrt(mean(x^2))")
    if positive:
        axes[0].set_yscale("log")
    fig.suptitle("Residual-stream RMS vs depth (mean over runs)")
    return _save(fig, path)


def plot_gains(diag: Diag, path: Path) -> Path | None:
    """Norm gains over training, one panel per variant: per norm (colour = depth) the mean gain,
    band from its smallest to its largest element. None without gain statistics
    (``norm.affine=false``)."""
    panels = {lab: runs for lab, runs in diag.items() if any(gain_names(rows) for rows in runs)}
    if not panels:
        return None
    cols = min(2, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6.5 * cols, 4.2 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols, squeeze=False)).ravel()
    cmap = colormaps["viridis"]
    for ax, (label, runs) in zip(axes, panels.items(), strict=False):
        names = max((gain_names(rows) for rows in runs), key=len)
        every = max(1, math.ceil(len(names) / 9))  # at most about 9 legend entries
        for j, name in enumerate(names):
            steps, mean, lo, hi = gain_series(runs, name)
            if not len(steps):
                continue
            color = cmap(j / max(1, len(names) - 1))
            show = j % every == 0 or j == len(names) - 1
            ax.plot(steps, mean, color=color, lw=1.2, label=name if show else None)
            ax.fill_between(steps, lo, hi, color=color, alpha=0.12, linewidth=0)
        ax.set(title=label, xlabel="optimizer step", ylabel="gain (weight)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", ncol=2)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        "Norm gains over training: mean per norm, band min–max of its elements (over runs)"
    )
    return _save(fig, path)


def write_diag_figures(diag: Diag, out_dir: Path) -> dict[str, Path | None]:
    """``resid_depth.png`` and ``gains.png`` from ``diag`` (variant label -> one list of metrics
    rows per run); both None when no row has ``diag/`` keys."""
    if not any(diag_rows(rows) for runs in diag.values() for rows in runs):
        return {"resid_depth": None, "gains": None}
    return {
        "resid_depth": plot_resid_depth(diag, out_dir / "resid_depth.png"),
        "gains": plot_gains(diag, out_dir / "gains.png"),
    }


def plot_swept_value(
    points: dict[str, list[tuple[float, list[float]]]], key: str, path: Path
) -> Path | None:
    """Final validation loss (nats/token) against a swept numeric override ``key``: one line per
    group of the other overrides, mean over seeds with a min–max bar. ``points``: line label ->
    ``(value, final losses of its completed runs)``. Log x axis when every value is > 0 and they
    span >= 100x."""
    points = {lab: sorted((x, v) for x, v in pts if v) for lab, pts in points.items()}
    points = {lab: pts for lab, pts in points.items() if pts}
    if not points:
        return None
    fig, ax = _axes((7, 4.8))
    xs_all = [x for pts in points.values() for x, _ in pts]
    for i, (label, pts) in enumerate(points.items()):
        x = np.array([p[0] for p in pts])
        mean = np.array([np.mean(p[1]) for p in pts])
        err = np.array([[m - min(p[1]), max(p[1]) - m] for m, p in zip(mean, pts, strict=True)]).T
        ns = sorted({len(p[1]) for p in pts})
        n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}–{ns[-1]}"
        ax.errorbar(
            x,
            mean,
            yerr=err,
            marker="o",
            ms=4,
            capsize=3,
            color=f"C{i % 10}",
            label=f"{label} ({n})",
        )
    if min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 100:
        ax.set_xscale("log")
    title = f"Final validation loss vs {key} (mean over seeds, bar: min–max)"
    return _finish(fig, ax, path, title, key, "final validation loss (nats/token)")


# --- the ladder ----------------------------------------------------------------------------------


def plot_ladder_loss(lad: Ladder, path: Path) -> Path | None:
    """Final validation loss (nats/token) against training compute (FLOPs), log-log: one colour
    per variant, a dot per completed run, a diamond per size mean the law is fitted to, and the
    variant's law (:func:`~normlab.report.ladder.ladder_law`) over those means' computes."""
    pts = {
        lab: [p for p in ps if p["compute"] > 0 and p["loss"] > 0] for lab, ps in lad.points.items()
    }
    if not any(pts.values()):
        return None
    fig, ax = _axes((7.5, 5))
    for i, (lab, ps) in enumerate(pts.items()):
        color, law = f"C{i % 10}", lad.laws[lab]
        c, loss = np.array([p["compute"] for p in ps]), np.array([p["loss"] for p in ps])
        ax.plot(c, loss, "o", ms=3, color=color, alpha=0.5, label=f"{lab} (runs)")
        means = law["means"]
        if not means or law["form"] is None:
            continue
        mc = np.array([m["compute"] for m in means])
        ax.plot(mc, [m["loss"] for m in means], "D", ms=6, mfc="none", color=color)
        grid = np.geomspace(mc.min(), mc.max(), 100)
        label = f"{lab}: {law['form']}, alpha = {law['alpha']:.3f}"
        ax.plot(grid, law_value(law, grid), "-", color=color, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _: f"{v:g}"))
    title = "Final validation loss vs training compute (dots: runs; diamonds: size means; laws)"
    return _finish(
        fig, ax, path, title, "training compute C (FLOPs)", "final validation loss (nats/token)"
    )


def plot_ladder_multiplier(lad: Ladder, path: Path) -> Path | None:
    """The step multiplier m (the steps part of k; the speed part is not a law in N) against
    parameters N (log-log): per variant and size m with its interval, the fitted trend
    (:func:`~normlab.report.ladder.multiplier_trend`) and, only when the trend has a 124M value
    (the laws' leave-largest-out check passed), the line dashed to 124M parameters with the
    value there (log m axis over the measured multipliers, wider intervals clipped:
    :func:`_k_axis`)."""
    if not lad.trends:
        return None
    fig, ax = _axes((7.5, 5))
    ax.axhline(1.0, color="0.5", lw=1, ls=":")
    for i, (lab, t) in enumerate(lad.trends.items()):
        color = f"C{(i + 1) % 10}"
        rows = [r for r in t["sizes"] if r["m"] > 0]
        if not rows:
            continue
        n = np.array([r["params"] for r in rows])
        m = np.array([r["m"] for r in rows])
        lo = np.array([r["ci"][0] if math.isfinite(r["ci"][0]) else r["m"] for r in rows])
        hi = np.array([r["ci"][1] if math.isfinite(r["ci"][1]) else r["m"] for r in rows])
        label = f"{lab} vs {lad.baseline}"
        ax.errorbar(n, m, yerr=[m - lo, hi - m], fmt="o", capsize=3, color=color, label=label)
        if not math.isfinite(t["slope"]):
            continue
        at = t["at_target"]
        inside = np.geomspace(n.min(), n.max(), 50)
        label = f"trend: m ∝ N^{t['slope']:+.3f}"
        ax.plot(inside, trend_value(t, inside), "-", color=color, label=label)
        if at["refused"] is not None:
            continue
        beyond = np.geomspace(n.max(), at["params"], 50)
        ax.plot(beyond, trend_value(t, beyond), "--", color=color)
        if all(map(math.isfinite, at["ci"])):
            ax.errorbar(
                [at["params"]],
                [at["k"]],
                yerr=[[at["k"] - at["ci"][0]], [at["ci"][1] - at["k"]]],
                fmt="s",
                mfc="none",
                capsize=4,
                color=color,
                label=f"{at['params'] / 1e6:.0f}M parameters: extrapolated",
            )
    ax.set_xscale("log")
    ms = [r["m"] for t in lad.trends.values() for r in t["sizes"]]
    _k_axis(ax, ms + [t["at_target"]["k"] for t in lad.trends.values()])
    conf = f"{100 * (1 - lad.alpha):g}% CI"
    title = f"Step multiplier vs parameters (bars: {conf}, clipped; dashed: extrapolation)"
    ylabel = "step multiplier m (> 1: a variant step is worth more)"
    return _finish(fig, ax, path, title, "parameters N", ylabel)


def _k_axis(ax: Any, ks: list[float]) -> None:
    """A log k axis over the multipliers ``ks`` (and 1) widened 3x each way: an interval
    of two seeds can span decades and would flatten every point to the axis if drawn whole."""
    ks = [k for k in ks if math.isfinite(k) and k > 0] + [1.0]
    ax.set_yscale("log")
    ax.set_ylim(min(ks) / 3, max(ks) * 3)
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _: f"{v:g}"))


def write_ladder_figures(lad: Ladder, out_dir: Path) -> dict[str, Path | None]:
    """Write the ladder's figures into ``out_dir``: ``ladder_loss.png`` and
    ``ladder_multiplier.png``; returns name -> path, or None for a figure without data."""
    return {
        "ladder_loss": plot_ladder_loss(lad, out_dir / "ladder_loss.png"),
        "ladder_multiplier": plot_ladder_multiplier(lad, out_dir / "ladder_multiplier.png"),
    }


# --- every figure --------------------------------------------------------------------------------


def write_figures(rep: Report, out_dir: Path, beta: float = 0.95) -> dict[str, Path | None]:
    """Write every figure of ``rep`` into ``out_dir``: ``val_loss.png``, ``val_diff.png``,
    ``val_time.png``, ``val_tokens.png``, ``train_loss.png``, ``step_time.png``; for a tuned sweep
    ``lr_curve.png``; per held-out corpus ``val_<name>.png`` (key ``val_<name>``); with ``diag/``
    keys ``resid_depth.png`` and ``gains.png``; for a numeric sweep ``swept.png``. ``beta``: EMA
    of the training loss. Returns name -> path, or None for a figure skipped for lack of data."""
    metrics = {lab: [r.metrics for r in rep.included(lab)] for lab in rep.labels}
    mark = NOT_COMPARABLE_MARK if not_comparable(rep) else None
    times = {
        lab: [
            float(t)
            for r in rep.included(lab)
            for t in (r.summary or {}).get("step_times_ms") or []
            if t is not None
        ]
        for lab in rep.labels
    }
    figs = {
        "val_loss": plot_val_loss(metrics, out_dir / "val_loss.png"),
        "val_diff": plot_val_diff(rep, out_dir / "val_diff.png"),
        "train_loss": plot_train_loss(metrics, out_dir / "train_loss.png", beta),
        "step_time": plot_step_times(times, out_dir / "step_time.png", mark),
    }
    for name in rep.heldout.get("heldout", {}):
        figs[f"val_{name}"] = plot_val_loss(metrics, out_dir / f"val_{name}.png", corpus=name)
    included = {lab: rep.included(lab) for lab in rep.labels}
    target = rep.target.get("target", float("nan"))
    figs["val_time"] = plot_val_time(included, target, out_dir / "val_time.png", mark)
    figs["val_tokens"] = plot_val_tokens(included, out_dir / "val_tokens.png")
    if rep.tuned:
        conf = f"{100 * (1 - rep.alpha):g}% CI"
        figs["lr_curve"] = plot_lr_curve(rep.tuned, out_dir / "lr_curve.png", conf)
    entries = diag_entries(rep.labels, rep.runs)
    if entries:
        figs.update(write_diag_figures(entries, out_dir))
    found = swept_points(rep)
    if found is not None:
        figs["swept"] = plot_swept_value(found[1], found[0], out_dir / "swept.png")
    return figs
