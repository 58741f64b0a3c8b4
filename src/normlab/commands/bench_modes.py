"""``normlab-bench step`` (two setups interleaved, ``--baseline`` against a plain-PyTorch loop,
``--profile`` of where normlab's step spends more), ``normlab-bench settings`` (N settings
round-robin, tokens/s and MFU) and ``normlab-bench peak``; the thread rule every mode shares."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from normlab.commands.train import auto_threads
from normlab.compose import compose_cli
from normlab.config import ConfigError
from normlab.data.tokens import DataError
from normlab.studies.bench_settings import DEFAULT_SETTINGS, bench_settings, format_settings
from normlab.studies.bench_step import bench_step, format_step
from normlab.studies.profile_step import format_profile, profile_steps
from normlab.training.distributed import resolve_device
from normlab.training.host_memory import keep_freed_memory
from normlab.training.peak import device_peak_tflops

STEP_DESCRIPTION = """\
Second mode of normlab-bench: builds training setups A and B from the Hydra configs
in one process and times whole optimizer steps (forward, backward, clip, AdamW) in
interleaved pairs (A B, then B A) after warm-up steps. Prints the median step time of
each and the median B/A ratio with its spread. --baseline: A is a plain-PyTorch loop
of the same model, batches and settings, B normlab's own step (B/A = normlab/plain).
--profile 1,2: torch.profiler of both at each thread count, and where normlab spends
more. The norm-kernel mode: normlab-bench --help."""

SETTINGS_DESCRIPTION = """\
Third mode of normlab-bench: builds one training setup per --setting (default: fp32
and bf16 autocast, compile off and on) and times their optimizer steps round-robin,
the order reversed every other round. Prints ms/step (IQR), tokens/s, MFU against the
measured matmul peak of each setting's precision (peak_tflops: auto) and the speed-up
over the first setting."""


def add_common(p: argparse.ArgumentParser, json_default: str, overrides: bool = True) -> None:
    """``--threads`` and ``--json``, the options of every mode (``overrides``: the mode takes
    config overrides, whose ``threads`` key is then the default thread count)."""
    from_overrides = "the threads key of the overrides, else " if overrides else ""
    p.add_argument(
        "--threads",
        type=int,
        help=f"CPU threads (default: {from_overrides}train's rule: $OMP_NUM_THREADS, else half "
        "the cores)",
    )
    p.add_argument(
        "--json",
        default=json_default,
        help=f"where to write all results (default: ./{json_default})",
    )


def set_threads(flag: int | None, overrides: list[str] | None) -> str:
    """Set torch's intra-op threads as ``train`` does (``commands.train.auto_threads``), with
    ``--threads`` over the ``threads`` key of ``overrides``; returns the line saying which.

    Raises:
        ConfigError: ``--threads`` below 1, or overrides ``train`` would refuse.
    """
    if flag is not None and flag < 1:
        raise ConfigError(f"--threads={flag} is not allowed: must be >= 1")
    configured = compose_cli(list(overrides)).threads if overrides and not flag else None
    if flag:
        n, why = flag, "--threads"
    elif configured:
        n, why = configured, "threads="
    else:
        n = auto_threads()
        why = "$OMP_NUM_THREADS" if os.environ.get("OMP_NUM_THREADS") else "half the cores"
    torch.set_num_threads(n)
    return f"threads: {n} (from {why})"


def write_result(result: dict, text: str, path: str) -> int:
    """Print ``text``, write ``result`` as JSON to ``path``; exit status 0."""
    print(text)
    Path(path).write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


def step_parser() -> argparse.ArgumentParser:
    """The parser of ``normlab-bench step``."""
    p = argparse.ArgumentParser(
        prog="normlab-bench step",
        description=STEP_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides of both setups (model=small data.batch_size=8)",
    )
    p.add_argument(
        "--a",
        action="append",
        default=[],
        help="overrides of setup A, space separated (--a norm=layer)",
    )
    p.add_argument("--b", action="append", default=[], help="overrides of setup B (--b norm=rms)")
    p.add_argument(
        "--baseline",
        action="store_true",
        help="A: a plain-PyTorch loop of the same model, batches and settings; B: normlab's step",
    )
    p.add_argument(
        "--profile",
        metavar="THREADS",
        help="profile normlab's step and the plain loop at these thread counts (1,2) instead "
        "of timing pairs; --pairs steps per profile",
    )
    p.add_argument(
        "--pairs", type=int, default=10, help="timed step pairs, A B then B A (default: 10)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed optimizer steps per setup before timing: compilation, allocator (default: 3)",
    )
    add_common(p, "bench_step.json")
    return p


def _threads_list(p: argparse.ArgumentParser, given: str) -> list[int]:
    try:
        threads = [int(t) for t in given.split(",")]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        p.error(f"--profile {given}: expected thread counts >= 1, comma separated (1,2)")
    return threads


def step_main(argv: list[str]) -> int:
    """``normlab-bench step``: two setups interleaved, ``--baseline`` or ``--profile``."""
    p = step_parser()
    args = p.parse_intermixed_args(argv)
    if (args.baseline or args.profile) and args.b:
        p.error("--baseline and --profile time one setup (overrides and --a), not --b")
    threads = _threads_list(p, args.profile) if args.profile else None
    a = [t for s in args.a for t in shlex.split(s)]
    b = [t for s in args.b for t in shlex.split(s)]

    def run() -> tuple[dict, str]:
        if threads:
            result = profile_steps([*args.overrides, *a], threads, steps=args.pairs)
            return result, format_profile(result)
        result = bench_step(
            a, b, args.overrides, pairs=args.pairs, warmup=args.warmup, baseline=args.baseline
        )
        return result, format_step(result)

    return _run(args, run, args.overrides)


def settings_main(argv: list[str]) -> int:
    """``normlab-bench settings``: N settings round-robin with tokens/s and MFU."""
    p = argparse.ArgumentParser(
        prog="normlab-bench settings",
        description=SETTINGS_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides of every setting")
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        help="one setting's overrides, space separated; repeat it (default: "
        + "; ".join(DEFAULT_SETTINGS)
        + ")",
    )
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (default: 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per setting (default: 2)")
    add_common(p, "bench_settings.json")
    args = p.parse_intermixed_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        p.error(f"--rounds {args.rounds} --warmup {args.warmup}: expected >= 1 and >= 0")
    settings = args.setting or list(DEFAULT_SETTINGS)

    def run() -> tuple[dict, str]:
        result = bench_settings(settings, args.overrides, rounds=args.rounds, warmup=args.warmup)
        return result, format_settings(result)

    return _run(args, run, args.overrides)


def _run(args, run: Callable[[], tuple[dict, str]], overrides: list[str]) -> int:
    try:
        print(set_threads(args.threads, overrides))
        malloc = keep_freed_memory()
        result, text = run()
    except (ConfigError, DataError, FileNotFoundError) as e:  # user errors: one line
        print(f"normlab-bench: {e}", file=sys.stderr)
        return 2
    result["malloc"] = malloc
    return write_result(result, text, args.json)


def peak_main(argv: list[str]) -> int:
    """``normlab-bench peak``: the device's dense matmul peak in fp32 and bf16 (TFLOP/s, the best
    timed ``n x n`` matmul, ``2 n^3`` FLOP; ``training.peak``), from the per-machine cache unless
    ``--refresh``; printed and written to ``--json``."""
    p = argparse.ArgumentParser(
        prog="normlab-bench peak",
        description="Fourth mode of normlab-bench: the measured dense matmul peak (fp32, bf16) "
        "that MFU is reported against, cached per machine, thread count and torch version.",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    add_common(p, "bench_peak.json", overrides=False)
    args = p.parse_args(argv)
    try:
        print(set_threads(args.threads, None))
        device = resolve_device(args.device)
    except ConfigError as e:
        print(f"normlab-bench peak: {e}", file=sys.stderr)
        return 2
    result = {"mode": "peak", "device": str(device), "torch": torch.__version__}
    result["threads"] = torch.get_num_threads()
    for dtype in ("fp32", "bf16"):
        result[dtype] = entry = device_peak_tflops(device, dtype, refresh=args.refresh)
        origin = f"cached {entry['measured_at']}" if entry["cached"] else "measured now"
        print(
            f"{dtype}: {entry['tflops']:.3f} TFLOP/s dense matmul peak ({origin}; {entry['key']})"
        )
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")
    return 0


#: ``normlab-bench <mode>``: the entry point of each mode after the first word.
MODES: dict[str, Callable[[list[str]], int]] = {
    "step": step_main,
    "settings": settings_main,
    "peak": peak_main,
}
