"""Where the norms sit: the position names, the block-schedule grammar, and the short design tag
that run names, wandb names, sweep dirs and report labels use. No torch; pure string work.

Positions: ``attn_in`` / ``mlp_in`` (a branch's input), ``attn_out`` / ``mlp_out`` (a branch's
output, or the sum after it under post), ``qk`` (q and k; v too under hybrid), ``embedding``,
``final``. ``norm.blocks``: entries ``N:kind``, ``N-M:kind`` or ``N-M:kind@impl`` (0-based,
inclusive, not overlapping) joined by ``/``, so a Hydra sweep holds schedules unquoted.

Why: docs/norms.md
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from normlab.config.base import ConfigError

#: Every norm position of the model, in depth order within a block, then the model-level ones.
BLOCK_POSITIONS = ("attn_in", "attn_out", "mlp_in", "mlp_out", "qk")
POSITIONS = (*BLOCK_POSITIONS, "embedding", "final")

_ENTRY = re.compile(r"^(\d+)(?:-(\d+))?:([A-Za-z_]\w*)(?:@([A-Za-z_]\w*))?$")


@dataclass(frozen=True)
class ScheduleEntry:
    """Blocks ``start..stop`` (inclusive) use ``kind`` (and ``impl`` when given; names as typed)."""

    start: int
    stop: int
    kind: str
    impl: str | None

    def __str__(self) -> str:
        span = str(self.start) if self.start == self.stop else f"{self.start}-{self.stop}"
        return f"{span}:{self.kind}" + (f"@{self.impl}" if self.impl else "")


def parse_blocks(text: str | None, kinds: list[str], impls: list[str]) -> list[ScheduleEntry]:
    """Parse a ``norm.blocks`` schedule (module docstring) against the allowed ``kinds`` and
    ``impls``; None or "" -> []. ConfigError (one line): malformed, unknown name, N > M, overlap."""
    if text is None or not str(text).strip():
        return []
    entries: list[ScheduleEntry] = []
    for raw in str(text).split("/"):
        part = raw.strip()
        m = _ENTRY.match(part)
        if m is None:
            raise ConfigError(
                f"norm.blocks={text!r} is not allowed: entry {part!r} is not N:kind, N-M:kind or "
                "N-M:kind@impl (0-based inclusive block ranges, entries joined by '/', "
                "e.g. 0-2:rms/3:layer)"
            )
        start, stop = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if stop < start:
            raise ConfigError(
                f"norm.blocks={text!r} is not allowed: range {start}-{stop} ends before it starts"
            )
        if m[3] not in kinds:
            raise ConfigError(
                f"norm.blocks={text!r} is not allowed: unknown kind {m[3]!r}; "
                f"allowed: {', '.join(kinds)}"
            )
        if m[4] is not None and m[4] not in impls:
            raise ConfigError(
                f"norm.blocks={text!r} is not allowed: unknown impl {m[4]!r}; "
                f"allowed: {', '.join(impls)}"
            )
        entry = ScheduleEntry(start, stop, m[3], m[4])
        for other in entries:
            if entry.start <= other.stop and other.start <= entry.stop:
                raise ConfigError(
                    f"norm.blocks={text!r} is not allowed: ranges {other} and {entry} overlap"
                )
        entries.append(entry)
    return sorted(entries, key=lambda e: e.start)


def check_block_range(text: str | None, entries: list[ScheduleEntry], n_layer: int) -> None:
    """Raise ConfigError when an entry names a block outside ``0..n_layer-1``."""
    for e in entries:
        if e.stop >= n_layer:
            raise ConfigError(
                f"norm.blocks={text!r} is not allowed: block {e.stop} is out of range for "
                f"model.n_layer={n_layer} (blocks 0-{n_layer - 1})"
            )


def entry_for(entries: list[ScheduleEntry], block: int) -> ScheduleEntry | None:
    """The schedule entry covering ``block``, or None (the block keeps the base norm)."""
    return next((e for e in entries if e.start <= block <= e.stop), None)


#: A block's norm names in ``diag/`` keys, in execution order (each placement uses a subset);
#: the qk position has two norms, one on queries and one on keys, and under HybridNorm
#: (``norm.placement=hybrid``) a third on values.
DIAG_BLOCK_NORMS = ("attn_in", "qk_q", "qk_k", "qk_v", "attn_out", "mlp_in", "mlp_out")


def diag_norm_names(n_layer: int) -> list[str]:
    """Every norm's name in ``diag/`` keys, in depth order: ``embedding/norm``,
    ``block{i}/<DIAG_BLOCK_NORMS>`` for each block, ``final/norm`` (a model has a subset)."""
    blocks = [f"block{i}/{n}" for i in range(n_layer) for n in DIAG_BLOCK_NORMS]
    return ["embedding/norm", *blocks, "final/norm"]


def _value(v: object) -> str:
    return v.name if hasattr(v, "name") and not isinstance(v, str) else str(v)


#: The ``norm`` keys that ``norm_tag`` shows (``impl`` when asked): a swept one is named by the
#: tag, so a run label need not repeat it (``training.tracking.variant_label``).
TAG_KEYS = (
    "kind", "blocks", "impl", "placement", "mix_ln", "qk", "embedding", "depth_scale", "positions"
)  # fmt: skip


def norm_tag(norm: dict, impl: bool = False, path_safe: bool = False) -> str:
    """A short name for the norm design of a plain ``norm`` config (as in summary.json), joined by
    ``-``: ``kind[schedule]``, impl (when ``impl``), placement or ``mixln<alpha>``, ``qkhead`` /
    ``qkfull``, ``emb``, ``ds``, each override ``pos:kind`` / ``pos:key=value``; e.g.
    ``layer[0-1:rms]-cpp-post-emb-final:rms``. ``path_safe``: ``/`` becomes ``+``."""
    kind = _value(norm.get("kind"))
    blocks = norm.get("blocks")
    parts = [kind + (f"[{blocks}]" if blocks else "")]
    if impl:
        parts.append(_value(norm.get("impl")))
    mix_ln = norm.get("mix_ln")
    placement = _value(norm.get("placement", "pre"))
    parts.append(placement if mix_ln is None else f"mixln{float(mix_ln):g}")
    qk = _value(norm.get("qk", "none"))
    if qk != "none":
        parts.append(f"qk{qk}")
    if norm.get("embedding"):
        parts.append("emb")
    if norm.get("depth_scale"):
        parts.append("ds")
    for pos, over in sorted((norm.get("positions") or {}).items()):
        for key, v in sorted((over or {}).items()):
            if v is not None:
                parts.append(f"{pos}:{_value(v)}" if key == "kind" else f"{pos}:{key}={_value(v)}")
    tag = "-".join(parts)
    return tag.replace("/", "+") if path_safe else tag
