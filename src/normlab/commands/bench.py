"""The ``normlab-bench`` command: norm kernels (default), whole training steps (``normlab-bench
step``) and the device's measured matmul peak (``normlab-bench peak``)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from normlab.config import ConfigError, NormImpl, NormKind
from normlab.data.tokens import DataError
from normlab.norms import available_impls
from normlab.norms.table import KINDS
from normlab.studies.bench_norms import (
    CACHE_REGIMES,
    DTYPES,
    bench_norms,
    csv,
    model_width,
    parse_shape,
)
from normlab.studies.bench_step import bench_step, format_step
from normlab.studies.bench_tables import format_norm_table
from normlab.studies.timing import keep_freed_memory
from normlab.training.distributed import resolve_device
from normlab.training.peak import device_peak_tflops

NORM_USAGE = """\
normlab-bench [-h] [--kinds K,..] [--impls I,..] [--dtypes D,..] [--shapes RxH,..] [options]
       normlab-bench step [-h] [OVERRIDE ...] [--a OVERRIDES] [--b OVERRIDES] [options]
       normlab-bench peak [-h] [--device D] [--refresh] [--json PATH]"""

NORM_DESCRIPTION = """\
Two modes: "normlab-bench [options]" times norm kernels (this help);
"normlab-bench step ..." times whole training steps (see: normlab-bench step --help).

Norm mode: times every norm kind x implementation x dtype x shape, forward and
forward+backward, in interleaved rounds together with a same-size copy (the
practical memory-bandwidth ceiling). Prints the median ms per call, GB/s and the
fraction of the copy's GB/s, then RMSNorm's fastest against LayerNorm's fastest."""

STEP_DESCRIPTION = """\
Second mode of normlab-bench: builds training setups A and B from the Hydra configs
in one process and times whole optimizer steps (forward, backward, clip, AdamW) in
interleaved pairs (A B, then B A) after warm-up steps. Prints the median step time of
each and the median B/A ratio with its spread. The norm-kernel mode: normlab-bench --help."""


def _parser(step: bool) -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    if step:
        p = argparse.ArgumentParser(
            prog="normlab-bench step", description=STEP_DESCRIPTION, formatter_class=raw
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
        p.add_argument(
            "--b", action="append", default=[], help="overrides of setup B (--b norm=fused)"
        )
        p.add_argument(
            "--pairs",
            type=int,
            default=10,
            help="timed step pairs, A B then B A alternating (default: 10)",
        )
        p.add_argument(
            "--warmup",
            type=int,
            default=3,
            help="untimed optimizer steps per setup before timing: compilation, allocator "
            "(default: 3)",
        )
    else:
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
            help="--cache cold: size in MiB of the buffer written before each sample "
            "(default: 512)",
        )
    p.add_argument(
        "--threads", type=int, help="CPU threads, torch.set_num_threads (default: torch's)"
    )
    json_default = "bench_step.json" if step else "bench.json"
    p.add_argument(
        "--json",
        default=json_default,
        help=f"where to write all results (default: ./{json_default})",
    )
    return p


def peak_main(argv: list[str]) -> int:
    """``normlab-bench peak``: the device's dense matmul peak in fp32 and bf16 (TFLOP/s, the best
    timed ``n x n`` matmul, ``2 n^3`` FLOP; ``training.peak``), from the per-machine cache unless
    ``--refresh``; printed and written to ``--json``."""
    p = argparse.ArgumentParser(
        prog="normlab-bench peak",
        description="Third mode of normlab-bench: the measured dense matmul peak (fp32, bf16) that "
        "MFU is reported against, cached per machine, thread count and torch version.",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    p.add_argument("--threads", type=int, help="CPU threads, torch.set_num_threads")
    p.add_argument("--json", default="bench_peak.json", help="default: ./bench_peak.json")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = resolve_device(args.device)
    except ConfigError as e:
        print(f"normlab-bench peak: {e}", file=sys.stderr)
        return 2
    result = {"mode": "peak", "device": str(device), "torch": torch.__version__}
    for dtype in ("fp32", "bf16"):
        result[dtype] = entry = device_peak_tflops(device, dtype, refresh=args.refresh)
        origin = f"cached {entry['measured_at']}" if entry["cached"] else "measured now"
        print(
            f"{dtype}: {entry['tflops']:.3f} TFLOP/s dense matmul peak ({origin}; {entry['key']})"
        )
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``normlab-bench [norm options]``, ``normlab-bench step ...`` or ``normlab-bench peak ...``;
    returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["peak"]:
        return peak_main(argv[1:])
    step = argv[:1] == ["step"]
    p = _parser(step)
    args = p.parse_intermixed_args(argv[1:]) if step else p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = keep_freed_memory()
    if not step:
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
        if step:
            a, b = ([t for s in given for t in shlex.split(s)] for given in (args.a, args.b))
            result, text = (
                bench_step(a, b, args.overrides, pairs=args.pairs, warmup=args.warmup),
                format_step,
            )
        else:
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
            text = format_norm_table
    except (ConfigError, DataError, FileNotFoundError) as e:  # user errors: one line
        print(f"normlab-bench: {e}", file=sys.stderr)
        return 2
    result["malloc"] = malloc
    print(text(result))
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    import sys as _sys

    _sys.exit(main())
