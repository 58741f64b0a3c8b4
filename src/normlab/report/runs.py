"""Reading run dirs: find them, load ``.hydra/``, ``metrics.jsonl`` and ``summary.json``, and
normalise metric names written before the namespaced rename.

A run dir is any directory holding ``.hydra/``, ``summary.json`` or ``metrics.jsonl`` (what
``train`` writes). Nothing here imports model or training code. Losses in nats/token, times in ms.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NAN = float("nan")
RUN_MARKERS = (".hydra", "summary.json", "metrics.jsonl")

#: ``metrics.jsonl`` keys written before the namespaced rename -> their names now. The one place
#: old names are known: :func:`normalise_row` applies it to every row on load.
METRIC_RENAMES: dict[str, str] = {
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "step_time_ms": "perf/step_time_ms",
    "tokens_per_s": "perf/tokens_per_s",
}
#: A readable ``metrics.jsonl`` has a row with ``step`` and one of these (after renaming).
KNOWN_METRICS = ("train/loss", "val/loss", *METRIC_RENAMES.values())


class ReportError(Exception):
    """Runs that cannot be read or compared; the message is one line for the user."""


@dataclass
class Run:
    """One run dir: overrides, flattened config (dotted keys), metrics rows (new names), summary
    (None if absent or unreadable); ``name`` is the path shown in the report."""

    path: Path
    overrides: list[str]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    label: str = ""
    excluded: str | None = None  # the reason, or None when the run counts in the statistics
    name: str = ""
    #: a completed run left out of the comparison by design (a tuned study's other learning
    #: rates, :mod:`normlab.report.tuned`): the reason, or None
    set_aside: str | None = None

    @property
    def seed(self) -> int | None:
        """The run's seed: config ``seed``, else summary ``seed``."""
        return self.config.get("seed", (self.summary or {}).get("seed"))

    @property
    def final_val_loss(self) -> float:
        """Final validation loss in nats/token (nan when absent)."""
        return self.summary_float("final_val_loss")

    def summary_float(self, key: str) -> float:
        """A numeric summary field (units as in ``summary.json``), nan when absent or null."""
        v = (self.summary or {}).get(key)
        return NAN if v is None else float(v)

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens one optimizer step consumes: ``summary.json``'s ``tokens_per_step``, else
        ``data.batch_size * optim.grad_accum * model.context_length`` (as
        ``TrainConfig.tokens_per_step``); None when a key is missing."""
        if isinstance((self.summary or {}).get("tokens_per_step"), int):
            return self.summary["tokens_per_step"]
        keys = ("data.batch_size", "optim.grad_accum", "model.context_length")
        vals = [self.resolved(k) for k in keys]
        return math.prod(vals) if all(isinstance(v, int) for v in vals) else None

    def resolved(self, key: str) -> Any:
        """A config value as the run resolved it (``norm.impl=auto`` -> ``cpp``):
        ``summary.json``'s ``norm_impl`` for ``norm.impl`` (``precision`` for ``precision.dtype``),
        else its resolved ``config``, else ``.hydra/config.yaml``."""
        s = self.summary or {}
        if key == "norm.impl" and s.get("norm_impl"):
            return s["norm_impl"]
        if key == "precision.dtype" and s.get("precision"):
            return s["precision"]
        return flatten(s.get("config") or {}).get(key, self.config.get(key))


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"optim.lr": 0.0006, ...}``; lists stay values."""
    if not isinstance(cfg, dict):
        return {prefix: cfg} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def override_key(override: str) -> str:
    """The config key an override sets: ``"norm=rms"`` -> ``"norm"``, ``"+optim.lr=1e-3"`` ->
    ``"optim.lr"``, ``"hydra/launcher=x"`` -> ``"hydra.launcher"``."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0].replace("/", ".")


def exclusion_reason(summary: dict[str, Any] | None) -> str | None:
    """Why a run is left out of the statistics, or None when it counts."""
    if summary is None:
        return "did not finish (no summary.json)"
    status = summary.get("status")
    if status == "diverged":
        return f"diverged at step {summary.get('diverged_at_step', summary.get('steps_completed'))}"
    if status == "failed":
        return f"failed: {summary.get('error', 'unknown error')}"
    if status == "interrupted":
        return f"interrupted at step {summary.get('interrupted_at_step', '?')}"
    if status != "completed":
        return f"status {status!r}"
    v = summary.get("final_val_loss")
    if v is None or not math.isfinite(float(v)):
        return f"non-finite final validation loss ({v})"
    return None


def normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    """One ``metrics.jsonl`` row with old names (:data:`METRIC_RENAMES`) renamed; where a row holds
    both the old and the new name, the new one is kept."""
    out = {METRIC_RENAMES.get(k, k): v for k, v in row.items() if k not in METRIC_RENAMES}
    for old, new in METRIC_RENAMES.items():
        if old in row and new not in row:
            out[new] = row[old]
    return out


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` (a ``metrics.jsonl``) with :func:`normalise_row` applied; blank and
    truncated lines (a killed run's last) are skipped.

    Raises:
        ReportError: the file has lines but no row with ``step`` and a key of :data:`KNOWN_METRICS`
            under its new or old name (not written by ``train``).
    """
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(normalise_row(row))
    if lines and not any("step" in r and any(k in r for k in KNOWN_METRICS) for r in rows):
        names = ", ".join(KNOWN_METRICS) + " (or the old " + ", ".join(METRIC_RENAMES) + ")"
        raise ReportError(f"cannot read {path}: no row has 'step' and one of {names}")
    return rows


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text()) if path.exists() else None
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError(f"cannot read {path}: {first}") from None


def _summary(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # a run killed while writing it did not finish
    if not isinstance(summary, dict):
        raise ReportError(f"cannot read {path}: a JSON object was expected")
    return summary


def load_run(path: Path) -> Run:
    """Read one run dir. Config: ``.hydra/config.yaml``, else ``summary.json``'s ``config``.

    Raises:
        ReportError: a file that is there but cannot be read (see :func:`read_metrics`).
    """
    overrides = _yaml(path / ".hydra" / "overrides.yaml") or []
    summary = _summary(path / "summary.json")
    config = _yaml(path / ".hydra" / "config.yaml")
    if config is None and summary is not None:
        config = summary.get("config")
    metrics = read_metrics(path / "metrics.jsonl") if (path / "metrics.jsonl").exists() else []
    return Run(
        path,
        [str(o) for o in overrides],
        flatten(config or {}),
        metrics,
        summary,
        excluded=exclusion_reason(summary),
        name=path.name,
    )


def _natural(p: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def is_run_dir(d: Path) -> bool:
    """True when ``d`` holds one of :data:`RUN_MARKERS`."""
    return any((d / m).exists() for m in RUN_MARKERS)


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """``sweep_dir`` itself when it is a run dir, else its subdirectories (one or two levels down)
    that are run dirs, in natural order (``2_...`` before ``10_...``)."""
    if is_run_dir(sweep_dir) and not (sweep_dir / "multirun.yaml").exists():
        return [sweep_dir]

    def subdirs(d: Path) -> list[Path]:
        dirs = (p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        return sorted(dirs, key=_natural)

    found: list[Path] = []
    for child in subdirs(sweep_dir):
        found += [child] if is_run_dir(child) else [g for g in subdirs(child) if is_run_dir(g)]
    return found


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Load every run dir named by ``paths``: each a run dir or a sweep dir (see
    :func:`find_run_dirs`), anywhere. A run's ``name`` is its path below the paths' common folder.

    Raises:
        ReportError: a path that is not a directory, one holding no run dir, or an unreadable run.
    """
    dirs: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"not a directory: {p}")
        found = find_run_dirs(p)
        if not found:
            raise ReportError(f"no run dirs (with .hydra/, summary.json or metrics.jsonl) in {p}")
        dirs += [d for d in found if d.resolve() not in {x.resolve() for x in dirs}]
    runs = [load_run(d) for d in dirs]
    if len(runs) > 1:
        root = Path(os.path.commonpath([d.resolve() for d in dirs]))
        for run in runs:
            run.name = str(run.path.resolve().relative_to(root))
    return runs
