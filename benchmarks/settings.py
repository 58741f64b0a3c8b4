"""``python -m benchmarks settings``: N training setups timed round-robin in one process, with
tokens/s and MFU against the device's measured matmul peak in each setup's precision.

``python -m benchmarks settings model=gpt2_small data.batch_size=8 model.context_length=256`` times,
by default, the four settings fp32 / bf16 autocast x compile off / on (each ``--setting`` replaces
the defaults). Every setup is built as ``train`` builds it and steps through
``training.step.train_step`` (``bench_step.StepSetup``). After the warm-up steps each round times
one step of every setup, the order reversed every other round (A B C D, D C B A, ...), so a drift of
the machine's load falls on all. Per setup: the median ms per optimizer step (and IQR), tokens/s and
MFU at the median, the peak MFU is against (``peak_tflops: auto`` measures fp32 for fp32 and bf16
for bf16, cached per machine: ``training.peak``), and the speed-up: the median over rounds of the
first setup's step time over this one's.
"""

from __future__ import annotations

import shlex

import numpy as np
import torch

from normlab.bench.step import build_setup, count, recompile_limit
from normlab.training.peak import resolve_peak

#: The settings timed when none is given: precision x compile.
DEFAULT_SETTINGS = (
    "precision=fp32 compile=false",
    "precision=bf16 compile=false",
    "precision=fp32 compile=true",
    "precision=bf16 compile=true",
)


def bench_settings(
    settings: list[str], common: list[str] = (), *, rounds: int = 5, warmup: int = 2
) -> dict:
    """Round-robin optimizer-step timing of ``common + setting`` for each setting (a string of
    space-separated Hydra overrides).

    Returns JSON-ready data: ``rows``, one per setting: ``setting``, ``median_ms``, ``p25_ms``,
    ``p75_ms``, ``times_ms``, ``tokens_per_step``, ``tokens_per_s``, ``flops_per_step``, ``mfu``
    (fraction of ``peak_tflops``), ``peak_tflops``, ``peak_tflops_source``, ``peak_dtype``,
    ``speedup`` (median over rounds of the first setting's step time over this one's).

    Raises:
        ConfigError, DataError: a setting that ``train`` would refuse, before anything is timed.
    """
    setups = [build_setup([*common, *shlex.split(s)]) for s in settings]
    peaks = [
        resolve_peak(s.cfg.peak_tflops, s.run.device, s.cfg.precision.dtype.name) for s in setups
    ]
    times: list[list[float]] = [[] for _ in setups]
    with recompile_limit():
        for _ in range(warmup):
            for s in setups:
                s.run_step()
        for r in range(rounds):
            order = range(len(setups)) if r % 2 == 0 else reversed(range(len(setups)))
            for j in order:
                times[j].append(setups[j].run_step())
    rows = []
    first = np.array(times[0])
    for setting, s, peak, t in zip(settings, setups, peaks, times, strict=True):
        med = float(np.median(t))
        flops = s.run.model.flops_per_token() * s.cfg.tokens_per_step
        rows.append(
            {
                "setting": setting,
                "norm": f"{s.cfg.norm.kind.name}/{s.cfg.norm.impl.name}",
                "median_ms": med,
                "p25_ms": float(np.percentile(t, 25)),
                "p75_ms": float(np.percentile(t, 75)),
                "times_ms": t,
                "tokens_per_step": s.cfg.tokens_per_step,
                "tokens_per_s": s.cfg.tokens_per_step / (med / 1e3),
                "flops_per_step": flops,
                "mfu": flops / (med / 1e3) / (peak["peak_tflops"] * 1e12),
                **peak,
                "speedup": float(np.median(first / np.array(t))),
            }
        )
    return {
        "mode": "settings",
        "device": str(setups[0].run.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "warmup": warmup,
        "common": list(common),
        "model": setups[0].cfg.model.name,
        "rows": rows,
    }


def format_settings(result: dict) -> str:
    """The settings table: one line per setting."""
    lines = [
        f"settings benchmark on {result['device']} ({count(result['threads'], 'thread')}, torch "
        f"{result['torch']}): {count(result['rounds'], 'round')} after "
        f"{count(result['warmup'], 'warm-up step')} each; all: {' '.join(result['common']) or '-'}",
        f"{'setting':34s} {'ms/step (IQR)':>24s} {'tokens/s':>9s} {'MFU':>6s} "
        f"{'peak TFLOP/s':>18s} {'speed-up':>8s}",
    ]
    for r in result["rows"]:
        iqr = f"{r['median_ms']:.1f} ({r['p25_ms']:.1f}-{r['p75_ms']:.1f})"
        peak = f"{r['peak_tflops']:.3f} {r['peak_dtype']} {r['peak_tflops_source'][:4]}"
        lines.append(
            f"{r['setting'][:34]:34s} {iqr:>24s} {r['tokens_per_s']:9.0f} {r['mfu']:6.1%} "
            f"{peak:>18s} {r['speedup']:8.3f}"
        )
    lines.append("speed-up: median over rounds of the first setting's step time over this one's")
    return "\n".join(lines)
