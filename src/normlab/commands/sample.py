"""The ``normlab-sample`` command: text from a trained run's newest valid checkpoint.

Prints each sample followed by a line of dashes; what was loaded (checkpoint, step, norm, device)
goes to stderr. A refusal (no checkpoint, a bad option, a prompt the tokenizer cannot encode, a
tokenizer whose digest is not the one the run recorded) is one line on stderr and exit status 2.

Why: docs/running.md
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from normlab.config import ConfigError, NormImpl
from normlab.data.corpus import DataError

SEPARATOR = "-" * 15


def add_run_dir_args(p: argparse.ArgumentParser) -> None:
    """The options of a command that loads a run dir's model (``normlab-sample``, ``normlab-eval``):
    ``RUN_DIR``, ``--device``, ``--norm-impl``."""
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run dir (holds checkpoints/)")
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N"
    )
    p.add_argument(
        "--norm-impl",
        default=None,
        choices=[i.name for i in NormImpl if i != NormImpl.auto],
        help="compute the norms with another implementation (default: the one the run trained "
        "with; needed when it cannot run on --device)",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="normlab-sample",
        description="Generate text with the model of a normlab run dir (its newest valid "
        "checkpoint, the norm it trained with, its tokenizer).",
    )
    p.add_argument(
        "--prompt",
        default="",
        help="text the samples continue (default: empty, i.e. the start of a new document)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=500, help="tokens generated per sample (default 500)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="logits are divided by it; > 0 (default 0.8; lower is more conservative)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=200,
        help="draw among the K likeliest tokens only; >= 1, 1 is greedy (default 200)",
    )
    p.add_argument("--num-samples", type=int, default=1, help="samples to print (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (0)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: train's rule: $OMP_NUM_THREADS, else half the cores)",
    )
    add_run_dir_args(p)
    return p


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``normlab-sample``; exits 2 after one line on stderr when it refuses."""
    p = _parser()
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads {args.threads}: expected >= 1")
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

    import torch

    from normlab.commands.train import auto_threads
    from normlab.training.sample import SampleOptions, encode_prompt, load_run, sample_texts

    torch.set_num_threads(args.threads or auto_threads())  # as train sets it

    try:
        opts = SampleOptions(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            num_samples=args.num_samples,
            seed=args.seed,
        )
        impl = NormImpl[args.norm_impl] if args.norm_impl else None
        run = load_run(args.run_dir, args.device, impl)
        encode_prompt(run.tokenizer, args.prompt)  # refused before anything is printed
        for skipped in run.skipped:
            print(f"normlab-sample: skipped damaged checkpoint {skipped}", file=sys.stderr)
        print(
            f"normlab-sample: {run.checkpoint} (step {run.step}), norm {run.norm.kind.name}/"
            f"{run.norm.impl.name} {run.norm.placement.name}, {run.tokenizer.name} tokens, "
            f"on {run.device}",
            file=sys.stderr,
        )
        if run.tokenizer_notice:  # a run that recorded no tokenizer digest
            print(f"normlab-sample: {run.tokenizer_notice}", file=sys.stderr)
        texts = sample_texts(run, args.prompt, opts)
    except (ConfigError, DataError) as e:
        print(f"normlab-sample: error: {e}", file=sys.stderr)
        sys.exit(2)
    for text in texts:
        print(text)
        print(SEPARATOR, flush=True)


if __name__ == "__main__":
    main()
