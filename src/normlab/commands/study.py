"""The ``normlab-study`` command: the studies that are not one training sweep.

``fp16-statistics``: mean(x^2) in fp16 vs fp32 and the norms' error by input scale.
``norm-cost``: where a training step spends its time, by module type. ``until-decided``: seed
pairs of two variants until the anytime-valid verdict decides. ``variance``: the paired variance
of the final loss per protocol and reading. Each writes under ``outputs/studies/<study>/<time>/``
(or ``--out``); exit 2 after one line on stderr for a bad config or option.
Why: docs/experiments.md
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from normlab.commands.overrides import check_overrides
from normlab.compose import find_conf_dir
from normlab.config import ConfigError
from normlab.data.tokens import DataError
from normlab.report.sequential import verdict_line
from normlab.studies import fp16_statistics, norm_cost, until_decided, variance
from normlab.studies.common import output_dir, study_inputs, with_default_experiment

USAGE = """\
normlab-study fp16-statistics [OVERRIDE ...] [--scales S,..] [--model-rms R,..] [options]
       normlab-study norm-cost [OVERRIDE ...] [--kinds K,..] [--impls I,..] [options]
       normlab-study until-decided [OVERRIDE ...] --margin M [--budget-hours H] [options]
       normlab-study variance --cell NAME=A_DIR,B_DIR [...] | --from variance.json [options]"""


def fp16_parser() -> argparse.ArgumentParser:
    """The parser of ``normlab-study fp16-statistics``."""
    p = argparse.ArgumentParser(
        prog="normlab-study fp16-statistics",
        description="mean(x^2) in fp16 vs fp32: the norms' error by input scale, and a model's "
        "overflowing norms.",
    )
    p.add_argument(
        "overrides", nargs="*", help="Hydra overrides (default experiment=fp16_statistics)"
    )
    p.add_argument(
        "--out", default=None, help="output dir (default outputs/studies/fp16_statistics/<time>)"
    )
    p.add_argument(
        "--scales", default=None, help="input RMS values of the norm sweep, comma separated"
    )
    p.add_argument(
        "--model-rms", default=None, help="residual RMS values of the model check, comma separated"
    )
    p.add_argument("--rows", type=int, default=256, help="rows per input of the norm sweep")
    p.add_argument("--impls", default=None, help="implementations (default: all the device runs)")
    return p


def _floats(text: str | None) -> list[float]:
    """``"1,2.5"`` -> ``[1.0, 2.5]``; None or empty -> ``[]``."""
    return [float(v) for v in text.split(",")] if text else []


def fp16_main(argv: list[str]) -> int:
    """``normlab-study fp16-statistics``; 0 on success, 2 on a bad config (one line on stderr)."""
    args = fp16_parser().parse_args(argv)
    overrides = with_default_experiment(args.overrides, "fp16_statistics")
    try:
        inputs = study_inputs(overrides)
        impls = args.impls.split(",") if args.impls else None
        cases = fp16_statistics.norm_cases(inputs.device.type, impls)
    except ConfigError as e:
        print(f"fp16_study: {e}", file=sys.stderr)
        return 2
    scales = _floats(args.scales) or fp16_statistics.DEFAULT_SCALES
    targets = _floats(args.model_rms) or fp16_statistics.DEFAULT_MODEL_RMS
    out = output_dir("fp16_statistics", args.out)
    d = inputs.cfg.model.d_model
    sweep = fp16_statistics.norm_error_sweep(
        cases, list(fp16_statistics.DTYPES), scales, args.rows, d, inputs.device
    )
    checks = fp16_statistics.model_study(inputs, targets)
    fig = fp16_statistics.plot_sweep(sweep, out / "fp16_statistics.png", d)
    path = fp16_statistics.write_report(out, inputs, sweep, checks, fig, args.rows)
    print("\n".join(fp16_statistics.verdict(sweep, checks)))
    print(f"wrote {path} and {fig}")
    return 0


def norm_cost_parser() -> argparse.ArgumentParser:
    """The parser of ``normlab-study norm-cost``."""
    p = argparse.ArgumentParser(
        prog="normlab-study norm-cost",
        description="Where a training step spends its time, by module type.",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides for every setup (default experiment=norm_cost)",
    )
    p.add_argument("--kinds", default="layer,rms,dyt", help="norm kinds (default: layer,rms,dyt)")
    p.add_argument(
        "--impls",
        default=None,
        help="default: every implementation the device runs (torch,reference,compiled, +triton on "
        "CUDA, +cpp on CPU)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=20,
        help="measured rounds (one plain + one hooked step per setup)",
    )
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed plain + hooked steps per setup first"
    )
    p.add_argument(
        "--out", default=None, help="output dir (default outputs/studies/norm_cost/<time>)"
    )
    return p


def norm_cost_main(argv: list[str]) -> int:
    """``normlab-study norm-cost``; 0 on success, 2 on a bad config (one line on stderr)."""
    args = norm_cost_parser().parse_args(argv)
    common = with_default_experiment(args.overrides, "norm_cost")
    try:
        from normlab.compose import compose
        from normlab.training.distributed import resolve_device
        from normlab.training.setup import versions

        device = resolve_device(compose(common).device)
        impls = args.impls and args.impls.split(",")
        setups = norm_cost.variants(device.type, args.kinds.split(","), impls)
        rows = norm_cost.measure(common, setups, args.steps, args.warmup)
    except (ConfigError, DataError) as e:
        print(f"norm_cost: {e}", file=sys.stderr)
        return 2
    out = output_dir("norm_cost", args.out)
    r0 = rows[0]
    title = (
        f"Step time by module type: {r0['model']}, {r0['precision']}, {r0['tokens_per_step']} "
        f"tokens/step, {r0['device']}"
    )
    fig = norm_cost.plot(rows, out / "norm_cost.png", title)
    text = "\n".join(
        [
            f"# Where the step time goes ({' '.join(common)})",
            "",
            title + f"; mean of {args.steps} hooked "
            "steps per variant, interleaved with plain steps. Categories sum to the hooked step; "
            "`other` = "
            "embeddings, residual additions, head and loss; `optimizer` = unscale, clip, AdamW, "
            "zero_grad.",
            "",
            norm_cost.table(rows),
            "",
            f"![step time by module type]({fig.name})",
            "",
            f"versions: `{json.dumps(versions(device, False))}`",
        ]
    )
    (out / "norm_cost.md").write_text(text + "\n")
    (out / "norm_cost.json").write_text(json.dumps(rows, indent=1))
    print(norm_cost.table(rows))
    print(f"wrote {out / 'norm_cost.md'} and {fig}")
    return 0


def until_decided_parser() -> argparse.ArgumentParser:
    """The parser of ``normlab-study until-decided``."""
    p = argparse.ArgumentParser(
        prog="normlab-study until-decided",
        description="Train seed pairs of two variants (seed 0, 1, ...) until the anytime-valid "
        "verdict decides at the margin (equivalent or different), or the budget ends. Rerun the "
        "same command with the --out it printed to resume a killed driver.",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides for both variants (default "
        "experiment=loss_parity_cpu); not seed: the driver sets it",
    )
    p.add_argument("--margin", type=float, required=True, help="equivalence margin, nats/token")
    p.add_argument(
        "--budget-hours",
        type=float,
        default=None,
        help="wall-clock hours, summed over calls on one --out; no new pair starts that would "
        "end past it (default: no limit; --max-pairs still ends it)",
    )
    p.add_argument("--a", default="norm=layer", help="variant A's overrides (default norm=layer)")
    p.add_argument("--b", default="norm=rms", help="variant B's overrides (default norm=rms)")
    p.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="runs at once, one thread each: 1 or 2 (default 2: A and B of a seed together)",
    )
    p.add_argument("--max-pairs", type=int, default=60, help="the most seed pairs (default 60)")
    p.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="level of the sequence (default 0.05: a 95%% confidence sequence)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="the sweep dir (default outputs/studies/until_decided/<time>); the same --out resumes",
    )
    return p


def _driver(args: argparse.Namespace) -> until_decided.Driver:
    """The driver the arguments ask for; ConfigError names a bad value."""
    common = with_default_experiment(args.overrides, "loss_parity_cpu")
    variants = [shlex.split(args.a), shlex.split(args.b)]
    checks = [
        ("--margin", args.margin, math.isfinite(args.margin) and args.margin > 0, "> 0"),
        ("--alpha", args.alpha, 0 < args.alpha < 1, "in (0, 1)"),
        ("--max-pairs", args.max_pairs, args.max_pairs >= 2, ">= 2"),
        ("--jobs", args.jobs, args.jobs in (1, 2), "1 or 2 (runs at once, one thread each)"),
    ]
    if args.budget_hours is not None:
        ok = math.isfinite(args.budget_hours) and args.budget_hours > 0
        checks.append(("--budget-hours", args.budget_hours, ok, "> 0"))
    for flag, value, ok, allowed in checks:
        if not ok:
            raise ConfigError(f"{flag}={value}: must be {allowed}")
    if variants[0] == variants[1]:
        raise ConfigError(f"--a and --b are the same ({args.a!r}): give two variants")
    for o in common + sum(variants, []):
        if o.split("=", 1)[0].lstrip("+~") == "seed":
            raise ConfigError(f"{o}: the driver sets each pair's seed (0, 1, ...); leave it out")
    for v in variants:  # every override checked as train checks it, before anything trains
        check_overrides([*common, *v], find_conf_dir())
    budget = math.inf if args.budget_hours is None else 3600 * args.budget_hours
    return until_decided.Driver(
        out=output_dir("until_decided", args.out),
        common=common,
        variants=variants,
        margin=args.margin,
        alpha=args.alpha,
        budget_s=budget,
        max_pairs=args.max_pairs,
        jobs=args.jobs,
    )


def until_decided_main(argv: list[str]) -> int:
    """``normlab-study until-decided``; 0 decided or stopped by budget/max-pairs, 1 a pair that
    failed or a busy/foreign --out, 2 a bad option or override (one line on stderr)."""
    args = until_decided_parser().parse_args(argv)
    try:
        driver = _driver(args)
    except (ConfigError, DataError) as e:
        print(f"until-decided: error: {e}", file=sys.stderr)
        return 2
    print(f"until-decided: {driver.out} (rerun this command with --out {driver.out} to resume)")
    try:
        state = until_decided.drive(driver)
    except (until_decided.DriverError, ConfigError) as e:
        print(f"until-decided: error: {e}", file=sys.stderr)
        return 1
    v = state.get("verdict")
    line = verdict_line(v, driver.margin) if v else "no pair completed"
    print(f"until-decided: stopped by {state['stopped_by']}: {line}")
    print(
        f"until-decided: the report: normlab-report {driver.out} --margin {driver.margin:g} "
        "--sequential"
    )
    return 0


def variance_parser() -> argparse.ArgumentParser:
    """The parser of ``normlab-study variance``."""
    p = argparse.ArgumentParser(
        prog="normlab-study variance",
        description="The paired std of the final validation loss per protocol (cell), per "
        "reading (raw or averaged checkpoints, evaluation batches, annealed budgets), and the "
        "seeds and CPU-hours a fixed-n TOST at the margin needs for 80% power.",
    )
    p.add_argument(
        "--cell",
        action="append",
        default=[],
        metavar="NAME=A_DIR,B_DIR",
        help="a cell: two sweep dirs of the same seeds, variant A then B (repeatable)",
    )
    p.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="JSON",
        help="rebuild the table from a variance.json this study wrote",
    )
    p.add_argument("--margin", type=float, default=0.002, help="nats/token (default 0.002)")
    p.add_argument(
        "--batches",
        type=int,
        default=max(variance.BATCHES),
        help=f"validation batches scored per run (default {max(variance.BATCHES)})",
    )
    p.add_argument(
        "--average",
        type=int,
        default=variance.AVERAGE,
        help=f"newest checkpoints averaged (default {variance.AVERAGE})",
    )
    p.add_argument(
        "--out", default=None, help="output dir (default outputs/studies/variance/<time>)"
    )
    return p


def _cells(args: argparse.Namespace) -> dict[str, dict[str, list]]:
    """The scored cells: from ``--from``, else scored from ``--cell`` dirs; ConfigError names a
    bad value."""
    if args.source:
        return json.loads(Path(args.source).read_text())["cells"]
    if not args.cell:
        raise ConfigError("give --cell NAME=A_DIR,B_DIR (one or more) or --from variance.json")
    cells = {}
    for spec in args.cell:
        name, _, dirs = spec.partition("=")
        parts = [Path(d) for d in dirs.split(",")]
        if not name or len(parts) != 2 or not all(d.is_dir() for d in parts):
            raise ConfigError(f"--cell {spec!r}: must be NAME=A_DIR,B_DIR with two sweep dirs")
        cells[name] = variance.score_cell(parts[0], parts[1], args.batches, args.average)
    return cells


def variance_main(argv: list[str]) -> int:
    """``normlab-study variance``; 0 written, 2 a bad option (one line on stderr)."""
    args = variance_parser().parse_args(argv)
    if not (math.isfinite(args.margin) and args.margin > 0) or args.batches < 2 or args.average < 1:
        print("variance: --margin must be > 0, --batches >= 2, --average >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # tiny forwards: more threads on busy cores only wait on each other
    try:
        cells = _cells(args)
    except (ConfigError, DataError, OSError, ValueError, KeyError) as e:
        print(f"variance: {e}", file=sys.stderr)
        return 2
    out = output_dir("variance", args.out)
    (out / "variance.json").write_text(json.dumps({"margin": args.margin, "cells": cells}))
    text = variance.table(cells, args.margin)
    (out / "variance.md").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'variance.md'} and {out / 'variance.json'}")
    return 0


#: ``normlab-study <study>``: each study's entry point (``_`` spellings accepted too).
STUDIES: dict[str, Callable[[list[str]], int]] = {
    "fp16-statistics": fp16_main,
    "norm-cost": norm_cost_main,
    "until-decided": until_decided_main,
    "variance": variance_main,
}


def main(argv: list[str] | None = None) -> int:
    """``normlab-study <study> ...``; returns the exit status (2 for an unknown study)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0].replace("_", "-") if argv else ""
    if name in STUDIES:
        return STUDIES[name](argv[1:])
    if name in ("-h", "--help"):
        print(f"usage: {USAGE}\n\n{__doc__.strip()}")
        return 0
    shown = f"'{argv[0]}' is no study" if argv else "no study given"
    print(
        f"normlab-study: error: {shown}; allowed: {', '.join(STUDIES)} "
        "(normlab-study --help shows how to call each)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
