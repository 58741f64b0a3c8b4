"""fp16 statistics study: when does a norm computing ``mean(x^2)`` in fp16 overflow, and who
notices? (fp16 squares overflow past ``|x| > sqrt(65504) = 255.9``; the row comes out zeroed.)

``norm_error_sweep``: every norm kind x implementation (``upcast`` true and false where honoured),
output error against an fp64 oracle vs input RMS, in fp16 and bf16. ``model_study``: the
experiment's GPT with the residual stream entering block 0 scaled to a target RMS, whole in fp16
and under fp16 autocast, checked by ``diagnostics.first_nonfinite`` against an fp64 copy.
``write_report`` writes ``fp16_statistics.md`` and ``.json``; ``plot_sweep`` the figure.

Why: docs/experiments.md
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from normlab.config import NormConfig, NormImpl
from normlab.config.norm_table import IMPLS, KINDS
from normlab.norms import available_impls, build_norm, resolve_norm
from normlab.norms import oracle as norm_oracle
from normlab.studies.common import md_table
from normlab.training.diagnostics import first_nonfinite, norm_statistics_finite

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504
OVERFLOW_ABS = math.sqrt(FP16_MAX)  # 255.9: |x| above this squares to inf in fp16
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BROKEN = 0.5  # a row's relative error at or above this counts as broken (a zeroed row has error 1)
DEFAULT_SCALES = [float(v) for v in np.logspace(-3, 3.5, 27)]
DEFAULT_MODEL_RMS = [1.0, 30.0, 60.0, 90.0, 150.0, 255.9, 400.0, 1000.0, 4000.0]


def norm_cases(device_type: str, impls: list[str] | None = None) -> list[tuple[str, NormConfig]]:
    """``(label, resolved NormConfig)`` per statistic kind x implementation the device runs (only
    ``impls`` if given), twice (``upcast`` true, false) where ``upcast=false`` is honoured."""
    cases = []
    for kind, spec in KINDS.items():
        if not spec.statistic:  # the study is about the overflow of a norm's statistic
            continue
        for name in available_impls(device_type, kind):
            impl = NormImpl[name]
            if impls is not None and name not in impls:
                continue
            for upcast in (True, False) if IMPLS[impl].upcast_false else (True,):
                cfg = resolve_norm(NormConfig(kind=kind, impl=impl, upcast=upcast), device_type)
                label = f"{kind.name}/{name}" + (
                    f" upcast={str(upcast).lower()}" if IMPLS[impl].upcast_false else ""
                )
                cases.append((label, cfg))
    return cases


def unit_rows(rows: int, d: int, seed: int = 0) -> torch.Tensor:
    """``(rows, d)`` fp64 Gaussian rows, each rescaled to RMS exactly 1."""
    g = torch.randn(rows, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return g / g.pow(2).mean(-1, keepdim=True).sqrt()


def row_errors(y: torch.Tensor, y64: torch.Tensor) -> torch.Tensor:
    """Per row ``||y - y64|| / ||y64||`` in fp64; inf where ``y`` is not finite."""
    y = y.double()
    err = (y - y64).norm(dim=-1) / y64.norm(dim=-1).clamp_min(1e-300)
    return torch.where(torch.isfinite(y).all(-1), err, torch.full_like(err, math.inf))


def oracle(cfg: NormConfig, x: torch.Tensor) -> torch.Tensor:
    """The fp64 reference output of a fresh norm (gain 1, bias 0) for the (rounded) input ``x``."""
    x64 = x.double()
    w = torch.ones(x.shape[-1], dtype=torch.float64, device=x.device)
    b = torch.zeros_like(w) if cfg.bias else None
    return norm_oracle(cfg.kind)(x64, w, b, cfg.resolved_eps)  # the kind's, from the norm table


def norm_error_sweep(
    cases: list[tuple[str, NormConfig]],
    dtypes: list[str],
    scales: list[float],
    rows: int,
    d: int,
    device: torch.device,
) -> list[dict[str, Any]]:
    """Every case x dtype x input RMS: relative L2 error against ``oracle`` (``err_max``,
    ``err_median``, ``broken_frac`` >= ``BROKEN``) and ``stats_overflow_frac``, rows whose mean
    square in ``dtype`` is not finite."""
    base = unit_rows(rows, d).to(device)
    out = []
    for dtype in dtypes:
        dt = DTYPES[dtype]
        norms = {label: build_norm(cfg, d).to(device=device, dtype=dt) for label, cfg in cases}
        for s in scales:
            x = (base * s).to(dt)
            with torch.no_grad():
                overflow = (~torch.isfinite((x * x).mean(-1))).double().mean().item()
                for label, cfg in cases:
                    err = row_errors(norms[label](x), oracle(cfg, x))
                    out.append(
                        {
                            "case": label,
                            "dtype": dtype,
                            "rms": s,
                            "max_abs": x.abs().max().item(),
                            "err_max": err.max().item(),
                            "err_median": err.median().item(),
                            "broken_frac": ((err >= BROKEN) | ~torch.isfinite(err))
                            .double()
                            .mean()
                            .item(),
                            "nonfinite_frac": (~torch.isfinite(err)).double().mean().item(),
                            "stats_overflow_frac": overflow,
                        }
                    )
    return out


def first_broken(sweep: list[dict[str, Any]], case: str, dtype: str) -> float | None:
    """The smallest input RMS at which some row of ``case`` in ``dtype`` broke (None: never)."""
    bad = [
        r["rms"]
        for r in sweep
        if r["case"] == case and r["dtype"] == dtype and r["broken_frac"] > 0
    ]
    return min(bad) if bad else None


# --- the model-level check
# --------------------------------------------------------------------------


@contextlib.contextmanager
def scaled_stream(model: nn.Module, factor: float) -> Iterator[None]:
    """Multiply the residual stream entering block 0 by ``factor`` (hook on ``model.drop``)."""
    handle = model.drop.register_forward_hook(lambda m, args, out: out * factor)
    try:
        yield
    finally:
        handle.remove()


def overflowed_norms(model: nn.Module, *inputs: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """Run ``model(*inputs)`` (no grad): the norms whose statistics were not finite, in execution
    order, and the outputs."""
    found: list[str] = []
    handles = [
        m.register_forward_hook(
            lambda m, args, out, name=name: (
                found.append(name) if not norm_statistics_finite(m, args[0]) else None
            )
        )
        for name, m in model.named_modules()
        if hasattr(m, "eps") and hasattr(m, "upcast")
    ]
    try:
        with torch.no_grad():
            out = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return found, out


def model_check(
    model: nn.Module,
    ref: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    target_rms: float,
    autocast: bool = False,
) -> dict[str, Any]:
    """One forward of ``model`` (fp16, or fp32 under fp16 ``autocast``) with the stream entering
    block 0 at ``target_rms``, against its fp64 copy ``ref``: ``first_nonfinite``, overflowed norms,
    losses and the logits' relative error (at init the loss hardly depends on the logits)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        emb = ref.drop(ref.tok_emb(x) + ref.pos_emb(torch.arange(x.shape[1], device=device)))
        factor = target_rms / emb.pow(2).mean().sqrt().item()
    ctx = torch.autocast(device.type, dtype=torch.float16) if autocast else contextlib.nullcontext()
    with scaled_stream(model, factor), scaled_stream(ref, factor):
        with ctx:
            found = first_nonfinite(model, x)
            overflowed, (logits, loss) = overflowed_norms(model, x, y)
        with torch.no_grad():
            logits64, loss64 = ref(x, y)
    logit_err = row_errors(
        logits.reshape(-1, logits.shape[-1]), logits64.reshape(-1, logits.shape[-1])
    )
    return {
        "target_rms": target_rms,
        "max_abs": (emb * factor).abs().max().item(),
        "first_nonfinite": str(found) if found else None,
        "first_module": found.module if found else None,
        "overflowed_norms": overflowed,
        "n_norms": sum(hasattr(m, "upcast") for m in model.modules()),
        "loss": loss.item(),
        "loss64": loss64.item(),
        "logit_err_max": logit_err.max().item(),
        "logit_err_median": logit_err.median().item(),
    }


def model_study(inputs, targets: list[float]) -> list[dict[str, Any]]:
    """``model_check`` for ``upcast`` true and false, whole model fp16 and fp16 autocast."""
    from normlab.model import GPT
    from normlab.training.distributed import seed_everything

    cfg, out = inputs.cfg, []
    for upcast in (True, False):
        norm = dataclasses.replace(cfg.norm, upcast=upcast)
        # the same weights for both settings: norms draw no random numbers
        seed_everything(cfg.seed)
        model = GPT(cfg.model, norm).to(inputs.device).eval()
        ref = copy.deepcopy(model).double()
        half = copy.deepcopy(model).half()
        for mode, m in (("fp16 model", half), ("fp16 autocast", model)):
            for t in targets:
                out.append(
                    {
                        "mode": mode,
                        "upcast": upcast,
                        **model_check(
                            m, ref, inputs.x, inputs.y, t, autocast=mode == "fp16 autocast"
                        ),
                    }
                )
    return out


# --- figure, verdict, CLI -------------------------------------------------------------------------


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
