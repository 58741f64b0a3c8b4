"""The ``normlab-bench`` command: norm kernels (default), whole training steps of two setups
(``normlab-bench step``) and the device's measured matmul peak (``normlab-bench peak``).

The harness's own checks (normlab's step against a plain-PyTorch loop, its profile, settings
tables) are not part of the package: ``python -m benchmarks baseline|profile|settings`` from a
checkout; ``normlab-bench settings`` and ``normlab-bench step --baseline|--profile`` say so.
Every mode sets torch's thread count by ``train``'s rule (``--threads`` over the overrides'
``threads`` key) and puts it back at its end; a bad option or config is one line, exit status 2.

Why: docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from normlab.bench.norms import (
    CACHE_REGIMES,
    DTYPES,
    BenchError,
    bench_norms,
    csv,
    format_norm_table,
    model_width,
    parse_shape,
)
from normlab.bench.norms import summarize as summarize_norms
from normlab.bench.step import bench_step, format_step
from normlab.commands.train import auto_threads
from normlab.compose import compose_cli
from normlab.config import ConfigError, NormImpl, NormKind
from normlab.config.norm_table import KINDS
from normlab.data.tokens import DataError
from normlab.norms import available_impls
from normlab.training.distributed import resolve_device
from normlab.training.host_memory import keep_freed_memory
from normlab.training.peak import device_peak_tflops

NORM_USAGE = """\
normlab-bench [-h] [--kinds K,..] [--impls I,..] [--dtypes D,..] [--shapes RxH,..] [options]
       normlab-bench step [-h] [OVERRIDE ...] [--a OVERRIDES] [--b OVERRIDES] [options]
       normlab-bench peak [-h] [--device D] [--refresh] [--threads N] [--json PATH]"""

NORM_DESCRIPTION = """\
Three modes: "normlab-bench [options]" times norm kernels (this help);
"normlab-bench step ..." times whole training steps (see: normlab-bench step --help);
"normlab-bench peak" prints the measured matmul peak.

Norm mode: times every norm kind x implementation x dtype x shape, forward and
forward+backward, in interleaved rounds together with a same-size copy (the
practical memory-bandwidth ceiling). Prints the median ms per call, GB/s and the
fraction of the copy's GB/s, then RMSNorm's fastest against LayerNorm's fastest."""

STEP_DESCRIPTION = """\
Second mode of normlab-bench: builds training setups A and B from the Hydra configs
in one process and times whole optimizer steps (forward, backward, clip, AdamW) in
interleaved pairs (A B, then B A) after warm-up steps. Prints the median step time of
each and the median B/A ratio with its spread. The norm-kernel mode: normlab-bench --help.
normlab's step against a plain-PyTorch loop (the harness's overhead) and its profile:
python -m benchmarks baseline|profile from a checkout."""

#: The modes and options that moved to the repository's ``benchmarks/``: what to run instead.
MOVED = {
    "settings": "python -m benchmarks settings",
    "--baseline": "python -m benchmarks baseline",
    "--profile": "python -m benchmarks profile THREADS",
}


def _parser() -> argparse.ArgumentParser:
    """The norm-kernel mode's parser."""
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="normlab-bench",
        usage=NORM_USAGE,
        description=NORM_DESCRIPTION,
        epilog="normlab-bench step --help: options of the training-step benchmark",
        formatter_class=raw,
    )
    p.add_argument(
        "--kinds",
        type=csv,
        default=[k.name for k in KINDS],
        help="norm kinds, comma separated (default: every kind of the norm table: "
        f"{','.join(k.name for k in KINDS)})",
    )
    p.add_argument(
        "--impls",
        type=csv,
        default=None,
        help="concrete implementations, comma separated, of "
        f"{','.join(m for m in NormImpl.__members__ if m != 'auto')}; auto is not "
        "accepted (default: every one the device runs: torch,reference,compiled, "
        "+triton on CUDA, +cpp on CPU)",
    )
    p.add_argument(
        "--dtypes",
        type=csv,
        default=["fp32", "bf16"],
        help=f"input dtypes, comma separated, of {','.join(DTYPES)} (default: fp32,bf16)",
    )
    p.add_argument(
        "--shapes",
        type=csv,
        default=["8192x768"],
        help="input shapes ROWSxHIDDEN in elements, comma separated (default: 8192x768)",
    )
    p.add_argument(
        "--model",
        help="also time (rows of the first shape) x d_model of conf/model/<name>.yaml",
    )
    p.add_argument(
        "--param-dtype",
        choices=sorted(DTYPES),
        help="weight/bias dtype (default: the input dtype)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=20,
        help="interleaved timing rounds, one sample of every case each; the median is "
        "reported. With --cache cold each sample is a single call and noisier: use 10 or "
        "more (default: 20)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed calls per case before the rounds (compilation), + --settle more with "
        "--cache warm; the fastest sets the calls per sample (default: 3)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda, cuda:N or auto (default: auto, CUDA when available)",
    )
    p.add_argument(
        "--cache",
        choices=CACHE_REGIMES,
        default="warm",
        help="cache state of each sample: warm = after >= --settle untimed calls of the same "
        "case, several calls timed together; cold = after a --flush-mb write that evicts "
        "the caches, one call timed; cold samples are single calls and noisier, so use "
        "--repeats 10 or more (default: warm)",
    )
    p.add_argument(
        "--settle",
        type=int,
        default=4,
        metavar="CALLS",
        help="--cache warm: minimum number of untimed calls of a case before each of its "
        "samples (default: 4)",
    )
    p.add_argument(
        "--flush-mb",
        type=int,
        default=512,
        metavar="MIB",
        help="--cache cold: size in MiB of the buffer written before each sample (default: 512)",
    )
    p.add_argument(
        "--by-group",
        action="store_true",
        help="time each (dtype, shape) group on its own, interleaved with its own copy, and "
        "rewrite --json after each group: a run stopped midway keeps the groups it finished "
        "(default: one interleaved run of every case)",
    )
    add_common(p, "bench.json")
    return p


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
    """Set torch's intra-op threads as ``train`` does (``commands.train.auto_threads``),
    ``--threads`` over the ``threads`` key of ``overrides``; returns the line saying which.
    ConfigError: ``--threads`` below 1, or overrides ``train`` would refuse."""
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


def main(argv: list[str] | None = None) -> int:
    """``normlab-bench [norm options]``, ``normlab-bench step ...`` or ``normlab-bench peak ...``;
    returns the exit status. The thread count (``--threads``, else the ``threads`` key of the
    overrides, else ``train``'s rule) is set for the command and put back at its end."""
    argv = list(sys.argv[1:] if argv is None else argv)
    moved = [MOVED[a] for a in argv[:1] + (argv if argv[:1] == ["step"] else []) if a in MOVED]
    if moved:
        print(
            f"normlab-bench: error: {moved[0].split()[3]} moved: a check of the harness "
            f"itself, in the repository's benchmarks/: run {moved[0]} ... from a checkout",
            file=sys.stderr,
        )
        return 2
    previous = torch.get_num_threads()
    try:
        if argv[:1] in (["step"], ["peak"]):
            return MODES[argv[0]](argv[1:])
        return _norm_main(argv)
    finally:
        torch.set_num_threads(previous)


def _norm_main(argv: list[str]) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads {args.threads}: expected >= 1")
    print(set_threads(args.threads, None))
    malloc = keep_freed_memory()
    impls = args.impls or available_impls(resolve_device(args.device).type)
    for name, given, allowed in (
        ("kind", args.kinds, NormKind.__members__),
        ("impl", impls, NormImpl.__members__),
        ("dtype", args.dtypes, DTYPES),
    ):
        if bad := [v for v in given if v not in allowed or v == "auto"]:
            p.error(
                f"unknown {name} {', '.join(bad)}; allowed: "
                f"{', '.join(a for a in allowed if a != 'auto')}"
            )
    try:
        shapes = [parse_shape(s) for s in args.shapes]
    except ValueError:
        p.error(f"--shapes {','.join(args.shapes)}: expected ROWSxHIDDEN, e.g. 8192x768")
    if args.settle < 0 or args.flush_mb <= 0:
        p.error(
            f"--settle {args.settle} --flush-mb {args.flush_mb}: expected --settle >= 0 and "
            "--flush-mb > 0"
        )
    try:
        shapes += [(shapes[0][0], model_width(args.model))] if args.model else []
        shapes = list(dict.fromkeys(shapes))
        groups = [([d], [s]) for s in shapes for d in args.dtypes] if args.by_group else []
        result = _bench_groups(args, impls, groups or [(args.dtypes, shapes)])
    except (ConfigError, DataError, FileNotFoundError) as e:  # user errors: one line
        print(f"normlab-bench: {e}", file=sys.stderr)
        return 2
    except BenchError as e:  # nothing measured is a failure, not an empty success
        print(f"normlab-bench: {e}", file=sys.stderr)
        return 1
    result["malloc"] = malloc
    return write_result(result, format_norm_table(result), args.json)


def _bench_groups(args: argparse.Namespace, impls: list[str], groups: list[tuple]) -> dict:
    """``bench_norms`` of each ``(dtypes, shapes)`` group in turn, merged; with more than one group
    the merged result is written to ``--json`` after each (``complete`` false until the last).
    Raises BenchError when no group ran a norm case."""
    result, errors = None, []
    for i, (dtypes, shapes) in enumerate(groups):
        try:
            part = bench_norms(
                args.kinds,
                impls,
                dtypes,
                shapes,
                repeats=args.repeats,
                warmup=args.warmup,
                device=args.device,
                param_dtype=args.param_dtype,
                cache=args.cache,
                settle_calls=args.settle,
                flush_mb=args.flush_mb,
            )
        except BenchError as e:  # one group with nothing to run: the others still count
            errors.append(str(e))
            continue
        if result is None:
            result = part
        else:
            for key in ("rows", "copy", "skipped"):
                result[key] += part[key]
            result["summary"] = summarize_norms(result["rows"])
        result["complete"] = i == len(groups) - 1
        if len(groups) > 1:
            Path(args.json).write_text(json.dumps(result, indent=1))
    if result is None:
        raise BenchError("; ".join(errors))
    return result


def step_main(argv: list[str]) -> int:
    """``normlab-bench step``: two setups, timed in interleaved pairs."""
    p = step_parser()
    args = p.parse_intermixed_args(argv)
    a = [t for s in args.a for t in shlex.split(s)]
    b = [t for s in args.b for t in shlex.split(s)]

    def partial(result: dict) -> None:  # a run stopped midway keeps the pairs it timed
        Path(args.json).write_text(json.dumps(result, indent=1))

    def run() -> tuple[dict, str]:
        result = bench_step(
            a, b, args.overrides, pairs=args.pairs, warmup=args.warmup, progress=partial
        )
        return result, format_step(result)

    return run_mode(args, run, args.overrides)


def run_mode(
    args, run: Callable[[], tuple[dict, str]], overrides: list[str], prog: str = "normlab-bench"
) -> int:
    """Set the threads (``args.threads``, else ``overrides``), then ``run()`` -> (result, text);
    print the text and write the result to ``args.json`` with the allocator settings; a bad
    option or config is one line on stderr, exit status 2."""
    try:
        print(set_threads(args.threads, overrides))
        malloc = keep_freed_memory()
        result, text = run()
    except (ConfigError, DataError, FileNotFoundError) as e:  # user errors: one line
        print(f"{prog}: {e}", file=sys.stderr)
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
    "peak": peak_main,
}


if __name__ == "__main__":
    sys.exit(main())
