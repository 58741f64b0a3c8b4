"""``normlab-bench step``: whole optimizer steps of two training setups, timed in interleaved pairs.

``normlab-bench step --a norm=layer --b norm=rms model=small data.batch_size=8`` builds both
setups with ``training.setup.build_run`` (as ``train`` builds them) in one process and times the
training step itself, ``training.step.train_step`` (micro-batches forward + backward, unscale,
clip, AdamW, ``zero_grad``; its batches drawn inside, as in training), in interleaved pairs (A B,
then B A, alternating) after warm-up steps: median step time of each, median and spread of B/A.
The harness's own check, normlab's ``train_step`` against a plain-PyTorch loop of the same model,
batches and settings, is in the repository's ``benchmarks/`` (``python -m benchmarks baseline``);
it times its pair with :func:`time_pairs` and :func:`pair_result`.
"""

from __future__ import annotations

import contextlib
import os
import time
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
    """Every shape / dtype / grad mode is a graph of its own: room for 64 graphs per function
    (compilation still raises past it, ``setup.forbid_eager_fallback``, never falls back)."""
    import torch._dynamo

    limit = max(64, torch._dynamo.config.recompile_limit)
    return torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True)


@dataclass
class StepSetup:
    """One training setup (``run``: a ``training.step.Run`` from ``build_run``, no run dir) and the
    overrides it was composed from; ``step`` is the next 0-based step to run."""

    overrides: list[str]
    run: training_step.Run
    step: int = 0

    @property
    def cfg(self):
        return self.run.cfg

    def run_step(self) -> float:
        """One training step (``train_step``, the function ``train`` calls) at the schedule's
        learning rate, device synchronized at both ends; wall ms."""
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
    """Compose ``conf/train.yaml`` with ``overrides`` and build the run as ``train`` does.

    Raises:
        ConfigError, DataError: as ``train`` would, before anything is timed.
    """
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


def time_pairs(setups: list, pairs: int, warmup: int) -> list[list[float]]:
    """Wall ms per optimizer step of two setups (anything with ``run_step() -> ms``): ``warmup``
    untimed steps of each, then ``pairs`` timed pairs, A B then B A alternating, so that a drift
    of the machine's load falls on both."""
    times: list[list[float]] = [[], []]
    with recompile_limit():
        for _ in range(warmup):
            for s in setups:
                s.run_step()
        for i in range(pairs):
            for j in (0, 1) if i % 2 == 0 else (1, 0):
                times[j].append(setups[j].run_step())
    return times


def pair_result(
    setups: list, own: tuple[list[str], list[str]], common: list[str], times, **info
) -> dict:
    """The JSON-ready result of :func:`time_pairs` for ``setups`` (A, B) composed from ``common``
    plus their ``own`` overrides; ``info`` (``pairs``, ``warmup``, ``baseline``,
    ``loadavg_*``) is copied in."""
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
    a: list[str], b: list[str], common: list[str] = (), *, pairs: int = 10, warmup: int = 3
) -> dict:
    """Interleaved optimizer-step timing of the setups ``common + a`` and ``common + b``.

    Returns JSON-ready data: per setup ``loop`` (``normlab``), ``median_ms`` and ``times_ms``
    (ms per optimizer step), its resolved norm and tokens per step; ``ratio``: B/A step time per
    pair (``per_pair``) with its ``median``, ``p25`` / ``p75`` (IQR) and ``p10`` / ``p90``;
    ``loadavg_before`` / ``loadavg_after``: ``os.getloadavg()`` (1, 5, 15 min) around the timing.

    Raises:
        ConfigError, DataError: a setup ``train`` would refuse, before anything is timed.
    """
    setups = [build_setup([*common, *a]), build_setup([*common, *b])]
    before = list(os.getloadavg())  # the report warns when the machine was not quiet
    times = time_pairs(setups, pairs, warmup)
    load = {"loadavg_before": before, "loadavg_after": list(os.getloadavg())}
    return pair_result(
        setups, (a, b), common, times, pairs=pairs, warmup=warmup, baseline=False, **load
    )


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
