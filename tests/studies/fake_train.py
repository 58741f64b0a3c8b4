"""A stand-in for ``train`` in the driver's tests: parses ``key=value`` overrides, trains 10
"steps" of 0.1 s (each appended to ``progress``), resumes from ``progress`` after a kill, and
writes a completed ``summary.json`` whose final loss is a fixed function of seed and norm."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

STEPS = 10


def loss(seed: int, norm: str) -> float:
    base = 2.0 + 0.001 * ((seed * 7919) % 13)
    return base + (0.0004 * ((seed * 104729) % 7 - 3) if norm == "rms" else 0.0)


def main() -> None:
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    run = Path(args["hydra.run.dir"])
    run.mkdir(parents=True, exist_ok=True)
    progress = run / "progress"
    done = len(progress.read_text().splitlines()) if progress.exists() else 0
    with (run / "starts").open("a") as f:
        f.write(f"{done}\n")  # one line a start, with the steps it resumed from
    for step in range(done, STEPS):
        time.sleep(0.1)
        with progress.open("a") as f:
            f.write(f"{step}\n")
    seed, norm = int(args["seed"]), args.get("norm", "layer")
    summary = {
        "status": "completed",
        "seed": seed,
        "final_val_loss": loss(seed, norm),
        "config": {"seed": seed, "norm": {"kind": norm}, "max_steps": STEPS},
    }
    (run / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
