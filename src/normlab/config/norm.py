"""The norm group: which kind, implementation, placement and eps every norm of the model uses.

The choices (kinds, implementations, cast orders, placements) and every fact about them live in
the norm table (``norm_table.py``); this module validates a norm against it.

Why: docs/norms.md
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from functools import cache
from typing import Any, get_type_hints

from normlab.config import schedule
from normlab.config.base import DEFAULT_EPS, ConfigError, _as_enum, _require
from normlab.config.norm_table import (
    DEFAULT_ALPHA_INIT,
    DEFAULT_GATE_RANK,
    KINDS,
    PLACEMENT_POSITIONS,
    STREAM_NORMED,
    WHERE_KEYS,
    NormCast,
    NormImpl,
    NormKind,
    Placement,
    QKNorm,
)


@dataclass
class NormOverride:
    """One position's partial ``NormConfig`` (``norm.positions.final.kind=rms``): every key but
    ``WHERE_KEYS``, null inheriting the base norm's (then the schedule's kind and impl); values as
    typed, checked when the position's norm is derived (``NormConfig.at``)."""

    kind: Any = None  # this position's norm.kind (null: the base norm's, then the schedule's)
    impl: Any = None  # this position's norm.impl (null: the base norm's, then the schedule's)
    eps: Any = None  # this position's norm.eps (null: the base norm's)
    affine: Any = None  # this position's norm.affine (null: the base norm's)
    bias: Any = None  # this position's norm.bias (null: the base norm's)
    upcast: Any = None  # this position's norm.upcast (null: the base norm's)
    alpha_init: Any = None  # this position's norm.alpha_init (null: the base norm's)
    gate_rank: Any = None  # this position's norm.gate_rank (null: the base norm's)
    zero_centered: Any = None  # this position's norm.zero_centered (null: the base norm's)
    cast: Any = None  # this position's norm.cast (null: the base norm's)


@dataclass
class NormPositions:
    """``norm.positions``: one ``NormOverride`` per position name (``schedule.POSITIONS``)."""

    attn_in: NormOverride = field(default_factory=NormOverride)
    attn_out: NormOverride = field(default_factory=NormOverride)
    mlp_in: NormOverride = field(default_factory=NormOverride)
    mlp_out: NormOverride = field(default_factory=NormOverride)
    qk: NormOverride = field(default_factory=NormOverride)
    embedding: NormOverride = field(default_factory=NormOverride)
    final: NormOverride = field(default_factory=NormOverride)


def _kinds_reading(option: str) -> list[str]:
    """The kinds whose ``Kind.options`` list ``option`` (DyT for ``alpha_init``)."""
    return [k.name for k, spec in KINDS.items() if option in spec.options]


#: The option fields a kind may or may not read (``Kind.options``): null unless the kind reads it.
KIND_OPTIONS = ("alpha_init", "gate_rank")


@dataclass
class NormConfig:
    """Every norm in the model is built from this by ``norms.build_norm``; checked on construction.

    The fields but ``WHERE_KEYS`` are the base norm (``eps`` inside the square root, null:
    ``DEFAULT_EPS``; ``bias`` null: the kind's default). ``at`` derives one position's (and
    block's) norm: the base, then ``positions.<pos>``, then the ``blocks`` entry covering the
    block. Which implementation honours which option is the norm table's (``Impl``):
    ``norms.resolve_norm`` refuses an explicit one that does not, and resolves ``auto``.
    LayerNorm Scaling (``depth_scale``): Sun et al. 2025. Mix-LN (``mix_ln``): Li et al. 2024.
    """

    kind: NormKind = NormKind.layer
    impl: NormImpl = NormImpl.auto
    eps: float | None = None
    placement: Placement = Placement.pre
    affine: bool = True
    bias: bool | None = None
    upcast: bool = True
    # what each norm computes
    alpha_init: float | None = None  # DyT's and Derf's initial alpha (null: 0.5); dyt or derf only
    gate_rank: int | None = None  # GatedNorm's gate rank r (null: 16); only with norm.kind=gated
    zero_centered: bool = False
    cast: NormCast = NormCast.before_weight
    # where the norms sit
    qk: QKNorm = QKNorm.none  # QK-norm: none | head (over head_dim) | full (over d_model)
    embedding: bool = False  # a norm after token + position embedding
    depth_scale: bool = False  # LayerNorm Scaling: input norms of block l (1-based) x 1/sqrt(l)
    mix_ln: float | None = None  # Mix-LN: the first floor(mix_ln * n_layer) blocks post-norm
    blocks: str | None = None  # block schedule, e.g. "0-2:rms/3:layer@torch"; null: none
    positions: NormPositions = field(default_factory=lambda: NormPositions())

    def __post_init__(self) -> None:
        self.kind = _as_enum(NormKind, self.kind, "norm.kind")
        self.impl = _as_enum(NormImpl, self.impl, "norm.impl")
        self.cast = _as_enum(NormCast, self.cast, "norm.cast")
        self._check_options()
        has_bias = KINDS[self.kind].bias
        if self.bias is None:
            self.bias = has_bias and self.affine
        _require(
            has_bias or not self.bias,
            "norm.bias",
            self.bias,
            f"norm.kind={self.kind.name} has no bias (use norm.bias=null or false)",
        )
        _require(self.affine or not self.bias, "norm.bias", True, "a bias needs norm.affine=true")
        self._check_where()

    def _check_options(self) -> None:
        """eps, alpha_init, zero_centered and cast against the kind (one line each)."""
        name = self.kind.name
        _require(
            self.eps is None or KINDS[self.kind].takes_eps,
            "norm.eps",
            self.eps,
            f"norm.kind={name} has no statistic, so no eps (use norm.eps=null)",
        )
        if self.eps is not None:
            _require(
                math.isfinite(self.eps) and self.eps > 0,
                "norm.eps",
                self.eps,
                "must be a finite number > 0 (or null for the default 1e-5)",
            )
        if self.alpha_init is not None:
            _require(
                "alpha_init" in KINDS[self.kind].options,
                "norm.alpha_init",
                self.alpha_init,
                f"only norm.kind={'|'.join(_kinds_reading('alpha_init'))} has an alpha "
                f"(use norm.alpha_init=null with norm.kind={name})",
            )
            _require(
                math.isfinite(self.alpha_init) and self.alpha_init > 0,
                "norm.alpha_init",
                self.alpha_init,
                f"must be a finite number > 0 (or null for the default {DEFAULT_ALPHA_INIT})",
            )
        if self.gate_rank is not None:
            self._check_gate_rank()
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

    def _check_gate_rank(self) -> None:
        """gate_rank: read by this kind, an integer >= 1 (one line each)."""
        _require(
            "gate_rank" in KINDS[self.kind].options,
            "norm.gate_rank",
            self.gate_rank,
            f"only norm.kind={'|'.join(_kinds_reading('gate_rank'))} has a gate "
            f"(use norm.gate_rank=null with norm.kind={self.kind.name})",
        )
        _require(
            isinstance(self.gate_rank, int)
            and not isinstance(self.gate_rank, bool)
            and self.gate_rank >= 1,
            "norm.gate_rank",
            self.gate_rank,
            f"must be an integer >= 1 (or null for the default {DEFAULT_GATE_RANK})",
        )

    @property
    def resolved_gate_rank(self) -> int | None:
        """GatedNorm's gate rank: ``gate_rank`` or ``DEFAULT_GATE_RANK``; None for other kinds."""
        if "gate_rank" not in KINDS[self.kind].options:
            return None
        return DEFAULT_GATE_RANK if self.gate_rank is None else int(self.gate_rank)

    @property
    def resolved_alpha_init(self) -> float | None:
        """The initial alpha: ``alpha_init`` or ``DEFAULT_ALPHA_INIT``; None without an alpha."""
        if "alpha_init" not in KINDS[self.kind].options:
            return None
        return DEFAULT_ALPHA_INIT if self.alpha_init is None else float(self.alpha_init)

    @property
    def resolved_eps(self) -> float:
        """The eps actually used: ``eps`` or ``DEFAULT_EPS`` when null."""
        return DEFAULT_EPS if self.eps is None else float(self.eps)

    def _check_where(self) -> None:
        """Validate the where-the-norms-sit keys (the schedule's block indices: ``check``)."""
        self.placement = _as_enum(Placement, self.placement, "norm.placement")
        self.qk = _as_enum(QKNorm, self.qk, "norm.qk")
        inputs = {"attn_in", "mlp_in"} & set(PLACEMENT_POSITIONS[self.placement])
        _require(
            inputs or not self.depth_scale,
            "norm.depth_scale",
            True,
            f"it scales the input norms (attn_in, mlp_in), and norm.placement="
            f"{self.placement.name} has none (use pre or peri)",
        )
        self._check_designs()
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

    def _check_designs(self) -> None:
        """Mix-LN's fraction and HybridNorm's own QKV-norm (one line each)."""
        if self.mix_ln is not None:
            _require(
                isinstance(self.mix_ln, (int, float))
                and not isinstance(self.mix_ln, bool)
                and 0 < self.mix_ln < 1,
                "norm.mix_ln",
                self.mix_ln,
                "must be a fraction of the blocks, 0 < mix_ln < 1 (e.g. 0.25; null: no Mix-LN; "
                "1 is norm.placement=post)",
            )
            _require(
                self.placement == Placement.pre,
                "norm.mix_ln",
                self.mix_ln,
                f"Mix-LN puts post-norm blocks before pre-norm ones, so it needs "
                f"norm.placement=pre (got {self.placement.name})",
            )
        _require(
            self.placement != Placement.hybrid or self.qk == QKNorm.none,
            "norm.qk",
            self.qk.name,
            "norm.placement=hybrid normalizes q, k and v itself (per head); use norm.qk=none",
        )
        _require(
            self.placement != Placement.hybrid or not self.depth_scale,
            "norm.depth_scale",
            True,
            "norm.placement=hybrid's mlp_in norm carries the residual stream, so scaling it would "
            "scale the stream (use pre or peri)",
        )

    @property
    def schedule(self) -> list[schedule.ScheduleEntry]:
        """``blocks`` parsed (sorted by first block); [] when null."""
        return schedule.parse_blocks(
            self.blocks, list(NormKind.__members__), list(NormImpl.__members__)
        )

    def used_positions(self) -> tuple[str, ...]:
        """The positions this model has (in any block), in ``schedule.POSITIONS`` order; no final
        norm when the last block (always ``placement``) is ``STREAM_NORMED`` (post, deepnorm)."""
        inner = set(PLACEMENT_POSITIONS[self.placement])
        inner |= set(PLACEMENT_POSITIONS[Placement.post]) if self.mix_ln is not None else set()
        has = inner | ({"qk"} if self.qk != QKNorm.none else set())
        has |= {"embedding"} if self.embedding else set()
        has |= set() if self.placement in STREAM_NORMED else {"final"}
        return tuple(p for p in schedule.POSITIONS if p in has)

    def post_blocks(self, n_layer: int) -> int:
        """How many blocks, from the first, Mix-LN makes post-norm: ``floor(mix_ln * n_layer)``
        (0 without ``mix_ln``; the product rounded to 1e-9 first, so 0.3 x 10 gives 3)."""
        if self.mix_ln is None:
            return 0
        return math.floor(round(self.mix_ln * n_layer, 9))

    def placement_at(self, block: int, n_layer: int) -> Placement:
        """Block ``block``'s placement: post in Mix-LN's first blocks, else ``placement``."""
        return Placement.post if block < self.post_blocks(n_layer) else self.placement

    def block_positions(self, block: int, n_layer: int) -> tuple[str, ...]:
        """The norm positions block ``block`` has, in ``schedule.BLOCK_POSITIONS`` order."""
        has = set(PLACEMENT_POSITIONS[self.placement_at(block, n_layer)])
        has |= {"qk"} if self.qk != QKNorm.none else set()
        return tuple(p for p in schedule.BLOCK_POSITIONS if p in has)

    def check(self, n_layer: int) -> None:
        """Check the schedule against ``n_layer`` blocks and derive every norm once; ConfigError: a
        block out of range, a ``mix_ln`` with no post-norm block, an invalid derived norm."""
        schedule.check_block_range(self.blocks, self.schedule, n_layer)
        if self.mix_ln is not None:
            _require(
                self.post_blocks(n_layer) >= 1,
                "norm.mix_ln",
                self.mix_ln,
                f"floor({self.mix_ln} x model.n_layer={n_layer}) = 0 post-norm blocks; use at "
                f"least {1 / n_layer:g} with {n_layer} blocks (or null for pre-norm)",
            )
        self.derived()

    def derived(self) -> list[tuple[str, NormConfig]]:
        """Every distinct norm the model builds, with where it sits: ``("norm", base)``, then each
        position's and schedule entry's, as ``at`` derives them; ConfigError naming where."""
        out: list[tuple[str, NormConfig]] = [("norm", self)]
        for pos in self.used_positions():
            if _overrides(self.positions, pos):
                out.append((f"norm.positions.{pos}", self.at(pos)))
            if pos not in schedule.BLOCK_POSITIONS:
                continue
            for e in self.schedule:
                out.append(
                    (f"norm.blocks={self.blocks!r} (block {e.start}, {pos})", self.at(pos, e.start))
                )
        return out

    def at(self, position: str, block: int | None = None) -> NormConfig:
        """The norm config of ``position`` (in ``block``; None for embedding/final), rebuilt from
        raw values so every rule applies again, without overrides or schedule of its own;
        ConfigError naming where for an unknown position or an invalid value."""
        _require(
            position in schedule.POSITIONS,
            "norm position",
            position,
            f"allowed: {', '.join(schedule.POSITIONS)}",
        )
        raw = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in WHERE_KEYS}
        if raw["bias"] == (KINDS[self.kind].bias and self.affine):
            raw["bias"] = None  # the base kind's default: the derived kind's default
        hints = _hints()
        where = f"norm.positions.{position}"
        own = _overrides(self.positions, position)
        for key, v in own.items():
            hint = hints[key]
            is_enum = isinstance(hint, type) and issubclass(hint, Enum)
            raw[key] = _as_enum(hint, v, f"{where}.{key}") if is_enum else v
        entry = schedule.entry_for(self.schedule, block) if block is not None else None
        if entry is not None and position in schedule.BLOCK_POSITIONS:
            where = f"norm.blocks={self.blocks!r} (block {block}, {position})"
            raw["kind"] = NormKind[entry.kind]
            if entry.impl is not None:
                raw["impl"] = NormImpl[entry.impl]
        spec = KINDS[raw["kind"]]
        for key in ("eps", *KIND_OPTIONS):  # inherited values the derived kind has no use for
            takes = spec.takes_eps if key == "eps" else key in spec.options
            if key not in own and not takes:
                raw[key] = None
        try:
            return NormConfig(**raw, placement=self.placement)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


@cache
def _hints() -> dict[str, Any]:
    return get_type_hints(NormConfig)


def _overrides(positions: NormPositions, position: str) -> dict[str, Any]:
    """The non-null keys of ``positions.<position>``."""
    return {k: v for k, v in asdict(getattr(positions, position)).items() if v is not None}


def _positions(values: Any) -> NormPositions:
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
