"""The norm group: which kind, implementation, placement and eps every norm of the model uses
(the choices themselves: ``norm_choices.py``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from enum import Enum
from functools import cache
from typing import Any, get_type_hints

from normlab.config import schedule
from normlab.config.base import DEFAULT_EPS, ConfigError, _as_enum, _require
from normlab.config.norm_choices import (  # noqa: F401  (re-exported: normlab.config.norm.X)
    DEFAULT_ALPHA_INIT,
    IMPLS_WITH_UPCAST_FALSE,
    KINDS_WITH_ALPHA,
    KINDS_WITH_BIAS,
    KINDS_WITHOUT_EPS,
    PLACEMENT_POSITIONS,
    WHERE_KEYS,
    NormCast,
    NormImpl,
    NormKind,
    Placement,
    QKNorm,
)


@dataclass
class NormConfig:
    """Every norm in the model (per block and final) is built from this by ``norms.build_norm``.

    ``eps`` is added to the variance (LayerNorm) or the mean square (RMSNorm) *inside* the square
    root; ``null`` means :data:`DEFAULT_EPS`. ``bias``: ``null`` is the kind's default (a bias for
    the kinds that take one, :data:`KINDS_WITH_BIAS`), resolved on construction. ``upcast``
    computes the statistics in fp32 whatever the input dtype; turning it off exists to reproduce
    low-precision failures.

    ``alpha_init`` (DyT only; null: :data:`DEFAULT_ALPHA_INIT`): the initial value of DyT's scalar
    alpha. ``zero_centered``: the weight is stored as w, initialised at 0, and applied as
    ``1 + w`` with the addition in fp32 (Gemma). ``cast``: :class:`NormCast`.

    Where the norms sit (``placement``, ``qk``, ``embedding``, ``blocks``, ``positions``): the
    other fields are the *base* norm; :meth:`at` derives the norm of one position (and block):
    the base, then ``positions.<pos>`` (its non-null keys), then the ``blocks`` schedule entry
    covering the block (kind, and impl when given; it covers every norm of the block, its qk norms
    too). Grammar and position names: :mod:`normlab.config.schedule`.
    """

    kind: NormKind = NormKind.layer
    impl: NormImpl = NormImpl.auto
    eps: float | None = None
    placement: Placement = Placement.pre
    affine: bool = True
    bias: bool | None = None
    upcast: bool = True
    # what each norm computes (norms12)
    alpha_init: float | None = None
    zero_centered: bool = False
    cast: NormCast = NormCast.before_weight
    # where the norms sit (model12)
    qk: QKNorm = QKNorm.none  # QK-norm: none | head (over head_dim) | full (over d_model)
    embedding: bool = False  # a norm after token + position embedding
    blocks: str | None = None  # block schedule, e.g. "0-2:rms/3:layer@torch"; null: none
    positions: NormPositions = field(default_factory=lambda: NormPositions())

    def __post_init__(self) -> None:
        self._check_options()
        if self.eps is not None:
            _require(
                math.isfinite(self.eps) and self.eps > 0,
                "norm.eps",
                self.eps,
                "must be a finite number > 0 (or null for the default 1e-5)",
            )
        has_bias = self.kind in KINDS_WITH_BIAS
        if self.bias is None:
            self.bias = has_bias and self.affine
        _require(
            has_bias or not self.bias,
            "norm.bias",
            self.bias,
            f"norm.kind={self.kind.name} has no bias (use norm.bias=null or false)",
        )
        _require(self.affine or not self.bias, "norm.bias", True, "a bias needs norm.affine=true")
        # Kernels that accumulate in fp32 anyway would silently ignore upcast=false: refused.
        ok = ", ".join(i.name for i in IMPLS_WITH_UPCAST_FALSE)
        _require(
            self.upcast or self.impl in IMPLS_WITH_UPCAST_FALSE,
            "norm.upcast",
            False,
            f"upcast=false is only available for impl={ok}, not impl={self.impl.name}",
        )
        self._check_where()

    def _check_options(self) -> None:
        """alpha_init, zero_centered, cast and eps against the kind (one line each)."""
        name = self.kind.name
        _require(
            self.eps is None or self.kind not in KINDS_WITHOUT_EPS,
            "norm.eps",
            self.eps,
            f"norm.kind={name} has no statistic, so no eps (use norm.eps=null)",
        )
        if self.alpha_init is not None:
            _require(
                self.kind in KINDS_WITH_ALPHA,
                "norm.alpha_init",
                self.alpha_init,
                f"only norm.kind={'|'.join(k.name for k in KINDS_WITH_ALPHA)} has an alpha "
                f"(use norm.alpha_init=null with norm.kind={name})",
            )
            _require(
                math.isfinite(self.alpha_init) and self.alpha_init > 0,
                "norm.alpha_init",
                self.alpha_init,
                f"must be a finite number > 0 (or null for the default {DEFAULT_ALPHA_INIT})",
            )
        _require(
            self.affine or not self.zero_centered,
            "norm.zero_centered",
            True,
            "a zero-centred weight needs norm.affine=true",
        )
        if not self.upcast and self.cast != NormCast.before_weight:
            raise ConfigError(
                f"norm.cast={self.cast.name} is not allowed: it needs norm.upcast=true (with "
                "upcast=false nothing is computed in fp32; allowed: before_weight)"
            )

    @property
    def resolved_alpha_init(self) -> float | None:
        """DyT's initial alpha: ``alpha_init`` or :data:`DEFAULT_ALPHA_INIT`; None for kinds
        without an alpha."""
        if self.kind not in KINDS_WITH_ALPHA:
            return None
        return DEFAULT_ALPHA_INIT if self.alpha_init is None else float(self.alpha_init)

    @property
    def resolved_eps(self) -> float:
        """The eps actually used: ``eps`` or :data:`DEFAULT_EPS` when null."""
        return DEFAULT_EPS if self.eps is None else float(self.eps)

    def _check_where(self) -> None:
        """Validate the where-the-norms-sit keys (the schedule's block indices: :meth:`check`)."""
        self.placement = _as_enum(Placement, self.placement, "norm.placement")
        self.qk = _as_enum(QKNorm, self.qk, "norm.qk")
        if not isinstance(self.positions, NormPositions):
            self.positions = _positions(self.positions)
        self.schedule  # noqa: B018  (parses, raising on a malformed schedule)
        used = self.used_positions()
        for pos in schedule.POSITIONS:
            if _overrides(self.positions, pos):
                _require(
                    pos in used,
                    f"norm.positions.{pos}",
                    _overrides(self.positions, pos),
                    f"this model has no {pos} norm with norm.placement={self.placement.name}, "
                    f"norm.qk={self.qk.name}, norm.embedding={str(self.embedding).lower()}; "
                    f"its norms: {', '.join(used)}",
                )
                self.at(pos)

    @property
    def schedule(self) -> list[schedule.ScheduleEntry]:
        """``blocks`` parsed (sorted by first block); [] when null."""
        return schedule.parse_blocks(
            self.blocks, list(NormKind.__members__), list(NormImpl.__members__)
        )

    def used_positions(self) -> tuple[str, ...]:
        """The positions this model has, in :data:`schedule.POSITIONS` order."""
        inner = PLACEMENT_POSITIONS[self.placement]
        has = set(inner) | ({"qk"} if self.qk != QKNorm.none else set())
        has |= {"embedding"} if self.embedding else set()
        has |= set() if self.placement == Placement.post else {"final"}
        return tuple(p for p in schedule.POSITIONS if p in has)

    def check(self, n_layer: int) -> None:
        """Check the schedule against ``n_layer`` blocks and derive every norm once.

        Raises:
            ConfigError: a block index out of range, or a derived norm that is not valid.
        """
        entries = self.schedule
        schedule.check_block_range(self.blocks, entries, n_layer)
        for e in entries:
            for pos in self.used_positions():
                if pos in schedule.BLOCK_POSITIONS:
                    self.at(pos, e.start)

    def at(self, position: str, block: int | None = None) -> NormConfig:
        """The norm config of ``position`` (in block ``block``; None for embedding/final).

        Rebuilt from raw values, so every ``__post_init__`` rule applies again: ``bias`` equal to
        the base kind's default counts as null (the derived kind's default); a derived config
        keeps no position overrides or schedule of its own.

        Raises:
            ConfigError: an unknown position, or a derived value that is not valid, naming where.
        """
        _require(
            position in schedule.POSITIONS,
            "norm position",
            position,
            f"allowed: {', '.join(schedule.POSITIONS)}",
        )
        raw = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in WHERE_KEYS}
        if raw["bias"] == ((self.kind in KINDS_WITH_BIAS) and self.affine):
            raw["bias"] = None
        hints = _hints()
        where = f"norm.positions.{position}"
        for key, v in _overrides(self.positions, position).items():
            hint = hints[key]
            is_enum = isinstance(hint, type) and issubclass(hint, Enum)
            raw[key] = _as_enum(hint, v, f"{where}.{key}") if is_enum else v
        entry = schedule.entry_for(self.schedule, block) if block is not None else None
        if entry is not None and position in schedule.BLOCK_POSITIONS:
            where = f"norm.blocks={self.blocks!r} (block {block}, {position})"
            raw["kind"] = NormKind[entry.kind]
            if entry.impl is not None:
                raw["impl"] = NormImpl[entry.impl]
        try:
            return NormConfig(**raw, placement=self.placement)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


@cache
def _hints() -> dict[str, Any]:
    return get_type_hints(NormConfig)


#: One position's partial override: every NormConfig field but :data:`WHERE_KEYS`, null = inherit.
#: Generated from NormConfig's fields, so a new norm option is overridable per position as it is.
NormOverride = make_dataclass(
    "NormOverride",
    [(f.name, Any, field(default=None)) for f in fields(NormConfig) if f.name not in WHERE_KEYS],
)
NormOverride.__module__ = __name__
NormOverride.__doc__ = (
    "Partial NormConfig for one position (``norm.positions.final.kind=rms``). "
    + " / ".join(f"``{f.name}``" for f in fields(NormOverride))
    + ": this position's own value of that norm key (null: the base norm's, then the block"
    " schedule's kind and impl)."
)

#: ``norm.positions``: one :data:`NormOverride` per position name (:data:`schedule.POSITIONS`).
NormPositions = make_dataclass(
    "NormPositions",
    [(p, NormOverride, field(default_factory=NormOverride)) for p in schedule.POSITIONS],
)
NormPositions.__module__ = __name__
NormPositions.__doc__ = "Per-position norm overrides, keyed by position name."


def _overrides(positions: Any, position: str) -> dict[str, Any]:
    """The non-null keys of ``positions.<position>``."""
    return {k: v for k, v in asdict(getattr(positions, position)).items() if v is not None}


def _positions(values: Any) -> Any:
    """``norm.positions`` from plain data (a checkpoint's config, Python callers)."""
    allowed = ", ".join(schedule.POSITIONS)
    _require(isinstance(values, dict), "norm.positions", values, f"a mapping of {allowed}")
    keys = [f.name for f in fields(NormOverride)]
    built = {}
    for pos, over in values.items():
        _require(pos in schedule.POSITIONS, "norm.positions", pos, f"allowed: {allowed}")
        if over is None or hasattr(over, "__dataclass_fields__"):
            over = {} if over is None else asdict(over)
        for k in over:
            _require(k in keys, f"norm.positions.{pos}", k, f"allowed keys: {', '.join(keys)}")
        built[pos] = NormOverride(**over)
    return NormPositions(**built)
