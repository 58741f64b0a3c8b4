"""Where the step time goes: norms vs attention vs MLP vs the rest, per norm implementation.

``normlab-study norm-cost`` builds one setup per norm kind x implementation as ``normlab-bench
step`` does and, in interleaved rounds, times a plain step and a step whose module hooks split it
into ``CATEGORIES``: ``norm``, ``attention``, ``mlp`` (forward and backward hooks, exclusive time),
``other`` (the rest of forward and backward) and ``optimizer`` (the rest of the step), which sum to
the hooked step's time; means over the steps are reported. Writes ``norm_cost.md``,
``norm_cost.png`` and ``norm_cost.json``.

Why: docs/experiments.md
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from normlab.studies.common import md_table
from normlab.training.diagnostics import named_norms
from normlab.training.tracking import synchronize

CATEGORIES = ("norm", "attention", "mlp", "other", "optimizer")
HOOKED = ("norm", "attention", "mlp")


def categories(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    """``id(module) -> (module, category)`` to hook: every norm of ``named_norms`` (not modules
    inside it), every ``CausalSelfAttention`` (``attention``) and ``MLP`` (``mlp``)."""
    from normlab.model import MLP, CausalSelfAttention

    out = {id(m): (m, "norm") for _, _, m in named_norms(model)}
    for m in model.modules():
        if isinstance(m, (CausalSelfAttention, MLP)):
            out[id(m)] = (m, "attention" if isinstance(m, CausalSelfAttention) else "mlp")
    return out


class ModuleTimer:
    """Wall ms per ``(category, "fwd" | "bwd")`` of the ``categories`` modules while ``attached``,
    exclusive: each slice between two hook events goes to the innermost open module only."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.model, self.device = model, device
        self.ms: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self._open: dict[str, list[tuple[int, str]]] = defaultdict(list)  # phase -> (id, cat)
        self._last: dict[str, float] = {}

    def reset(self) -> None:
        self.ms.clear()
        self.calls.clear()
        self._open.clear()
        self._last.clear()

    def _tick(self, phase: str) -> None:
        """Give the time since the phase's last event to its innermost open module."""
        synchronize(self.device)
        now = time.perf_counter()
        stack = self._open[phase]
        if stack:
            self.ms[(stack[-1][1], phase)] += (now - self._last[phase]) * 1e3
        self._last[phase] = now

    def _start(self, module: nn.Module, cat: str, phase: str) -> None:
        self._tick(phase)
        self._open[phase].append((id(module), cat))

    def _stop(self, module: nn.Module, cat: str, phase: str) -> None:
        self._tick(phase)
        stack = self._open[phase]
        for j in range(len(stack) - 1, -1, -1):
            if stack[j][0] == id(module):
                del stack[j]
                self.calls[(cat, phase)] += 1
                return

    @contextlib.contextmanager
    def attached(self) -> Iterator[ModuleTimer]:
        """Register the hooks for the ``with`` block, then remove them."""
        handles = []
        for m, cat in categories(self.model).values():
            handles += [
                m.register_forward_pre_hook(lambda m, a, c=cat: self._start(m, c, "fwd")),
                m.register_forward_hook(lambda m, a, o, c=cat: self._stop(m, c, "fwd")),
                m.register_full_backward_pre_hook(lambda m, go, c=cat: self._start(m, c, "bwd")),
                m.register_full_backward_hook(lambda m, gi, go, c=cat: self._stop(m, c, "bwd")),
            ]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def breakdown(
    module_ms: dict[tuple[str, str], float], fwd_ms: float, bwd_ms: float, total_ms: float
) -> dict[str, float]:
    """Split one step into ``CATEGORIES`` (ms, summing to ``total_ms``), with ``<cat>_fwd``,
    ``<cat>_bwd`` and ``total``."""
    out: dict[str, float] = {}
    for cat in HOOKED:
        out[f"{cat}_fwd"], out[f"{cat}_bwd"] = (
            module_ms.get((cat, "fwd"), 0.0),
            module_ms.get((cat, "bwd"), 0.0),
        )
        out[cat] = out[f"{cat}_fwd"] + out[f"{cat}_bwd"]
    out["other_fwd"] = fwd_ms - sum(out[f"{c}_fwd"] for c in HOOKED)
    out["other_bwd"] = bwd_ms - sum(out[f"{c}_bwd"] for c in HOOKED)
    out["other"] = out["other_fwd"] + out["other_bwd"]
    out["optimizer"] = total_ms - fwd_ms - bwd_ms
    out["total"] = total_ms
    return out


def hooked_step(setup, timer: ModuleTimer) -> dict[str, float]:
    """One ``train_step`` of a ``StepSetup`` with ``timer``'s hooks and a synchronized clock read at
    each phase mark, split by ``breakdown``."""
    from normlab.training.step import lr_at, train_step

    cfg, dev = setup.cfg, setup.run.device
    lr = lr_at(setup.step, cfg.max_steps, cfg.optim)
    phase_ms = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    current: list = [None, 0.0]  # the phase running and when it started

    def mark(phase: str) -> None:
        synchronize(dev)
        now = time.perf_counter()
        if current[0] is not None:
            phase_ms[current[0]] += (now - current[1]) * 1e3
        current[:] = [phase, now]

    timer.reset()
    with timer.attached():
        synchronize(dev)
        t0 = time.perf_counter()
        train_step(setup.run, setup.step, lr, mark=mark)
        synchronize(dev)
        total = (time.perf_counter() - t0) * 1e3
    setup.step += 1
    return breakdown(dict(timer.ms), phase_ms["forward"], phase_ms["backward"], total)


def variants(device_type: str, kinds: list[str], impls: list[str] | None) -> list[list[str]]:
    """``[norm=<kind>, norm.impl=<impl>]`` per kind x impl (default: ``available_impls``)."""
    from normlab.config import NormKind
    from normlab.norms import available_impls

    def pick(kind: str) -> list[str]:  # an unknown kind is refused when its config is composed
        return impls or available_impls(device_type, NormKind.__members__.get(kind))

    return [[f"norm={k}", f"norm.impl={i}"] for k in kinds for i in pick(k)]


def measure(
    common: list[str], variant_overrides: list[list[str]], steps: int = 10, warmup: int = 3
) -> list[dict[str, Any]]:
    """Warm every setup up, then ``steps`` interleaved rounds of a plain and a hooked step each;
    per variant ``plain_ms`` (median), the mean of each ``breakdown`` key (ms) and ``calls``."""
    from normlab.bench.step import build_setup, recompile_limit

    setups = [build_setup([*common, *v]) for v in variant_overrides]
    timers = [ModuleTimer(s.run.model, s.run.device) for s in setups]
    plain: list[list[float]] = [[] for _ in setups]
    hooked: list[list[dict[str, float]]] = [[] for _ in setups]
    with recompile_limit():
        for s, t in zip(setups, timers, strict=True):
            for _ in range(warmup):
                s.run_step()
                hooked_step(s, t)
        for _ in range(steps):
            for i, (s, t) in enumerate(zip(setups, timers, strict=True)):
                plain[i].append(s.run_step())
                hooked[i].append(hooked_step(s, t))
    out = []
    for s, t, p, h in zip(setups, timers, plain, hooked, strict=True):
        mean = {k: float(np.mean([b[k] for b in h])) for k in h[0]}
        out.append(
            {
                "variant": f"{s.cfg.norm.kind.name}/{s.cfg.norm.impl.name}",
                "overrides": s.overrides,
                "device": str(s.run.device),
                "model": s.cfg.model.name,
                "precision": s.cfg.precision.dtype.name,
                "tokens_per_step": s.cfg.tokens_per_step,
                "plain_ms": float(np.median(p)),
                "plain_times_ms": p,
                **mean,
                "calls": {f"{c}/{ph}": n for (c, ph), n in t.calls.items()},
                "steps": steps,
            }
        )
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per variant the plain and hooked step time, each category in ms and % of hooked."""
    body = [
        [
            f"`{r['variant']}`",
            f"{r['plain_ms']:.1f}",
            f"{r['total']:.1f}",
            *(f"{r[c]:.1f} ({100 * r[c] / r['total']:.0f}%)" for c in CATEGORIES),
            f"{r['norm_fwd']:.1f} / {r['norm_bwd']:.1f}",
        ]
        for r in rows
    ]
    return md_table(
        [
            "variant",
            "step ms (no hooks, median)",
            "step ms (hooked, mean)",
            *CATEGORIES,
            "norm fwd / bwd ms",
        ],
        body,
    )


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Stacked bars of ``CATEGORIES`` (ms, hooked step) per variant, the plain step marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6, 1.3 * len(rows) + 2), 5), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for i, cat in enumerate(CATEGORIES):
        vals = np.array([max(r[cat], 0.0) for r in rows])
        bars = ax.bar(x, vals, 0.6, bottom=bottom, label=cat, color=f"C{i}")
        if cat == "norm":
            ax.bar_label(
                bars,
                [f"{100 * r['norm'] / r['total']:.0f}%" for r in rows],
                label_type="center",
                fontsize="x-small",
            )
        bottom += vals
    ax.scatter(
        x,
        [r["plain_ms"] for r in rows],
        marker="_",
        s=900,
        color="black",
        zorder=3,
        label="step without hooks (median)",
    )
    ax.set_xticks(x, [r["variant"] for r in rows], fontsize="small")
    ax.set(ylabel="ms per optimizer step", title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0), markerscale=0.4)
    fig.savefig(path, dpi=120)
    return path
