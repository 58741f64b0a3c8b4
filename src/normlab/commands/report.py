"""The ``normlab-report`` command: a sweep dir, or any run dirs -> report.md and figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from normlab.report import ReportError, build_report, write_report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="normlab-report",
        description="Compare the variants of a normlab sweep, or of any run dirs, paired by seed.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="a Hydra multirun dir (one subdirectory per job), or run dirs from anywhere",
    )
    p.add_argument(
        "--margin", type=float, default=0.02, help="equivalence margin in nats/token (default 0.02)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output dir (default: DIR/report for one DIR, ./report for several)",
    )
    p.add_argument(
        "--baseline", default=None, help="baseline variant label (default: the LayerNorm variant)"
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="significance level (default 0.05: 95%% CI, 90%% TOST CI)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI; returns the exit status: 0 report written, 1 refusal (one line on stderr), 2 bad
    arguments."""
    p = _parser()
    args = p.parse_args(argv)
    if not args.margin > 0 or not 0 < args.alpha < 0.5:
        p.error("need --margin > 0 and 0 < --alpha < 0.5")
    out = args.out or (args.paths[0] / "report" if len(args.paths) == 1 else Path("report"))
    try:
        rep = build_report(args.paths, args.margin, args.alpha, args.baseline)
        path = write_report(rep, out)
    except (ReportError, OSError) as e:
        print(f"normlab-report: error: {e}", file=sys.stderr)
        return 1
    print(f"normlab-report: wrote {path}")
    for w in rep.confounds:
        print(f"  warning: {w}")
    for c in rep.comparisons:
        print(f"  {c['label']} vs {rep.baseline}: n={c['n']}, {c['verdict']}")
        if not c["ratio"]["comparable"]:
            print("  warning: step times not comparable (see the report's step-time section)")
    if not any(v["n"] for v in rep.variants):
        print(
            "normlab-report: error: no completed runs to compare (see Excluded runs in the report)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
