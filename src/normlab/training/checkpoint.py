"""Atomic checkpoint files: write, list, verify, load.

A checkpoint is ``<run dir>/checkpoints/step-<8-digit step>-<digest>.pt``, written to a hidden
temporary file, fsynced and renamed: a kill leaves the previous checkpoint or the new one.
``digest`` is the first 16 hex digits of the file's SHA-256, checked before ``torch.load`` (which
misses flipped bytes in a tensor). Loading walks the newest ``keep`` newest first, skipping damaged
ones, with ``weights_only=True``: it runs no pickled code.

Why: docs/running.md
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: Version of the state layout; a checkpoint of another version is skipped, not misread.
FORMAT = 1
CKPT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d{8})-([0-9a-f]{16})\.pt$")
_TMP_PREFIX = ".step-"


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
    """``(step, path)`` of every file named like a checkpoint in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, key=lambda sp: (sp[0], sp[1].stat().st_mtime_ns), reverse=True)


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays, at any depth of dicts, lists and tuples, as Python
    numbers and lists: ``torch.load(weights_only=True)`` refuses numpy types."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if type(value) is tuple:  # plain tuples only (random.getstate()); no namedtuple is stored
        return tuple(plain(v) for v in value)
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    return value


def save_checkpoint(directory: Path, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` (with ``step``) atomically to ``directory``, keep the newest ``keep``;
    returns the path. Raises OSError if it cannot be written (older checkpoints untouched)."""
    directory.mkdir(parents=True, exist_ok=True)
    step = int(state["step"])
    tmp = directory / f"{_TMP_PREFIX}{step:08d}.tmp{os.getpid()}"
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            torch.save({**plain(state), "format": FORMAT}, _HashingWriter(f, h))
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
    """Result of ``load_latest``: the newest valid state (or None) and what was skipped."""

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
    """Load one checkpoint after checking its digest; raises ValueError when it fails its check,
    cannot be read, or has another format version."""
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
    """The newest checkpoint in ``directory`` that passes its check; damaged ones named, skipped."""
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


#: Legacy norm module names (``blocks.{i}.norm1`` / ``norm2``, ``norm_f``) -> position names, by
#: the placement a checkpoint trained with.
_OLD_NORM_NAMES = {
    "pre": {"norm1": "attn_in", "norm2": "mlp_in"},
    "post": {"norm1": "attn_out", "norm2": "mlp_out"},
}
_OLD_NAME = re.compile(r"^(blocks\.\d+\.)(norm1|norm2)\.|^norm_f\.")


def upgrade_model_state(state: dict[str, Any], placement: str) -> dict[str, Any]:
    """A model state dict with legacy norm names (``norm1``, ``norm2``, ``norm_f``) renamed to
    position names; raises ValueError for a post-norm one with ``norm_f`` (post-norm has none)."""
    if not any(_OLD_NAME.match(k) for k in state):
        return state
    if placement == "post" and any(k.startswith("norm_f.") for k in state):
        raise ValueError(
            "this post-norm checkpoint has a final norm (norm_f), which post-norm models no longer"
            " have: it cannot be loaded into the current model"
        )
    names = _OLD_NORM_NAMES[placement]

    def rename(key: str) -> str:
        if key.startswith("norm_f."):
            return "final." + key.removeprefix("norm_f.")
        m = _OLD_NAME.match(key)
        return key if m is None else f"{m[1]}{names[m[2]]}.{key[m.end() :]}"

    return {rename(k): v for k, v in state.items()}
