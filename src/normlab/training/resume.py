"""Resuming a run: the config hash, every RNG state, the checkpoint to continue from, free space.

A resumed run computes what the uninterrupted run would have: ``check_resumable`` refuses a
checkpoint of another config (``config_hash``, without ``RESUME_MAY_DIFFER``) or model shape;
``rng_state`` / ``restore_rng`` carry every generator across; the sampler's position is the step.

Why: docs/running.md
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normlab.config import ConfigError, TrainConfig, to_plain
from normlab.training.checkpoint import CKPT_DIR, Loaded, list_checkpoints, load_latest

log = logging.getLogger(__name__)

#: Config keys a resume may change, left out of the hash: they change what is shown or logged, or
#: when a run stops or counts as failed, never a number a step computes (evaluation and sampling
#: draw no random number; the schedule is over ``max_steps``, not ``max_time_s``).
RESUME_MAY_DIFFER = (
    "progress",
    "debug",
    "logger",
    "peak_tflops",
    "timing_warmup_steps",
    "log_interval",
    "diag_interval",
    "divergence_factor",
    "max_skipped_fraction",
    "eval_data",
    "eval_tasks",
    "eval_task_items",
    "max_time_s",
    "sample_interval",
    "sample_tokens",
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
    """SHA-256 (16 hex digits) of the resolved config as plain data, minus ``RESUME_MAY_DIFFER``."""
    blob = json.dumps(_hashed_items(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def config_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The hashed keys whose values differ, as ``"optim.lr: 0.001 -> 0.002"``, sorted; a key the
    saved config lacks is no difference when the current value is its schema default."""
    a, b = _hashed_items(saved), _hashed_items(current)
    defaults = _hashed_items(to_plain(TrainConfig()))
    missing = object()
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k, missing) != b.get(k, missing)
        and not (k not in a and b.get(k, missing) == defaults.get(k, missing))
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
    """Set every generator back to ``state`` (from ``rng_state``); CUDA's only when the number of
    devices matches (else they keep their seeding: other dropout masks, a valid run)."""
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


def shape_mismatches(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> list[str]:
    """Parameters and buffers whose names or shapes differ between ``model`` and ``saved``."""
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in saved.items()}
    return [
        f"{k}: {theirs.get(k, 'absent')} in the checkpoint, {own.get(k, 'absent')} now"
        for k in sorted(own.keys() | theirs.keys())
        if own.get(k) != theirs.get(k)
    ]


# --- resuming a run -------------------------------------------------------------------------------


def find_resume_point(run_dir: Path, resume: str | None) -> Loaded | None:
    """The checkpoint to continue from for ``resume`` None, ``"auto"`` or ``"required"``, or None
    for a new run. Raises ConfigError for a new run over checkpoints, checkpoints all damaged
    (never overwritten), or ``required`` and none."""
    directory = run_dir / CKPT_DIR
    if resume is None:
        if list_checkpoints(directory):
            raise ConfigError(
                f"run dir {run_dir} already holds checkpoints: add resume=auto to continue that "
                "run, "
                "or choose another hydra.run.dir"
            )
        return None
    loaded = load_latest(directory)
    for skipped in loaded.skipped:
        log.warning("checkpoint skipped: %s", skipped)
    if loaded.state is None and loaded.skipped:  # a new run here would replace what they hold
        n = len(loaded.skipped)
        raise ConfigError(
            f"no valid checkpoint to resume from in {directory}: {n} damaged ("
            f"{loaded.skipped[0]}); resume={resume} starts no new run over them (it would rewrite "
            f"metrics.jsonl and delete them): move {directory} and {run_dir / 'metrics.jsonl'} "
            "aside to start over, or choose another hydra.run.dir"
        )
    if loaded.state is None and resume == "required":
        raise ConfigError(f"no valid checkpoint to resume from in {directory} (none)")
    return loaded if loaded.state is not None else None


def check_resumable(
    loaded: Loaded, config: dict[str, Any], model: torch.nn.Module, force: bool
) -> list[str]:
    """Raise ConfigError for a checkpoint of another config (unless ``force``) or model shape;
    returns the differences ``force`` let through."""
    state, name = loaded.state, loaded.path.name
    diff = (
        [] if state["config_hash"] == config_hash(config) else config_diff(state["config"], config)
    )
    if diff and not force:
        raise ConfigError(
            f"cannot resume from {name}: the config differs in {'; '.join(diff)} (force=true "
            "resumes anyway)"
        )
    shapes = shape_mismatches(model, state["model"])
    if shapes:
        more = f" (and {len(shapes) - 3} more)" if len(shapes) > 3 else ""
        raise ConfigError(
            f"cannot resume from {name}: it holds a model of another shape: "
            f"{'; '.join(shapes[:3])}{more}"
        )
    if diff:
        log.warning(
            "resuming from %s with a different config (force=true): %s", name, "; ".join(diff)
        )
    return diff


def check_free_space(run_dir: Path, model: torch.nn.Module, keep: int) -> None:
    """Raise ConfigError when the run dir cannot hold one checkpoint; warn when not ``keep + 1``."""
    # a checkpoint: the parameters three times over (weights, AdamW's two moments)
    need = 3 * sum(p.numel() * p.element_size() for p in model.parameters()) + (1 << 20)
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < need:
        raise ConfigError(
            f"the run dir {run_dir} has {free / 2**20:.0f} MiB free; one checkpoint needs about "
            f"{need / 2**20:.0f} MiB"
        )
    if free < need * (keep + 1):
        log.warning(
            "the run dir %s has %.0f MiB free, less than %d checkpoints of about %.0f MiB",
            run_dir,
            free / 2**20,
            keep + 1,
            need / 2**20,
        )
