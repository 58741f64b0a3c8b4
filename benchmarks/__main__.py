"""``python -m benchmarks baseline|profile|settings ...`` from the root of a checkout: the harness's
own checks (see ``benchmarks/__init__.py``). Options, threads and the JSON file as
``normlab-bench step``; exit status 0, or 2 after one line on stderr for a bad option or config."""

from __future__ import annotations

import argparse
import sys

from benchmarks.plain_loop import build_plain
from benchmarks.profile_step import format_profile, profile_steps
from benchmarks.settings import DEFAULT_SETTINGS, bench_settings, format_settings
from normlab.bench.step import build_setup, format_step, pair_result, time_pairs
from normlab.commands.bench import add_common, run_mode

DESCRIPTION = """\
baseline: normlab's own step (B) against a plain-PyTorch loop (A) of the same model, batches and
  settings, in interleaved pairs: B/A = normlab/plain, the harness's overhead.
profile THREADS: torch.profiler of both at each thread count (1,2), and where normlab spends more.
settings: one training setup per --setting (default: fp32 and bf16 autocast, compile off and on),
  optimizer steps round-robin: ms/step (IQR), tokens/s, MFU against the measured matmul peak of
  each setting's precision, and the speed-up over the first setting."""


def check_parser(check: str) -> argparse.ArgumentParser:
    """The parser of ``python -m benchmarks <check>`` (baseline, profile or settings)."""
    p = argparse.ArgumentParser(
        prog=f"python -m benchmarks {check}",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if check == "profile":
        p.add_argument("counts", metavar="THREADS", help="thread counts, comma separated (1,2)")
    if check in ("baseline", "profile"):
        p.add_argument("overrides", nargs="*", help="Hydra overrides (model=small)")
        p.add_argument(
            "--pairs", type=int, default=10, help="timed pairs, or steps per profile (default: 10)"
        )
        p.add_argument("--warmup", type=int, default=3, help="untimed steps each (default: 3)")
        add_common(p, "bench_step.json" if check == "baseline" else "bench_profile.json")
        return p
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
    p.add_argument("--warmup", type=int, default=2, help="untimed steps each (default: 2)")
    add_common(p, "bench_settings.json")
    return p


def _threads(p: argparse.ArgumentParser, given: str) -> list[int]:
    try:
        threads = [int(t) for t in given.split(",")]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        p.error(f"profile {given}: expected thread counts >= 1, comma separated (1,2)")
    return threads


def baseline(overrides: list[str], pairs: int, warmup: int) -> tuple[dict, str]:
    """The plain loop (A) and normlab's step (B) for ``overrides``, timed in interleaved pairs."""
    normlab = build_setup(list(overrides))
    setups = [build_plain(list(overrides), normlab.run.device), normlab]
    times = time_pairs(setups, pairs, warmup)
    own = ([], [])
    result = pair_result(setups, own, overrides, times, pairs=pairs, warmup=warmup, baseline=True)
    return result, format_step(result)


#: The checks, in the order ``--help`` lists them.
CHECKS = ("baseline", "profile", "settings")


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks <check> ...``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    check = argv[0] if argv else ""
    if check not in CHECKS:
        if check in ("-h", "--help"):
            print(f"usage: python -m benchmarks {{{','.join(CHECKS)}}} ...\n\n{DESCRIPTION}")
            return 0
        print(
            f"python -m benchmarks: error: {check or 'no check'} given; one of: "
            f"{', '.join(CHECKS)} (python -m benchmarks --help)",
            file=sys.stderr,
        )
        return 2
    p = check_parser(check)
    args = p.parse_intermixed_args(argv[1:])
    if check == "settings":
        if args.rounds < 1 or args.warmup < 0:
            p.error(f"--rounds {args.rounds} --warmup {args.warmup}: expected >= 1 and >= 0")
        settings = args.setting or list(DEFAULT_SETTINGS)

        def run() -> tuple[dict, str]:
            result = bench_settings(
                settings, args.overrides, rounds=args.rounds, warmup=args.warmup
            )
            return result, format_settings(result)

    elif check == "profile":
        threads = _threads(p, args.counts)

        def run() -> tuple[dict, str]:
            result = profile_steps(args.overrides, threads, steps=args.pairs)
            return result, format_profile(result)

    else:

        def run() -> tuple[dict, str]:
            return baseline(args.overrides, args.pairs, args.warmup)

    return run_mode(args, run, args.overrides, prog="python -m benchmarks")


if __name__ == "__main__":
    sys.exit(main())
