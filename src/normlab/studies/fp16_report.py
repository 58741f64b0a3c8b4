"""The fp16 statistics study's outputs: the error-vs-scale figure, the verdict in words, and
``fp16_statistics.md`` / ``.json`` (the study itself: ``fp16_statistics.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from normlab.studies.common import md_table
from normlab.studies.fp16_statistics import BROKEN, OVERFLOW_ABS, first_broken


def plot_sweep(sweep: list[dict[str, Any]], path: Path, d: int) -> Path:
    """Max output error vs input RMS, one panel per dtype, one line per case; thresholds marked."""
    from matplotlib.figure import Figure

    dtypes = list(dict.fromkeys(r["dtype"] for r in sweep))
    cases = list(dict.fromkeys(r["case"] for r in sweep))
    fig = Figure(figsize=(7 * len(dtypes), 5.2), layout="constrained")
    axes = fig.subplots(1, len(dtypes), squeeze=False)[0]
    styles = {"rms": "-", "layer": "--"}
    for ax, dtype in zip(axes, dtypes, strict=True):
        for i, case in enumerate(cases):
            pts = [r for r in sweep if r["case"] == case and r["dtype"] == dtype]
            x = np.array([r["rms"] for r in pts])
            err = np.array([r["err_max"] for r in pts])
            shown = np.clip(np.where(np.isfinite(err), err, 10.0), 1e-9, 10.0)
            ax.plot(
                x,
                shown,
                styles[case.split("/")[0]],
                marker="o",
                ms=2.5,
                color=f"C{i % 10}",
                label=case,
            )
        ax.axvline(OVERFLOW_ABS, color="red", ls=":", lw=1)
        ax.text(
            OVERFLOW_ABS * 1.08,
            0.04,
            "RMS 255.9 = sqrt(65504):\na constant row overflows",
            color="red",
            fontsize="x-small",
            transform=ax.get_xaxis_transform(),
        )
        gauss = [r for r in sweep if r["dtype"] == dtype and r["stats_overflow_frac"] > 0]
        if dtype == "fp16" and gauss:
            first = min(r["rms"] for r in gauss)
            ax.axvline(first, color="gray", ls=":", lw=1)
            ax.text(
                first * 0.92,
                0.04,
                f"first Gaussian row\nwith |x| > 255.9\n(RMS {first:.3g})",
                color="gray",
                fontsize="x-small",
                ha="right",
                transform=ax.get_xaxis_transform(),
            )
        finite = [
            r["err_max"] for r in sweep if r["dtype"] == dtype and 0 < r["err_max"] < math.inf
        ]
        ax.set(
            xscale="log",
            yscale="log",
            ylim=(max(1e-9, min(finite, default=1e-9) / 10), 20),
            xlabel="input RMS",
            ylabel="max over rows of ||y − y_fp64|| / ||y_fp64||",
            title=f"{dtype} input, d = {d} (1 = zeroed row; 10 = non-finite)",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle(
        "Norm output error vs input scale: fp32 statistics (upcast) vs statistics in the input "
        "dtype"
    )
    fig.savefig(path, dpi=120)
    return path


def verdict(sweep: list[dict[str, Any]], checks: list[dict[str, Any]]) -> list[str]:
    """Bullet lines saying, from the numbers, which settings broke, where and from which scale."""
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in sweep):
        ok, bad = [], []
        for case in dict.fromkeys(r["case"] for r in sweep):
            b = first_broken(sweep, case, dtype)
            pts = [r for r in sweep if r["case"] == case and r["dtype"] == dtype]
            if b is None:
                ok.append((case, max(r["err_max"] for r in pts)))
                continue
            low = [r["rms"] for r in pts if r["broken_frac"] > 0 and r["rms"] < 1]
            high = [r["rms"] for r in pts if r["broken_frac"] > 0 and r["rms"] >= 1]
            allb = min(
                (r["rms"] for r in pts if r["broken_frac"] == 1.0 and r["rms"] >= 1), default=None
            )
            what = []
            if high:
                what.append(
                    f"from input RMS {min(high):.3g}"
                    + (f" (every row from {allb:.3g})" if allb else "")
                    + ": the squares overflow, the mean square is inf and the row comes out zeroed"
                )
            if low:
                what.append(
                    f"below input RMS {max(low):.3g}: the squares underflow and eps dominates"
                )
            bad.append(f"`{case}` breaks " + "; ".join(what))
        rng = f"{min(r['rms'] for r in sweep):.3g}–{max(r['rms'] for r in sweep):.3g}"
        if bad:
            lines.append(f"- {dtype}, norm level: " + "; ".join(bad) + ".")
        if ok:
            worst = max(e for _, e in ok)
            lines.append(
                f"- {dtype}, norm level: {', '.join(f'`{c}`' for c, _ in ok)} stay within a "
                "relative error of "
                f"{worst:.2g} at every input RMS from {rng}."
            )
    for mode in dict.fromkeys(c["mode"] for c in checks):
        for upcast in (True, False):
            rows = [c for c in checks if c["mode"] == mode and c["upcast"] == upcast]
            hit = [c for c in rows if c["first_nonfinite"] or c["overflowed_norms"]]
            ok_rows = [c for c in rows if c not in hit]
            el = max((c["logit_err_max"] for c in ok_rows), default=math.nan)
            if hit:
                c = hit[0]
                all_hit = next(
                    (f"{h['target_rms']:g}" for h in hit if h["logit_err_median"] >= BROKEN),
                    "never",
                )
                lines.append(
                    f"- model, {mode}, upcast={str(upcast).lower()}: from residual RMS "
                    f"{c['target_rms']:g} (max |x| "
                    f"{c['max_abs']:.0f}) the detector reports: {c['first_nonfinite']}; "
                    f"{len(c['overflowed_norms'])} of {c['n_norms']} norms overflowed; the logits' "
                    "relative error "
                    f"against fp64 is up to {c['logit_err_max']:.2g} (median over positions "
                    f"{c['logit_err_median']:.2g}; loss {c['loss']:.3f} vs {c['loss64']:.3f}); "
                    "every position is hit "
                    f"from residual RMS {all_hit}. Below {c['target_rms']:g} the logits stay "
                    f"within {el:.2g} of fp64."
                )
            else:
                lines.append(
                    f"- model, {mode}, upcast={str(upcast).lower()}: nothing non-finite at any "
                    "residual RMS up to "
                    f"{max(c['target_rms'] for c in rows):g}; the logits stay within a relative "
                    f"error of {el:.2g} "
                    "of fp64."
                )
    return lines


def _norm_level_table(sweep) -> str:
    """Per case and dtype: the first input RMS that broke it and the largest error before."""
    cases = list(dict.fromkeys(r["case"] for r in sweep))
    dtypes = list(dict.fromkeys(r["dtype"] for r in sweep))
    summary_rows = []
    for case in cases:
        row = [f"`{case}`"]
        for dtype in dtypes:
            b = first_broken(sweep, case, dtype)
            pts = [
                r
                for r in sweep
                if r["case"] == case and r["dtype"] == dtype and r["rms"] < (b or math.inf)
            ]
            row += [
                f"{b:.3g}" if b else "never",
                f"{max((r['err_max'] for r in pts), default=math.nan):.2g}",
            ]
        summary_rows.append(row)
    head = ["case"] + [
        h for dt in dtypes for h in (f"{dt}: first broken RMS", f"{dt}: max error before")
    ]
    return md_table(head, summary_rows)


def write_report(out: Path, inputs, sweep, checks, fig: Path, rows: int) -> Path:
    """``fp16_statistics.md`` and ``.json`` in ``out``; returns the Markdown path."""
    from normlab.training.setup import versions

    cfg = inputs.cfg
    check_rows = [
        [
            c["mode"],
            str(c["upcast"]).lower(),
            f"{c['target_rms']:g}",
            f"{c['max_abs']:.0f}",
            c["first_nonfinite"] or "none",
            f"{len(c['overflowed_norms'])}/{c['n_norms']}",
            f"{c['logit_err_max']:.2g} / {c['logit_err_median']:.2g}",
            f"{c['loss']:.4f}",
            f"{c['loss64']:.4f}",
        ]
        for c in checks
    ]
    md = [
        f"# fp16 statistics study ({cfg.model.name}: {cfg.model.n_layer} x {cfg.model.d_model}, "
        f"norm {cfg.norm.kind.name}/"
        f"{cfg.norm.impl.name}, eps {cfg.norm.resolved_eps:g}, device {inputs.device})",
        "",
        "## Verdict",
        "",
        *verdict(sweep, checks),
        "",
        "Under `train precision=fp16` (autocast) the residual stream is fp32, so the norms never "
        "see fp16 inputs: "
        "`upcast=false` only matters where activations themselves are fp16 (a model cast to half, "
        "fp16 inference, "
        "kernels that keep the stream in fp16).",
        "",
        f"## Norm level: {rows} Gaussian rows of RMS 1 (d = {cfg.model.d_model}), scaled; max "
        "error over rows "
        "against fp64",
        "",
        f"![output error vs input RMS]({fig.name})",
        "",
        _norm_level_table(sweep),
        "",
        "## Model level: residual stream entering block 0 scaled to a target RMS",
        "",
        md_table(
            [
                "mode",
                "upcast",
                "residual RMS",
                "max abs x",
                "first non-finite (diagnostics.first_nonfinite)",
                "norms overflowed",
                "logit error max / median",
                "loss",
                "loss fp64",
            ],
            check_rows,
        ),
        "",
        "## Setup",
        "",
        f"- versions: `{json.dumps(versions(inputs.device, False))}`",
        f"- batch: {tuple(inputs.x.shape)} tokens of training batch 0 (seed {cfg.seed})",
    ]
    path = out / "fp16_statistics.md"
    path.write_text("\n".join(md) + "\n")
    (out / "fp16_statistics.json").write_text(
        json.dumps({"sweep": sweep, "model_checks": checks}, indent=1)
    )
    return path
