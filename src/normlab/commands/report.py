"""The ``normlab-report`` command: a sweep dir, or any run dirs -> report.md, figures and the runs'
series file (``normlab.report.runs.write_series``); a sweep over model sizes
(``normlab.report.is_ladder``) -> the ladder report, with each size's report below it; a series file
-> the same report again, from that file alone, with the options it stored.

Why: docs/reports.md
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from normlab.report import (
    ReportError,
    build_ladder,
    build_report,
    is_ladder,
    load_runs,
    log_report_to_wandb,
    wandb_settings,
    write_ladder,
    write_report,
)
from normlab.report.compare import DEFAULT_MARGIN, margin_in_compute
from normlab.report.family import best_text
from normlab.report.ladder import comparison_at, ladder_untuned_note, one_margin
from normlab.report.markdown import compute_headline, worth_text
from normlab.report.plan import plan_study, render_plan
from normlab.report.runs import (
    SERIES_FILE,
    Run,
    read_series,
    series_member,
    series_step_bench,
    write_series,
)
from normlab.report.sequential import verdict_line
from normlab.report.speed import load_step_bench
from normlab.report.text import fmt_ci
from normlab.report.tuned import untuned_note
from normlab.report.unfinished import unfinished_notes
from normlab.report.wandb_log import MODES

#: The options a series file stores for its report's rebuild: argparse dest -> flag.
STORED_OPTIONS = {
    "margin": "--margin",
    "margin_compute": "--margin-compute",
    "alpha": "--alpha",
    "baseline": "--baseline",
    "target": "--target",
    "sequential": "--sequential",
}
#: The significance level when neither the command line nor a series file gives one.
DEFAULT_ALPHA = 0.05


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="normlab-report",
        description="Compare the variants of a normlab sweep, or of any run dirs, paired by seed. "
        "Runs of several model sizes with the same variants at each (a ladder: "
        "experiment=ladder_cpu) get the ladder report: a report per size, the loss-compute law "
        "per variant, and the trend of the compute multiplier with size.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="a Hydra multirun dir (one subdirectory per job), run dirs from anywhere, or a "
        f"series file ({SERIES_FILE}) a report wrote: its report is rebuilt from that file "
        "alone, with the options it stored unless given here",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        help=f"equivalence margin in nats/token (default {DEFAULT_MARGIN:g}: a gross-difference "
        "screen that catches a broken norm, not a parity claim; set the effect that matters)",
    )
    p.add_argument(
        "--margin-compute",
        type=float,
        default=None,
        metavar="FRACTION",
        help="equivalence margin in effective compute instead (0.01: within 1%%), converted to "
        "nats with the baseline's slope: between its annealed budgets when its runs have them "
        "(optim.anneal_at), else the end slope of its mean validation curve; the report says "
        "both",
    )
    p.add_argument(
        "--plan",
        type=float,
        default=None,
        metavar="MARGIN",
        help="plan a study from this pilot sweep: print, per variant, the seeds a TOST at MARGIN "
        "nats/token needs for 80%% power (at the paired std and at its upper confidence bound) "
        "and the hours it takes on this machine; writes no report",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output dir (default: DIR/report for one DIR, the series file's folder/report for "
        "one series file, ./report for several)",
    )
    p.add_argument(
        "--series",
        type=Path,
        default=None,
        metavar="PATH",
        help="where to write the runs' series file, what the report reads of every run, from "
        f"which `normlab-report PATH` rebuilds it (default: OUT/{SERIES_FILE})",
    )
    p.add_argument("--no-series", action="store_true", help="write no series file")
    p.add_argument(
        "--sequential",
        action="store_true",
        help="also give the anytime-valid verdict: a confidence sequence over the seed pairs in "
        "seed order (Lai 1976), valid however often the study was looked at and stopped; the "
        "fixed-n TOST is valid only for a seed count fixed in advance",
    )
    p.add_argument(
        "--baseline", default=None, help="baseline variant label (default: the LayerNorm variant)"
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help=f"significance level (default {DEFAULT_ALPHA}: 95%% CI, 90%% TOST CI)",
    )
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="target validation loss (nats/token) for the time-to-target section (default: the "
        "highest final validation loss of any included run)",
    )
    p.add_argument(
        "--wandb",
        action="store_true",
        help="also log the report's tables and figures to a wandb run in the sweep's group",
    )
    p.add_argument(
        "--wandb-mode",
        choices=MODES,
        default=None,
        help="wandb mode of that run (default: the runs' logger.mode, else offline)",
    )
    p.add_argument(
        "--wandb-project", default=None, help="wandb project (default: the runs' logger.project)"
    )
    return p


def _to_wandb(rep, mode: str | None, project: str | None, out: Path) -> str:
    """Log ``rep`` to a new wandb run; returns where. Raises ReportError: no wandb or no run."""
    try:
        import wandb
    except ImportError:
        raise ReportError("--wandb needs the wandb package: pip install wandb") from None
    settings = wandb_settings(rep, mode, project)
    try:
        run = wandb.init(
            dir=str(out), config={"margin": rep.margin, "alpha": rep.alpha}, **settings
        )
    except Exception as e:  # wandb raises its own errors (no login for online, ...)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError(f"--wandb: cannot start a wandb run: {first}") from None
    log_report_to_wandb(rep, run)
    where = getattr(run, "dir", None) or out
    run.finish()
    return (
        f"logged to wandb ({settings['mode']}, project {settings['project']}, group "
        f"{settings['group']}): {where}"
    )


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad arguments (``p.error``: one line, exit 2) before anything is read."""
    given = [
        f
        for f, v in (
            ("--margin", args.margin),
            ("--margin-compute", args.margin_compute),
            ("--plan", args.plan),
        )
        if v is not None
    ]
    if len(given) > 1:
        p.error(f"{' and '.join(given)}: give one margin (nats, compute, or the plan's)")
    for flag, v in (
        ("--margin", args.margin),
        ("--margin-compute", args.margin_compute),
        ("--plan", args.plan),
    ):
        if v is not None and not (math.isfinite(v) and v > 0):
            p.error(f"{flag} {v}: need a finite number > 0")
    if args.alpha is not None and not 0 < args.alpha < 0.5:
        p.error(f"--alpha {args.alpha}: need 0 < --alpha < 0.5")
    if args.series is not None and args.no_series:
        p.error("--series and --no-series: give one")
    if args.plan is not None and (args.series is not None or args.no_series):
        p.error("--plan writes nothing: it takes neither --series nor --no-series")
    if args.target is not None and not math.isfinite(args.target):
        p.error(f"--target {args.target}: need a finite loss in nats/token")


def _stored_options(args: argparse.Namespace) -> list[str]:
    """Fill the ``STORED_OPTIONS`` not given from a lone series file's options; returns them as
    ``--flag value``. Raises ReportError: an unreadable file, a stored option of a wrong type."""
    member = series_member(args.paths[0]) if len(args.paths) == 1 else None
    if member is None or member[1] is not None:
        return []
    stored = read_series(member[0]).get("options") or {}
    margin_given = any(v is not None for v in (args.margin, args.margin_compute, args.plan))
    taken = []
    for dest, flag in STORED_OPTIONS.items():
        v = stored.get(dest)
        given = getattr(args, dest) not in (None, False)  # a flag not given is False
        if v is None or given or (margin_given and "margin" in dest):
            continue
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        kind = {"baseline": isinstance(v, str), "sequential": v is True}.get(dest, number)
        if not kind:
            raise ReportError(f"cannot read {member[0]}: its option {dest} is {v!r}")
        setattr(args, dest, v)
        taken.append(flag if v is True else f"{flag} {v}")
    return taken


def _default_out(paths: list[Path]) -> Path:
    """``DIR/report``, ``<folder>/report`` for one series file, else ``./report``. Raises
    ReportError: that folder is a link (it would send the report wherever it points)."""
    if len(paths) != 1:
        return Path("report")
    member = series_member(paths[0])
    out = (member[0].parent if member else paths[0]) / "report"
    if out.is_symlink():
        raise ReportError(
            f"{out} is a link to {out.readlink()}: a report is never written through a link; "
            "remove it, or give --out"
        )
    return out


def _write_series(path: Path, runs: list[Run], args: argparse.Namespace, baseline: str) -> Path:
    """Write the series file of ``runs`` with the first source's step bench and the report's
    options; returns ``path``. Raises ReportError: a bad bench; OSError: ``path`` unwritable."""
    bench = None
    for src in args.paths:
        found = load_step_bench([src]) if src.is_dir() else series_step_bench(src)
        if found is not None:
            bench = found[1]
            break
    margin = None
    if args.margin_compute is None:
        margin = DEFAULT_MARGIN if args.margin is None else args.margin
    options = {
        "margin": margin,
        "margin_compute": args.margin_compute,
        "alpha": args.alpha,
        "baseline": baseline,
        "target": args.target,
        "sequential": args.sequential or None,
    }
    return write_series(path, runs, bench, options)


def _plan(args: argparse.Namespace) -> int:
    """``--plan``: build the pilot's report in memory, print the plan, write nothing."""
    try:
        if is_ladder(load_runs(args.paths)):
            raise ReportError(
                "--plan: these runs are a ladder (several model sizes); plan on one size's run dirs"
            )
        rep = build_report(args.paths, args.plan, args.alpha, args.baseline, args.target)
    except ReportError as e:
        print(f"normlab-report: error: {e}", file=sys.stderr)
        return 1
    if not rep.comparisons:
        print(
            "normlab-report: error: --plan needs a pilot with at least 2 variants", file=sys.stderr
        )
        return 1
    for line in render_plan(plan_study(rep), rep.baseline):
        print(f"normlab-report: {line}" if not line.startswith(" ") else line)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI; returns the exit status: 0 report written (or ``--plan`` printed), 1 refusal (one
    line on stderr), 2 bad arguments."""
    p = _parser()
    args = p.parse_args(argv)
    _check(p, args)
    try:
        taken = _stored_options(args)
    except ReportError as e:
        print(f"normlab-report: error: {e}", file=sys.stderr)
        return 1
    _check(p, args)
    args.alpha = DEFAULT_ALPHA if args.alpha is None else args.alpha
    if taken:
        print(f"normlab-report: options stored in {args.paths[0]}: {' '.join(taken)}")
    if args.plan is not None:
        return _plan(args)
    margin = DEFAULT_MARGIN if args.margin is None else args.margin
    try:
        out = args.out or _default_out(args.paths)
        series = None if args.no_series else args.series or out / SERIES_FILE
        runs = load_runs(args.paths)
        if is_ladder(runs):
            return _ladder(args, margin, out, runs, series)
        rep = build_report(
            args.paths,
            margin,
            args.alpha,
            args.baseline,
            args.target,
            args.margin_compute,
            sequential=args.sequential,
        )
        path = write_report(rep, out)
        stored = _write_series(series, runs, args, rep.baseline) if series else None
        logged = _to_wandb(rep, args.wandb_mode, args.wandb_project, out) if args.wandb else None
    except (ReportError, OSError) as e:
        print(f"normlab-report: error: {e}", file=sys.stderr)
        return 1
    print(f"normlab-report: wrote {path}")
    if stored:
        print(f"normlab-report: wrote {stored} (`normlab-report {stored}` rebuilds the report)")
    if logged:
        print(f"normlab-report: {logged}")
    _print_summary(rep)
    for c in rep.comparisons if args.sequential else []:
        line = verdict_line(c["sequential"], rep.margin)
        print(f"  sequential, {c['label']} vs {rep.baseline}: {line}")
    if not any(v["n"] for v in rep.variants):
        print(
            "normlab-report: error: no completed runs to compare (see Excluded runs in the report)",
            file=sys.stderr,
        )
        return 1
    return 0


def _ladder(
    args: argparse.Namespace, margin: float, out: Path, runs: list[Run], series: Path | None
) -> int:
    """The ladder report: build, write (each size's report in ``out/<shape>/``; the series file
    of ``runs`` at ``series`` unless None), print its headlines; 2 for an option a ladder does
    not take, 1 on a refusal (one line), else 0."""
    if args.wandb or args.target is not None:
        flag = "--wandb" if args.wandb else "--target"
        print(
            f"normlab-report: error: {flag}: these runs are a ladder (several model sizes), "
            "which takes neither --wandb nor --target; report one size's run dirs for those",
            file=sys.stderr,
        )
        return 2
    try:
        lad = build_ladder(args.paths, margin, args.alpha, args.baseline, args.margin_compute)
        path = write_ladder(lad, out)
        stored = _write_series(series, runs, args, lad.baseline) if series else None
    except (ReportError, OSError) as e:
        print(f"normlab-report: error: {e}", file=sys.stderr)
        return 1
    print(f"normlab-report: wrote {path} (a ladder of {len(lad.sizes)} model sizes)")
    if stored:
        print(f"normlab-report: wrote {stored} (`normlab-report {stored}` rebuilds the report)")
    _print_ladder(lad)
    return 0


def _print_ladder_basis(lad) -> None:
    """The margin (the one every size used, else each size's own, with the fraction of compute
    and the slope that converted it) and the sizes the laws span, with those left out and why."""
    one = one_margin(lad)
    if one is not None:
        print(f"  margin: ±{one:.4g} nats/token at each size")
    for s in lad.sizes if one is None else []:
        rep = s["report"]
        source = (
            f" = {rep.margin_compute:g} of effective compute at its baseline's {rep.slope_source} "
            f"slope {rep.slope:.3g} nats per e-fold of steps"
            if rep.margin_compute is not None
            else ""
        )
        print(f"  {s['shape']}: margin ±{rep.margin:.4g} nats/token{source}")
    left = "; ".join(f"{shape} ({why})" for shape, why in lad.left_out.items())
    print(
        f"  laws over the sizes every variant has: {', '.join(lad.law_sizes) or 'none'}"
        + (f"; left out: {left}" if left else "")
    )


def _print_ladder(lad) -> None:
    """The margin and the laws' sizes (``_print_ladder_basis``); per variant each size's headline,
    the multiplier's trend and 124M value (or why none), and the fitted loss-compute law."""
    _print_ladder_basis(lad)
    if note := ladder_untuned_note(lad):
        print(f"  learning rate: {note}")
    for lab in lad.labels[1:]:
        for s in lad.sizes:
            c = comparison_at(s, lab)
            if c is not None:
                print(f"  {s['shape']}: {compute_headline(s['report'], c)}")
        t, at = lad.trends[lab], lad.trends[lab]["at_target"]
        value = (
            f"no value: {at['refused']}"
            if at.get("refused")
            else f"m = {at['k']:.3f} {fmt_ci(at['ci'], '.3f')} (an extrapolation, "
            f"{at['beyond']:.3g}x beyond the largest size)"
        )
        print(
            f"  {lab}: step multiplier trend m ~ N^{t['slope']:+.4f} {fmt_ci(t['slope_ci'])} over "
            f"{t['n']} sizes; at {at['params'] / 1e6:.0f}M parameters: {value}"
        )
    for lab, law in lad.laws.items():
        ci = fmt_ci(law["alpha_ci"], ".4f")
        print(
            f"  {lab}: L = {law['form']}, alpha = {law['alpha']:.4f} {ci} ({law['n']} size means "
            f"of {law.get('runs', 'n/a')} runs, {law['dof']} df)"
        )


def _print_summary(rep) -> None:
    """The skipped runs, an unfinished sweep's jobs and the command that continues it, the
    warnings and, per comparison, the compute-equivalent headline first, then the loss verdict
    and the speed."""
    for run, why in rep.skipped:
        print(f"  note: skipped {run.path}: {why}")
    for line in unfinished_notes(rep):
        print(f"  {line}")
    for w in rep.confounds:
        print(f"  warning: {w}")
    if note := untuned_note(rep):
        print(f"  learning rate: {note}")
    if rep.margin_compute is not None:
        print(
            f"  margin: {rep.margin_compute:g} of effective compute = {rep.margin:.4g} nats/token "
            f"(baseline {rep.slope_source} slope {rep.slope:.3g} nats per e-fold of steps)"
        )
    for c in rep.comparisons:
        print(f"  {compute_headline(rep, c)}")
        family = f"; over the family (Holm): {c['holm']['verdict']}" if c.get("holm") else ""
        print(f"  {c['label']} vs {rep.baseline}: n={c['n']}, {c['verdict']}{family}{_worth(rep)}")
        bench = (rep.bench or {}).get("ratios", {}).get(c["label"])
        if bench:
            print(
                f"  speed (interleaved, {bench['pairs']} pairs): step time ratio median "
                f"{bench['median']:.3f}, geometric mean {bench['gmean']:.3f}, sign test p = "
                f"{bench['sign_p']:.3g}: {bench['verdict']}"
            )
        if not c["ratio"]["comparable"]:
            print("  warning: step times not comparable (see the report's step-time section)")
    if best_text(rep):
        print(f"  {best_text(rep).replace('**', '')}")


def _worth(rep) -> str:
    """What the verdict's margin is worth in compute, and for the default margin that it is a
    screen (a verdict line read alone must not pass for a parity claim)."""
    worth = margin_in_compute(rep)
    text = f" (±{rep.margin:g} nats"
    text += f" is worth {worth_text(worth)} here" if math.isfinite(worth) else ""
    if rep.margin == DEFAULT_MARGIN and rep.margin_compute is None:
        text += "; the default margin: a gross-difference screen, not a parity claim: set --margin"
    return text + ")"


if __name__ == "__main__":
    sys.exit(main())
