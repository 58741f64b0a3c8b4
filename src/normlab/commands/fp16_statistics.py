"""The fp16_statistics study command (``scripts/fp16_statistics.sh``): mean(x^2) in fp16 vs fp32."""

from __future__ import annotations

import argparse
import sys

from normlab.config import ConfigError
from normlab.studies.common import output_dir, study_inputs, with_default_experiment
from normlab.studies.fp16_report import plot_sweep, verdict, write_report
from normlab.studies.fp16_statistics import (
    DEFAULT_MODEL_RMS,
    DEFAULT_SCALES,
    DTYPES,
    model_study,
    norm_cases,
    norm_error_sweep,
)


def main(argv: list[str] | None = None) -> int:
    """CLI; 0 on success, 2 on a bad config (one line on stderr)."""
    p = argparse.ArgumentParser(
        prog="python -m normlab.commands.fp16_statistics", description=__doc__.split("\n\n")[0]
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
    args = p.parse_args(argv)
    overrides = with_default_experiment(args.overrides, "fp16_statistics")
    try:
        inputs = study_inputs(overrides)
        cases = norm_cases(inputs.device.type, args.impls.split(",") if args.impls else None)
    except ConfigError as e:
        print(f"fp16_study: {e}", file=sys.stderr)
        return 2
    scales = [float(v) for v in args.scales.split(",")] if args.scales else DEFAULT_SCALES
    targets = [float(v) for v in args.model_rms.split(",")] if args.model_rms else DEFAULT_MODEL_RMS
    out = output_dir("fp16_statistics", args.out)
    sweep = norm_error_sweep(
        cases, list(DTYPES), scales, args.rows, inputs.cfg.model.d_model, inputs.device
    )
    checks = model_study(inputs, targets)
    fig = plot_sweep(sweep, out / "fp16_statistics.png", inputs.cfg.model.d_model)
    path = write_report(out, inputs, sweep, checks, fig, args.rows)
    print("\n".join(verdict(sweep, checks)))
    print(f"wrote {path} and {fig}")
    return 0


if __name__ == "__main__":
    import sys as _sys

    _sys.exit(main())
