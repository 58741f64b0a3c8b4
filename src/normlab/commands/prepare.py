"""The ``normlab-prepare`` command: tokenize corpora into the token cache ahead of training.

Why: docs/data.md
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import time

from normlab.commands.overrides import expand
from normlab.compose import compose
from normlab.data.corpus import DataError

USAGE = (
    "usage: normlab-prepare [--fresh] [OVERRIDE ...]   "
    "e.g. normlab-prepare data=tinystories data.tokenizer=gpt2"
)
HEADER = (
    f"{'data':<14} {'tokenizer':<16} {'vocab':>6} {'train tokens':>14} {'val tokens':>12} "
    f"{'shards':>6} {'seconds':>8}  folder"
)


def row(data) -> str:
    """One table row for a prepared ``TokenData``."""
    m = data.meta
    tok = m["tokenizer"] + (f" ({m['bpe_vocab_size']})" if m["tokenizer"] == "bpe" else "")
    shards = sum(len(m["splits"][s]["shards"]) for s in ("train", "val"))
    return (
        f"{m['name']:<14} {tok:<16} {data.vocab_size:>6} "
        f"{m['tokens']['train']:>14,} {m['tokens']['val']:>12,} "
        f"{shards:>6} {m.get('prepare_seconds', 0.0):>8.2f}  {data.directory}"
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``normlab-prepare``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip() + "\n\n" + USAGE)
        return
    fresh = "--fresh" in args
    args = [a for a in args if a != "--fresh"]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from normlab.config import ConfigError
    from normlab.data.tokens import prepare

    try:
        jobs = expand(args)
    except HydraException as e:
        print(f"normlab-prepare: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    failed = header = False
    for job in jobs:
        tmp = tempfile.mkdtemp(prefix="normlab-prepare-") if fresh else None
        try:
            fresh_cache = [f"data.cache_dir={tmp}", "data.token_dir=null"] if fresh else []
            cfg = compose([*job, *fresh_cache]).data
            t0 = time.perf_counter()
            data = prepare(cfg)
            if fresh:
                data.meta["prepare_seconds"] = time.perf_counter() - t0
            if not header:
                print(
                    HEADER + ("   (fresh: seconds are the whole cold prepare)" if fresh else ""),
                    flush=True,
                )
                header = True
            print(row(data) + (" (temporary, removed)" if fresh else ""), flush=True)
        except (ConfigError, DataError) as e:
            print(f"normlab-prepare: error: {e}", file=sys.stderr, flush=True)
            failed = True
        except (HydraException, OmegaConfBaseException) as e:  # an unknown option or a bad override
            cause = e.__cause__ or e
            text = str(e).split("Config search path")[0]
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            detail = f" ({str(cause).splitlines()[0]})" if cause is not e and str(cause) else ""
            print(f"normlab-prepare: error: {' '.join(lines)}{detail}", file=sys.stderr, flush=True)
            failed = True
        except KeyboardInterrupt:
            print(
                "normlab-prepare: interrupted; finished shards are kept: "
                "rerun the same command to resume",
                file=sys.stderr,
            )
            sys.exit(130)
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        sys.exit(2)


if __name__ == "__main__":
    main()
