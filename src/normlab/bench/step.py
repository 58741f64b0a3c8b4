"""``normlab-bench step``: whole optimizer steps of two training setups, timed in interleaved pairs.

Both setups are built in one process with ``training.setup.build_run``, as ``train`` builds them,
and ``training.step.train_step`` is timed in pairs (A B, then B A) after warm-up steps: each
side's median step time, and the median and spread of B/A. ``benchmarks/`` times its plain-loop
baseline with ``time_pairs`` and ``pair_result``.

Why: docs/benchmarks.md
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from normlab.compose import compose
from normlab.training import step as training_step
from normlab.training.diagnostics import ActivationRecorder, gain_stats
from normlab.training.setup import build_run
from normlab.training.tracking import synchronize


def count(n: int, noun: str) -> str:
    """``"1 thread"``, ``"2 threads"``: ``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def recompile_limit() -> contextlib.AbstractContextManager:
    """Room for 64 graphs per compiled function (each shape, dtype, grad mode is one); past it
    compilation still raises, never falls back to eager."""
    import torch._dynamo

    limit = max(64, torch._dynamo.config.recompile_limit)
    return torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True)


@dataclass
class StepSetup:
    """A ``Run`` from ``build_run`` (no run dir), its ``overrides``, the next 0-based ``step``."""

    overrides: list[str]
    run: training_step.Run
    step: int = 0

    @property
    def cfg(self):
        return self.run.cfg

    def run_step(self) -> float:
        """Wall ms of one ``train_step`` at the schedule's lr, device synchronized at both ends."""
        lr = training_step.lr_at(self.step, self.cfg.max_steps, self.cfg.optim)
        every = self.cfg.diag_interval  # a diagnosed step as the loop runs it: hooks, gains
        diag = ActivationRecorder() if every and (self.step + 1) % every == 0 else None
        synchronize(self.run.device)
        t0 = time.perf_counter()
        training_step.train_step(self.run, self.step, lr, diag)
        if diag is not None:
            gain_stats(self.run.model)
        synchronize(self.run.device)
        self.step += 1
        return (time.perf_counter() - t0) * 1e3


def build_setup(overrides: list[str]) -> StepSetup:
    """Compose ``overrides`` and build the run as ``train`` does (its ConfigError, DataError)."""
    return StepSetup(list(overrides), build_run(compose(list(overrides))))


def _ratio(a: list[float], b: list[float]) -> dict:
    ratios = np.array(b) / np.array(a)
    p10, p25, med, p75, p90 = (float(v) for v in np.percentile(ratios, [10, 25, 50, 75, 90]))
    return {
        "median": med,
        "p10": p10,
        "p25": p25,
        "p75": p75,
        "p90": p90,
        "per_pair": ratios.tolist(),
    }


def _info(s, own: list[str], t: list[float]) -> dict:
    cfg = s.cfg
    return {
        "loop": getattr(s, "loop", "normlab"),
        "overrides": list(own),
        "composed_with": list(s.overrides),
        "norm": f"{cfg.norm.kind.name}/{cfg.norm.impl.name}",
        "precision": cfg.precision.dtype.name,
        "model": cfg.model.name,
        "tokens_per_step": cfg.tokens_per_step,
        "median_ms": float(np.median(t)),
        "times_ms": t,
    }


def time_pairs(
    setups: list, pairs: int, warmup: int, after_pair: Callable | None = None
) -> list[list[float]]:
    """Wall ms per step of two setups (``run_step() -> ms``): ``warmup`` untimed steps each, then
    ``pairs`` timed pairs, A B then B A; ``after_pair(times so far)`` after each pair."""
    times: list[list[float]] = [[], []]  # alternating: a drift of the machine's load hits both
    with recompile_limit():
        for _ in range(warmup):
            for s in setups:
                s.run_step()
        for i in range(pairs):
            for j in (0, 1) if i % 2 == 0 else (1, 0):
                times[j].append(setups[j].run_step())
            if after_pair is not None:
                after_pair(times)
    return times


def pair_result(
    setups: list, own: tuple[list[str], list[str]], common: list[str], times, **info
) -> dict:
    """The JSON-ready result of ``time_pairs`` for ``setups`` (A, B) from ``common`` plus their
    ``own`` overrides, ``info`` copied in."""
    return {
        "mode": "step",
        "device": str(setups[1].run.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **info,
        "common": list(common),
        "a": _info(setups[0], own[0], times[0]),
        "b": _info(setups[1], own[1], times[1]),
        "ratio": _ratio(times[0], times[1]),
    }


def bench_step(
    a: list[str],
    b: list[str],
    common: list[str] = (),
    *,
    pairs: int = 10,
    warmup: int = 3,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Interleaved step timing of ``common + a`` and ``common + b``: per setup ``median_ms``,
    ``times_ms``; ``ratio`` B/A per pair with median and percentiles; ``loadavg_*``; ``complete``.
    ``progress(result so far)`` after each pair. Raises ConfigError, DataError for a setup
    ``train`` would refuse, before anything is timed."""
    setups = [build_setup([*common, *a]), build_setup([*common, *b])]
    before = list(os.getloadavg())  # the report warns when the machine was not quiet

    def result(times, complete: bool) -> dict:
        load = {"loadavg_before": before, "loadavg_after": list(os.getloadavg())}
        n = len(times[0])
        info = {"pairs": n, "warmup": warmup, "baseline": False, "complete": complete}
        return pair_result(setups, (a, b), common, times, **info, **load)

    report = None if progress is None else (lambda times: progress(result(times, False)))
    return result(time_pairs(setups, pairs, warmup, report), True)


def format_step(result: dict) -> str:
    """The step benchmark in four lines."""
    r = result["ratio"]
    both = " ".join(result["common"]) or "-"
    lines = [
        f"step benchmark on {result['device']} ({count(result['threads'], 'thread')}): "
        f"{count(result['pairs'], 'interleaved pair')} after "
        f"{count(result['warmup'], 'warm-up step')} each; both: {both}"
    ]
    for key in ("a", "b"):
        s = result[key]
        loop = f"{s['loop']} loop: " if result.get("baseline") else ""
        lines.append(
            f"{key.upper()} {loop}{' '.join(s['overrides']) or '(defaults)'} [{s['model']}, "
            f"{s['norm']}, {s['precision']}, {s['tokens_per_step']} tokens/step]: "
            f"median {s['median_ms']:.1f} ms/step"
        )
    what = "normlab/plain" if result.get("baseline") else "B/A"
    lines.append(
        f"{what} step time: median {r['median']:.3f} (IQR {r['p25']:.3f}-{r['p75']:.3f}, "
        f"10-90% {r['p10']:.3f}-{r['p90']:.3f})"
    )
    return "\n".join(lines)
