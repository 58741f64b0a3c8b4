"""``normlab-study until-decided``: seed pairs of two variants, trained until the anytime-valid
verdict (``report.sequential``) decides at the margin, or the budget ends.

Seed s trains variant A in ``OUT/seed<s>_a`` and B in ``OUT/seed<s>_b`` (at once with two jobs,
one thread each) by ``train ... seed=<s> hydra.run.dir=<dir> resume=auto``. The looks are
recomputed from the completed run dirs in seed order after every pair, so a killed driver resumes
the pair it was in and counts no seed twice. ``OUT/until_decided.json`` holds the looks, the
decision and the time spent; ``normlab-report OUT`` reads OUT as a sweep.
Why: docs/experiments.md "Until decided".
"""

from __future__ import annotations

import ctypes
import json
import math
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from normlab.report.runs import ReportError, load_run, write_atomic
from normlab.report.sequential import MIXTURE_C, sequential_verdict
from normlab.training.lock import own_run_dir

STATE_FILE = "until_decided.json"
#: What a second call on the same OUT must repeat (budget and max_pairs may change: the
#: sequence stays valid under any stopping rule).
FIXED = ("common", "variants", "margin", "alpha")
TRAIN = (sys.executable, "-m", "normlab.commands.train")  # this interpreter's train
POLL_S = 5.0  # how often the elapsed time is saved while a pair trains


class DriverError(Exception):
    """A pair that cannot be used (a run that failed) or a state file that is not this study's."""


@dataclass
class Driver:
    """What to drive: ``common`` overrides, the two ``variants``' own overrides, the margin
    (nats/token) and alpha of the verdict, the budget (seconds of the driver's wall clock, summed
    over calls), the most pairs, the runs at once (1 or 2) and the ``train`` command."""

    out: Path
    common: list[str]
    variants: list[list[str]]
    margin: float
    alpha: float = 0.05
    budget_s: float = math.inf
    max_pairs: int = 60
    jobs: int = 2
    train: list[str] = field(
        default_factory=lambda: [sys.executable, "-m", "normlab.commands.train"]
    )


def run_dir(out: Path, seed: int, side: str) -> Path:
    return out / f"seed{seed}_{side}"


def train_command(d: Driver, seed: int, side: str) -> list[str]:
    """The ``train`` call that starts or resumes the run of ``seed`` and variant ``side``."""
    variant = d.variants[0 if side == "a" else 1]
    where = run_dir(d.out, seed, side)
    return [*d.train, *d.common, *variant, f"seed={seed}", "threads=1", "progress=false"] + [
        "hydra.mode=RUN",
        f"hydra.run.dir={where}",
        "resume=auto",
    ]


def final_loss(path: Path) -> float | None:
    """The final validation loss of a completed run dir; None while it is not completed.
    DriverError for a run that failed or diverged (the pair cannot be used)."""
    if not (path / "summary.json").is_file():
        return None
    try:
        run = load_run(path)
    except ReportError as e:
        raise DriverError(str(e)) from None
    status = (run.summary or {}).get("status")
    if status in ("failed", "diverged"):
        raise DriverError(f"{path}: {status}; the pair cannot be used (see {path / 'train.log'})")
    return run.final_val_loss if status == "completed" else None


def _die_with_parent() -> None:
    """In the child: SIGTERM when the driver dies (Linux prctl PR_SET_PDEATHSIG), so a killed
    driver leaves no run training: each checkpoints on SIGTERM and resumes with the driver."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _start(d: Driver, seed: int, side: str) -> subprocess.Popen:
    log = open(d.out / f"seed{seed}_{side}.log", "ab")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        train_command(d, seed, side),
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
    )


def train_pair(d: Driver, seed: int, save) -> None:
    """Train what is missing of ``seed``'s pair, ``d.jobs`` runs at a time; ``save()`` every
    POLL_S seconds. DriverError when a run exits non-zero (its log named)."""
    todo = [s for s in "ab" if final_loss(run_dir(d.out, seed, s)) is None]
    while todo:
        batch, todo = todo[: d.jobs], todo[d.jobs :]
        procs = {s: _start(d, seed, s) for s in batch}
        while any(p.poll() is None for p in procs.values()):
            time.sleep(POLL_S)
            save()
        for s, p in procs.items():
            if p.returncode != 0:
                log = d.out / f"seed{seed}_{s}.log"
                raise DriverError(f"train of seed {seed}, variant {s} exited {p.returncode}: {log}")


def read_state(d: Driver) -> dict[str, Any]:
    """The state of an earlier call on ``d.out`` ({} if none). DriverError when it drove
    another study (a key of FIXED differs) or cannot be read."""
    path = d.out / STATE_FILE
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DriverError(f"{path}: unreadable ({e}); use another --out") from None
    mine = asdict(d)
    for key in FIXED:
        if state.get(key) != mine[key]:
            raise DriverError(
                f"{d.out} drove {key}={state.get(key)!r}, not {mine[key]!r}: use another --out"
            )
    return state


def drive(d: Driver, say=print) -> dict[str, Any]:
    """Train pairs in seed order until the sequence decides, the budget or max_pairs ends; returns
    the state written to ``OUT/until_decided.json``. Raises ConfigError (the OUT dir is busy),
    DriverError."""
    d.out.mkdir(parents=True, exist_ok=True)
    with own_run_dir(d.out):
        state = read_state(d)
        start = time.monotonic() - state.get("elapsed_s", 0.0)
        pair_s: list[float] = state.get("pair_s", [])
        diffs: list[float] = []
        state = {**asdict(d), "out": str(d.out), "train": d.train, "mixture_c": MIXTURE_C}
        state |= {"stopped_by": "max_pairs", "pair_s": pair_s}

        def save(**extra: Any) -> None:
            state.update(extra, elapsed_s=time.monotonic() - start)
            write_atomic(d.out / STATE_FILE, json.dumps(state, indent=1, default=str).encode())

        for seed in range(d.max_pairs):
            a, b = _losses(d, seed)
            if a is None or b is None:
                elapsed, need = time.monotonic() - start, statistics.median(pair_s or [0.0])
                if elapsed + need > d.budget_s:
                    state["stopped_by"] = "budget"
                    break
                say(f"until-decided: training pair {seed} (seed={seed}) in {d.out}")
                t0 = time.monotonic()
                train_pair(d, seed, save)
                pair_s.append(time.monotonic() - t0)
                a, b = _losses(d, seed)
            diffs.append(b - a)
            verdict = sequential_verdict(diffs, d.margin, d.alpha)
            save(verdict=_plain(verdict), seeds=list(range(seed + 1)))
            say(f"until-decided: after {seed + 1} pairs: {verdict['decision']}")
            if verdict["decision"] != "undecided":
                state["stopped_by"] = "decision"
                break
        save()
    return state


def _losses(d: Driver, seed: int) -> tuple[float | None, float | None]:
    """The final losses of ``seed``'s runs of A and B (None: not completed)."""
    a, b = (final_loss(run_dir(d.out, seed, s)) for s in "ab")
    return a, b


def _plain(verdict: dict[str, Any]) -> dict[str, Any]:
    """The verdict as JSON-ready data (the fixed-n TOST's tuples become lists)."""
    return json.loads(json.dumps(verdict, default=float))
