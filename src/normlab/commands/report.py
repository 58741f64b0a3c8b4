"""The ``normlab-report`` command: a sweep dir (or run dirs) -> report.md and figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from normlab.report.core import (
    ReportError,
    _f,
    build_report,
    write_report,
)


def main(argv: list[str] | None = None) -> int:
    """CLI; returns the exit status: 0 report written, 1 refusal (one line on stderr), 2 bad arguments."""
    p = argparse.ArgumentParser(
        prog="normlab-report", description="Compare the variants of a normlab sweep."
    )
    p.add_argument("sweep_dir", type=Path, help="Hydra multirun dir (one subdirectory per job)")
    p.add_argument(
        "--margin", type=float, default=0.02, help="equivalence margin in nats/token (default 0.02)"
    )
    p.add_argument("--out", type=Path, default=None, help="output dir (default SWEEP_DIR/report)")
    p.add_argument(
        "--baseline", default=None, help="baseline variant label (default: the LayerNorm variant)"
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="significance level (default 0.05: 95%% CI, 90%% TOST CI)",
    )
    args = p.parse_args(argv)
    if not args.margin > 0 or not 0 < args.alpha < 0.5:
        p.error("need --margin > 0 and 0 < --alpha < 0.5")
    try:
        rep = build_report(args.sweep_dir, args.margin, args.alpha, args.baseline)
        path = write_report(rep, args.out or args.sweep_dir / "report")
    except (ReportError, OSError, yaml.YAMLError) as e:
        print(f"normlab-report: error: {e}", file=sys.stderr)
        return 1
    print(f"normlab-report: wrote {path}")
    for c in rep.comparisons:
        print(
            f"  {c['label']} vs {rep.baseline}: n={c['n']}, mean diff {_f(c['mean'], '+.4f')} nats, {c['verdict']}"
        )
    if not any(v["n"] for v in rep.variants):
        print(
            "normlab-report: error: no completed runs to compare (see Excluded runs in the report)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    import sys as _sys

    _sys.exit(main())
