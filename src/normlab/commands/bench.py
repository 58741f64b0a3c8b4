"""The ``normlab-bench`` command: norm kernels (default, here), whole training steps
(``normlab-bench step``, with ``--baseline`` / ``--profile``), settings tables (``normlab-bench
settings``) and the device's measured matmul peak (``normlab-bench peak``): those three in
``bench_modes.py``."""

from __future__ import annotations

import argparse
import sys

import torch

from normlab.commands.bench_modes import (
    MODES,
    add_common,
    set_threads,
    step_parser,
    write_result,
)
from normlab.config import ConfigError, NormImpl, NormKind
from normlab.data.tokens import DataError
from normlab.norms import available_impls
from normlab.norms.table import KINDS
from normlab.studies.bench_norms import (
    CACHE_REGIMES,
    DTYPES,
    BenchError,
    bench_norms,
    csv,
    model_width,
    parse_shape,
)
from normlab.studies.bench_tables import format_norm_table
from normlab.training.distributed import resolve_device
from normlab.training.host_memory import keep_freed_memory

NORM_USAGE = """\
normlab-bench [-h] [--kinds K,..] [--impls I,..] [--dtypes D,..] [--shapes RxH,..] [options]
       normlab-bench step [-h] [OVERRIDE ...] [--a OVERRIDES] [--b OVERRIDES] [options]
       normlab-bench step [-h] [OVERRIDE ...] --baseline | --profile THREADS [options]
       normlab-bench settings [-h] [OVERRIDE ...] [--setting OVERRIDES ...] [options]
       normlab-bench peak [-h] [--device D] [--refresh] [--threads N] [--json PATH]"""

NORM_DESCRIPTION = """\
Four modes: "normlab-bench [options]" times norm kernels (this help);
"normlab-bench step ..." times whole training steps (see: normlab-bench step --help);
"normlab-bench settings ..." times N settings round-robin with tokens/s and MFU;
"normlab-bench peak" prints the measured matmul peak.

Norm mode: times every norm kind x implementation x dtype x shape, forward and
forward+backward, in interleaved rounds together with a same-size copy (the
practical memory-bandwidth ceiling). Prints the median ms per call, GB/s and the
fraction of the copy's GB/s, then RMSNorm's fastest against LayerNorm's fastest."""


def _parser(step: bool = False) -> argparse.ArgumentParser:
    """The norm-kernel mode's parser; ``step``: the step mode's (``bench_modes.step_parser``)."""
    if step:
        return step_parser()
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
    add_common(p, "bench.json")
    return p


def main(argv: list[str] | None = None) -> int:
    """``normlab-bench [norm options]``, ``normlab-bench step ...``, ``normlab-bench settings ...``
    or ``normlab-bench peak ...``; returns the exit status. The thread count (``--threads``, else
    the ``threads`` key of the overrides, else ``train``'s rule) is set for the command and put
    back at its end."""
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = torch.get_num_threads()
    try:
        if argv[:1] in (["step"], ["settings"], ["peak"]):
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
        result = bench_norms(
            args.kinds,
            impls,
            args.dtypes,
            list(dict.fromkeys(shapes)),
            repeats=args.repeats,
            warmup=args.warmup,
            device=args.device,
            param_dtype=args.param_dtype,
            cache=args.cache,
            settle_calls=args.settle,
            flush_mb=args.flush_mb,
        )
    except (ConfigError, DataError, FileNotFoundError) as e:  # user errors: one line
        print(f"normlab-bench: {e}", file=sys.stderr)
        return 2
    except BenchError as e:  # nothing measured is a failure, not an empty success
        print(f"normlab-bench: {e}", file=sys.stderr)
        return 1
    result["malloc"] = malloc
    return write_result(result, format_norm_table(result), args.json)


if __name__ == "__main__":
    import sys as _sys

    _sys.exit(main())
