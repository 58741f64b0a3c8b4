"""``python -m benchmarks profile 1,2``: where normlab's training step spends more than the plain
loop (``benchmarks.plain_loop``), by ``torch.profiler``, at each thread count asked for.

Both setups are built once from the same overrides (same model, batches and settings), warmed up,
then profiled in the order normlab, plain, plain, normlab (so a drift of the machine's load
falls on both), ``steps`` optimizer steps each time. Per side: the wall ms per step (under the
profiler, which adds its own cost to every op) and every op's self CPU ms and calls per step; the
time outside any recorded op (Python, the interpreter between ops) is wall minus the sum of self
CPU. The difference table lists the ops where normlab spends more per step, largest first.
"""

from __future__ import annotations

import time

import torch

from benchmarks.plain_loop import build_plain
from normlab.bench.step import build_setup, count, recompile_limit
from normlab.training.tracking import synchronize

#: The pseudo-op for wall time not inside any recorded op.
OUTSIDE = "(outside ops: Python, interpreter)"


def _profile(setup, steps: int, acc: dict) -> None:
    """Profile ``steps`` steps of ``setup``; add wall ms and per-op self CPU ms and calls to
    ``acc``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        synchronize(setup_device(setup))
        t0 = time.perf_counter()
        for _ in range(steps):
            setup.run_step()
        wall = (time.perf_counter() - t0) * 1e3
    acc["wall_ms"] = acc.get("wall_ms", 0.0) + wall
    acc["steps"] = acc.get("steps", 0) + steps
    ops = acc.setdefault("ops", {})
    for e in prof.key_averages():
        ms, calls = ops.get(e.key, (0.0, 0))
        ops[e.key] = (ms + e.self_cpu_time_total / 1e3, calls + e.count)


def setup_device(setup) -> torch.device:
    """The device of a ``StepSetup`` or a ``PlainLoop``."""
    return setup.run.device if hasattr(setup, "run") else setup.device


def _per_step(acc: dict) -> dict:
    n = acc["steps"]
    ops = {k: (ms / n, calls / n) for k, (ms, calls) in acc["ops"].items()}
    wall = acc["wall_ms"] / n
    ops[OUTSIDE] = (max(0.0, wall - sum(ms for ms, _ in ops.values())), 0.0)
    return {"wall_ms": wall, "ops": ops}


def profile_steps(
    overrides: list[str], threads: list[int], *, steps: int = 5, warmup: int = 3, top: int = 12
) -> dict:
    """Profile normlab's ``train_step`` and the plain loop for ``overrides`` at each thread count.

    Returns JSON-ready data: per thread count (``"1"``, ``"2"``) the wall ms per step of each side,
    its ``top`` ops by self CPU ms per step (``[op, ms, calls]``), and ``more``: the ops where
    normlab spends more per step than the plain loop (``[op, normlab ms, plain ms, difference]``),
    largest first.
    """
    normlab = build_setup(list(overrides))
    plain = build_plain(list(overrides), normlab.run.device)
    result = {"mode": "profile", "overrides": list(overrides), "steps": steps, "threads": {}}
    previous = torch.get_num_threads()
    try:
        with recompile_limit():
            for n in threads:
                torch.set_num_threads(n)
                for _ in range(warmup):
                    normlab.run_step()
                    plain.run_step()
                accs: dict[str, dict] = {"normlab": {}, "plain": {}}
                for side in ("normlab", "plain", "plain", "normlab"):
                    _profile(normlab if side == "normlab" else plain, steps, accs[side])
                result["threads"][str(n)] = _compare(
                    _per_step(accs["normlab"]), _per_step(accs["plain"]), top
                )
    finally:
        torch.set_num_threads(previous)
    return result


def _compare(a: dict, b: dict, top: int) -> dict:
    def ranked(side: dict) -> list:
        rows = sorted(side["ops"].items(), key=lambda kv: -kv[1][0])[:top]
        return [[k, ms, calls] for k, (ms, calls) in rows]

    names = set(a["ops"]) | set(b["ops"])
    diff = [[k, a["ops"].get(k, (0.0, 0))[0], b["ops"].get(k, (0.0, 0))[0]] for k in names]
    more = sorted(([k, x, y, x - y] for k, x, y in diff if x > y), key=lambda r: -r[3])[:top]
    return {
        "normlab_wall_ms": a["wall_ms"],
        "plain_wall_ms": b["wall_ms"],
        "normlab_top": ranked(a),
        "plain_top": ranked(b),
        "more": more,
    }


def format_profile(result: dict) -> str:
    """Per thread count: wall per step of each side, each side's top ops, and normlab's excess."""
    lines = [
        f"profile of {count(result['steps'], 'step')} x 2 per side (normlab, plain, plain, "
        f"normlab); overrides: {' '.join(result['overrides']) or '-'}"
    ]
    for n, r in result["threads"].items():
        lines.append(
            f"-- {count(int(n), 'thread')}: normlab {r['normlab_wall_ms']:.2f} ms/step, plain "
            f"{r['plain_wall_ms']:.2f} ms/step (wall under the profiler), normlab/plain "
            f"{r['normlab_wall_ms'] / r['plain_wall_ms']:.3f}"
        )
        for side in ("normlab", "plain"):
            lines.append(f"   top self CPU, {side} (ms/step, calls/step):")
            lines += [
                f"     {ms:8.3f}  {calls:6.1f}  {k[:70]}" for k, ms, calls in r[f"{side}_top"]
            ]
        lines.append("   where normlab spends more (ms/step: normlab, plain, difference):")
        lines += [f"     {x:8.3f} {y:8.3f} {d:+8.3f}  {k[:60]}" for k, x, y, d in r["more"]]
    return "\n".join(lines)
