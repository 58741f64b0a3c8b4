"""The norm_cost study command (``scripts/norm_cost.sh``): where a training step spends its time."""

from __future__ import annotations

import argparse
import json
import sys

from normlab.config import ConfigError
from normlab.data.tokens import DataError
from normlab.studies.common import output_dir, with_default_experiment
from normlab.studies.norm_cost import (
    measure,
    plot,
    table,
    variants,
)


def main(argv: list[str] | None = None) -> int:
    """CLI; 0 on success, 2 on a bad config (one line on stderr)."""
    p = argparse.ArgumentParser(
        prog="python -m normlab.commands.norm_cost", description=__doc__.split("\n\n")[0]
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
    args = p.parse_args(argv)
    common = with_default_experiment(args.overrides, "norm_cost")
    try:
        from normlab.compose import compose
        from normlab.training.distributed import resolve_device
        from normlab.training.setup import versions

        device = resolve_device(compose(common).device)
        rows = measure(
            common,
            variants(device.type, args.kinds.split(","), args.impls and args.impls.split(",")),
            args.steps,
            args.warmup,
        )
    except (ConfigError, DataError) as e:
        print(f"norm_cost: {e}", file=sys.stderr)
        return 2
    out = output_dir("norm_cost", args.out)
    r0 = rows[0]
    title = (
        f"Step time by module type: {r0['model']}, {r0['precision']}, {r0['tokens_per_step']} "
        f"tokens/step, {r0['device']}"
    )
    fig = plot(rows, out / "norm_cost.png", title)
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
            table(rows),
            "",
            f"![step time by module type]({fig.name})",
            "",
            f"versions: `{json.dumps(versions(device, False))}`",
        ]
    )
    (out / "norm_cost.md").write_text(text + "\n")
    (out / "norm_cost.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    print(f"wrote {out / 'norm_cost.md'} and {fig}")
    return 0


if __name__ == "__main__":
    import sys as _sys

    _sys.exit(main())
