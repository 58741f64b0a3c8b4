"""Atomic checkpoints: model, optimizer, grad scaler, every RNG, data position, config hash, wandb id.

A checkpoint is one file ``<run dir>/checkpoints/step-<8-digit step>-<digest>.pt``, written by
``torch.save`` into a hidden temporary file in the same folder, flushed, fsynced and renamed (then
the folder is fsynced), so a kill at any moment leaves either the previous checkpoint or the new
one, never half of one. ``digest`` is the first 16 hex digits of the file's SHA-256: a truncated or
corrupted file (a kill during a copy, a partial rsync, a bad disk) is detected on load before
``torch.load`` reads it. ``torch.load`` alone does not notice flipped bytes inside a tensor.

The newest ``keep`` checkpoints are kept. Loading walks them newest first and skips (and names) the
ones that fail their check, so a damaged newest checkpoint costs the steps since the previous one.

The batch sampler's position is the step (batches are a pure function of ``(seed, step, micro)``).
Files are loaded with ``weights_only=True``: loading a checkpoint runs no pickled code.

Also here, for the loop in ``train.py``: choosing the checkpoint to resume from and refusing one of
another config or model shape (:func:`find_resume_point`, :func:`check_resumable`), and
:class:`StopSignals`, which turns SIGTERM/SIGINT (how SLURM pre-empts a job) into "checkpoint, stop".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normlab.config import ConfigError

log = logging.getLogger(__name__)

#: Version of the state layout below; a checkpoint of another version is skipped, not misread.
FORMAT = 1
CKPT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d{8})-([0-9a-f]{16})\.pt$")
_TMP_PREFIX = ".step-"

#: Config keys that may differ between a checkpoint and the run that resumes from it: they change
#: what is displayed or logged, never a number the run computes. Every other key is hashed.
RESUME_MAY_DIFFER = (
    "progress",
    "debug",
    "logger",
    "peak_tflops",
    "timing_warmup_steps",
    "log_interval",
    "diag_interval",
    "data.cache_dir",
    "data.token_dir",
    "data.num_proc",
)


# --- the config hash ------------------------------------------------------------------------------


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _hashed_items(config: dict[str, Any]) -> dict[str, Any]:
    flat = _flatten(config)
    return {
        k: v
        for k, v in flat.items()
        if not any(k == p or k.startswith(p + ".") for p in RESUME_MAY_DIFFER)
    }


def config_hash(config: dict[str, Any]) -> str:
    """SHA-256 (16 hex digits) of the resolved config as plain data, minus :data:`RESUME_MAY_DIFFER`."""
    blob = json.dumps(_hashed_items(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def config_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The hashed keys whose values differ, as ``"optim.lr: 0.001 -> 0.002"`` (sorted by key)."""
    a, b = _hashed_items(saved), _hashed_items(current)
    missing = object()
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k, missing) != b.get(k, missing)
    ]


# --- RNG states -----------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every RNG state: Python's, NumPy's legacy global, torch CPU, and every CUDA device's."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Set every generator back to ``state`` (from :func:`rng_state`).

    CUDA states are restored only when the number of devices matches; otherwise CUDA generators
    keep their seeding (the run stays valid, dropout masks on GPU then differ from the original).
    """
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (
            n["name"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if (
        state["cuda"]
        and torch.cuda.is_available()
        and len(state["cuda"]) == torch.cuda.device_count()
    ):
        torch.cuda.set_rng_state_all(state["cuda"])


# --- save -----------------------------------------------------------------------------------------


class _HashingWriter:
    """A write-only file wrapper that feeds every byte written to a hash as well."""

    def __init__(self, f, h):
        self._f, self._h = f, h

    def write(self, b) -> int:
        self._h.update(b)
        return self._f.write(b)

    def flush(self) -> None:
        self._f.flush()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every file named like a checkpoint in ``directory``, newest step first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, key=lambda sp: (sp[0], sp[1].stat().st_mtime_ns), reverse=True)


def save_checkpoint(directory: Path, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` (must hold ``step``) atomically to ``directory``; keep the newest ``keep``.

    Temporary file, flush, fsync, rename, fsync of the folder; then older checkpoints beyond
    ``keep`` and leftovers of interrupted saves are deleted. Returns the checkpoint's path.

    Raises:
        OSError: the file could not be written (the temporary file is removed; older checkpoints
            are untouched).
    """
    directory.mkdir(parents=True, exist_ok=True)
    step = int(state["step"])
    tmp = directory / f"{_TMP_PREFIX}{step:08d}.tmp{os.getpid()}"
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            torch.save({**state, "format": FORMAT}, _HashingWriter(f, h))
            f.flush()
            os.fsync(f.fileno())
        path = directory / f"step-{step:08d}-{h.hexdigest()[:16]}.pt"
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    others = [(s, p) for s, p in list_checkpoints(directory) if p != path]
    superseded = [p for s, p in others if s >= step]  # a timeline this run has replaced
    beyond_keep = [p for s, p in others if s < step][keep - 1 :]
    for p in [*superseded, *beyond_keep, *directory.glob(f"{_TMP_PREFIX}*.tmp*")]:
        p.unlink(missing_ok=True)  # leftovers of saves that were killed go too
    return path


# --- load -----------------------------------------------------------------------------------------


@dataclass
class Loaded:
    """Result of :func:`load_latest`: the newest valid state (or None) and what was skipped."""

    state: dict[str, Any] | None = None
    path: Path | None = None
    skipped: list[str] = field(default_factory=list)  # "name: why", newest first


def _sha256_prefix(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:16]


def verify(path: Path) -> str | None:
    """None when ``path``'s contents match the digest in its name, else why not (one line)."""
    m = _NAME.match(path.name)
    if m is None:
        return "not a checkpoint name (step-<step>-<digest>.pt)"
    if _sha256_prefix(path) != m.group(2):
        return (
            f"truncated or corrupted ({path.stat().st_size} bytes; SHA-256 does not match its name)"
        )
    return None


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load one checkpoint after checking its digest.

    Raises:
        ValueError: the file fails its check, cannot be read, or has another format version.
    """
    problem = verify(path)
    if problem is not None:
        raise ValueError(problem)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise ValueError(f"unreadable ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(
            f"format {state.get('format') if isinstance(state, dict) else '?'} is not {FORMAT}"
        )
    return state


def load_latest(directory: Path, map_location: str | torch.device = "cpu") -> Loaded:
    """The newest checkpoint in ``directory`` that passes its check; damaged ones are skipped by name."""
    out = Loaded()
    for _, path in list_checkpoints(directory):
        try:
            out.state = load_checkpoint(path, map_location)
        except ValueError as e:
            out.skipped.append(f"{path.name}: {e}")
            continue
        out.path = path
        break
    return out


def shape_mismatches(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> list[str]:
    """Parameters and buffers whose names or shapes differ between ``model`` and a saved state dict."""
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in saved.items()}
    return [
        f"{k}: {theirs.get(k, 'absent')} in the checkpoint, {own.get(k, 'absent')} now"
        for k in sorted(own.keys() | theirs.keys())
        if own.get(k) != theirs.get(k)
    ]


# --- resuming a run -------------------------------------------------------------------------------


def find_resume_point(run_dir: Path, resume: str | None) -> Loaded | None:
    """The checkpoint to continue from, or None for a new run; damaged checkpoints are logged by name.

    ``resume``: None (a new run), ``"auto"`` (the newest valid checkpoint if any) or ``"required"``.

    Raises:
        ConfigError: a new run in a run dir that holds checkpoints, or ``resume=required`` and no
            valid checkpoint.
    """
    directory = run_dir / CKPT_DIR
    if resume is None:
        if list_checkpoints(directory):
            raise ConfigError(
                f"run dir {run_dir} already holds checkpoints: add resume=auto to continue that run, "
                "or choose another hydra.run.dir"
            )
        return None
    loaded = load_latest(directory)
    for skipped in loaded.skipped:
        log.warning("checkpoint skipped: %s", skipped)
    if loaded.state is None:
        if resume == "required":
            found = f"{len(loaded.skipped)} damaged" if loaded.skipped else "none"
            raise ConfigError(f"no valid checkpoint to resume from in {directory} ({found})")
        return None
    return loaded


def check_resumable(
    loaded: Loaded, config: dict[str, Any], model: torch.nn.Module, force: bool
) -> list[str]:
    """Refuse to resume from a checkpoint of another config (unless ``force``) or model shape.

    Returns the config differences that ``force`` let through (empty when the hashes agree).

    Raises:
        ConfigError: one line naming the checkpoint and the differing keys or parameter shapes.
    """
    state, name = loaded.state, loaded.path.name
    diff = (
        [] if state["config_hash"] == config_hash(config) else config_diff(state["config"], config)
    )
    if diff and not force:
        raise ConfigError(
            f"cannot resume from {name}: the config differs in {'; '.join(diff)} (force=true resumes anyway)"
        )
    shapes = shape_mismatches(model, state["model"])
    if shapes:
        more = f" (and {len(shapes) - 3} more)" if len(shapes) > 3 else ""
        raise ConfigError(
            f"cannot resume from {name}: it holds a model of another shape: {'; '.join(shapes[:3])}{more}"
        )
    if diff:
        log.warning(
            "resuming from %s with a different config (force=true): %s", name, "; ".join(diff)
        )
    return diff


def check_free_space(run_dir: Path, model: torch.nn.Module, keep: int) -> None:
    """Refuse to start when the run dir cannot hold one checkpoint; warn when it cannot hold ``keep + 1``.

    A checkpoint is about the parameters three times over (weights, AdamW's two moments).
    """
    need = 3 * sum(p.numel() * p.element_size() for p in model.parameters()) + (1 << 20)
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < need:
        raise ConfigError(
            f"the run dir {run_dir} has {free / 2**20:.0f} MiB free; one checkpoint needs about {need / 2**20:.0f} MiB"
        )
    if free < need * (keep + 1):
        log.warning(
            "the run dir %s has %.0f MiB free, less than %d checkpoints of about %.0f MiB",
            run_dir,
            free / 2**20,
            keep + 1,
            need / 2**20,
        )


class StopSignals:
    """While active, SIGTERM and SIGINT set :attr:`signal` (the signal's name) instead of ending the
    process, so the loop can finish its step, save a checkpoint and stop. A second SIGINT raises
    KeyboardInterrupt at once. Outside the main thread (where handlers cannot be set) it does nothing.
    """

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def watched(self) -> tuple[int, ...]:
        """The signals handled while active (a subclass may add its own)."""
        return (signal.SIGTERM, signal.SIGINT)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name  # no logging here: a handler may interrupt it

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in dict.fromkeys(self.watched()):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
