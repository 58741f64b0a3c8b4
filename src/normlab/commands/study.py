"""The ``normlab-study`` command: the two studies that are not training sweeps.

``normlab-study fp16-statistics [overrides] [options]`` (``scripts/fp16_statistics.sh``): mean(x^2)
in fp16 vs fp32, the norms' error against the float64 oracle by input scale, and whether a model's
norms overflow. ``normlab-study norm-cost [overrides] [options]`` (``scripts/norm_cost.sh``): where
a training step spends its time, by module type. Each composes its setup from ``conf/train.yaml``
(default ``experiment=<study>``) and writes a report under ``outputs/studies/<study>/<time>/``. Exit
status 0, or 2 after one line on stderr for a bad config or option.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from normlab.config import ConfigError
from normlab.data.tokens import DataError
from normlab.studies import fp16_statistics, norm_cost
from normlab.studies.common import output_dir, study_inputs, with_default_experiment

USAGE = """\
normlab-study fp16-statistics [OVERRIDE ...] [--scales S,..] [--model-rms R,..] [options]
       normlab-study norm-cost [OVERRIDE ...] [--kinds K,..] [--impls I,..] [options]"""


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


#: ``normlab-study <study>``: each study's entry point (``_`` spellings accepted too).
STUDIES: dict[str, Callable[[list[str]], int]] = {
    "fp16-statistics": fp16_main,
    "norm-cost": norm_cost_main,
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
