"""Cool-down branches of a wsd run: one annealed point per budget (Hägele et al. 2024).

For each budget ``T`` of ``optim.anneal_at``, once the main run has done step ``D = T -
round(decay_fraction * T)``, ``Annealer`` copies the run's state, trains steps ``D..T-1`` with
``lr_at(step, T)``, evaluates, appends the point to ``annealed.jsonl`` and restores everything:
the main run goes on bit for bit. A point is ``{"budget_steps", "branch_from", <eval keys>,
"branch_time_s", "diverged"}``, non-finite values null.

Why: docs/running.md
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from normlab.config import LrSchedule
from normlab.training import distributed
from normlab.training import step as training_step
from normlab.training.metrics import NAMES
from normlab.training.resume import restore_rng, rng_state
from normlab.training.setup import Run
from normlab.training.signals import StopSignals
from normlab.training.tracking import synchronize
from normlab.training.validation import eval_row

log = logging.getLogger(__name__)

#: The annealed points of a run, one JSON object a line, in its run dir.
ANNEALED = "annealed.jsonl"
#: A larger ``annealed.jsonl`` is not read (a point is well under a kilobyte).
MAX_BYTES = 16 << 20


@dataclass
class Annealer:
    """The cool-down branches of one run: ``branches`` ``{D: [T, ...]}``, the ``points`` so far;
    ``path`` is ``annealed.jsonl`` on rank 0 of a wsd run, else None (other ranks branch too)."""

    enabled: bool
    path: Path | None
    branches: dict[int, list[int]]
    points: list[dict[str, Any]] = field(default_factory=list)

    def due(self, done: int) -> list[int]:
        """The budgets whose branch starts after step ``done`` and has no point yet."""
        recorded = {p["budget_steps"] for p in self.points}
        return [t for t in self.branches.get(done, []) if t not in recorded]

    def after_step(self, run: Run, done: int, stop: StopSignals) -> None:
        """Run the branches due after step ``done``, each leaving the run as it was; a stop signal
        abandons a branch (no point: a resume from ``done`` runs it)."""
        for budget in self.due(done):
            point = branch(run, budget, done, stop)
            if point is None:
                log.warning("cool-down branch to %d steps abandoned: a stop signal", budget)
                return
            self.record(point)

    def complete(self, run: Run, val_row: dict[str, Any]) -> None:
        """Record the final evaluation as budget ``max_steps``'s point, unless already recorded."""
        if self.enabled and run.cfg.max_steps not in {p["budget_steps"] for p in self.points}:
            self.record(_point(run.cfg.max_steps, None, val_row, None, diverged=False))

    def record(self, point: dict[str, Any]) -> None:
        """Keep ``point`` and append it to ``annealed.jsonl`` (rank 0; never through a link)."""
        self.points.append(point)
        v = point[NAMES["val_loss"]]
        log.info(
            "annealed point: %d steps%s: val loss %s",
            point["budget_steps"],
            "" if point["branch_from"] is None else f" (branch after step {point['branch_from']})",
            f"{v:.4f}" if v is not None else "- (diverged)",
        )
        if self.path is not None:
            _append(self.path, json.dumps(point) + "\n")


def open_annealer(run: Run, run_dir: Path) -> Annealer:
    """The annealer of ``run``; a resume cuts ``annealed.jsonl`` back to ``run.start``, a new run
    deletes it. Collective: rank 0 reads the file and broadcasts its points."""
    cfg = run.cfg
    enabled = cfg.optim.schedule == LrSchedule.wsd
    branches: dict[int, list[int]] = {}
    for budget, start in cfg.optim.budgets(cfg.max_steps):
        branches.setdefault(start, []).append(budget)
    path = run_dir / ANNEALED if enabled and distributed.is_main() else None
    points: list[dict[str, Any]] = []
    if path is not None:
        points = _kept_points(path, run.start) if run.resume else []
        _rewrite(path, points)
    points = distributed.broadcast(points)
    return Annealer(enabled=enabled, path=path, branches=branches, points=points)


def branch(run: Run, budget: int, start: int, stop: StopSignals) -> dict[str, Any] | None:
    """Train steps ``start..budget-1`` with ``lr_at(step, budget)``, evaluate and restore the run
    exactly; returns the point, or None when a stop signal on any rank abandoned it."""
    saved = _snapshot(run)
    try:
        synchronize(run.device)
        t0 = time.perf_counter()
        losses = []
        for step in range(start, budget):
            if distributed.all_reduce_max(stop.code):  # on any rank: the run stops at ``start``
                return None
            lr = training_step.lr_at(step, budget, run.cfg.optim)
            losses.append(training_step.train_step(run, step, lr)[0])
        diverged = not bool(torch.stack(losses).isfinite().all())  # one host sync
        seconds = time.perf_counter() - t0
        row = {NAMES["val_loss"]: None, NAMES["val_bpb"]: None} if diverged else eval_row(run)
        return _point(budget, start, row, seconds, diverged)
    finally:
        _restore(run, saved)


def _snapshot(run: Run) -> dict[str, Any]:
    """Deep copies of what a branch changes: weights, optimizer and scaler state, RNG states."""
    # on the run's device: one more copy of the weights and AdamW moments while a branch runs
    return {
        "model": {k: v.detach().clone() for k, v in run.model.state_dict().items()},
        "optimizer": copy.deepcopy(run.optimizer.state_dict()),
        "scaler": copy.deepcopy(run.scaler.state_dict()),
        "rng": rng_state(),
    }


def _restore(run: Run, saved: dict[str, Any]) -> None:
    """Put back a ``_snapshot`` (in place: the parameters stay the optimizer's)."""
    run.model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    if saved["scaler"]:  # empty without a scaler (fp32, bf16)
        run.scaler.load_state_dict(saved["scaler"])
    run.optimizer.zero_grad(set_to_none=True)
    restore_rng(saved["rng"])


def _point(
    budget: int, start: int | None, row: dict[str, Any], seconds: float | None, diverged: bool
) -> dict[str, Any]:
    """One line of ``annealed.jsonl``; non-finite floats become None."""
    val = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
    first = {k: val.pop(k, None) for k in (NAMES["val_loss"], NAMES["val_bpb"])}
    return {
        "budget_steps": budget,
        "branch_from": start,
        **first,
        **val,
        "branch_time_s": seconds,
        "diverged": diverged,
    }


# --- annealed.jsonl: read with a limit, written without following a link -------------------------


def read_points(path: Path) -> list[dict[str, Any]]:
    """The valid points of an ``annealed.jsonl`` (others, a torn last line, left out); a missing
    file, a link or one over ``MAX_BYTES`` reads as none (with a warning)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    except OSError as e:  # ELOOP: a symlink
        log.warning("%s not read (%s)", path, e.strerror or e)
        return []
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        log.warning("%s not read: over %d MiB", path, MAX_BYTES >> 20)
        return []
    points = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            p = json.loads(line)
        except json.JSONDecodeError:
            continue
        if _is_point(p):
            points.append(p)
    return points


def _is_point(p: Any) -> bool:
    return (
        isinstance(p, dict)
        and type(p.get("budget_steps")) is int
        and (p.get("branch_from") is None or type(p.get("branch_from")) is int)
    )


def _kept_points(path: Path, start: int) -> list[dict[str, Any]]:
    """The points recorded at or before main-run step ``start`` (a branch's at its ``branch_from``,
    the final point at ``budget_steps``)."""
    points = read_points(path)
    at = [p["budget_steps"] if p["branch_from"] is None else p["branch_from"] for p in points]
    return [p for p, step in zip(points, at, strict=True) if step <= start]


def _rewrite(path: Path, points: list[dict[str, Any]]) -> None:
    """Replace ``path`` atomically by ``points`` (no file if none); a link is replaced, not
    followed."""
    if not points:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    if _append(tmp, "".join(json.dumps(p) + "\n" for p in points), exclusive=True):
        os.replace(tmp, path)


def _append(path: Path, text: str, exclusive: bool = False) -> bool:
    """Append ``text`` to ``path`` and fsync (``exclusive``: must not exist; a link is refused);
    False when it failed, logged: a lost point never stops training."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | (os.O_EXCL if exclusive else 0), 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        log.error("cannot write %s (%s); training goes on", path, e)
        return False
    return True
