"""The model, precision, optim and logger groups, the whole run (``TrainConfig``) and the
invocation (``RunOptions``, ``CliConfig``).

Why: docs/running.md
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum

from normlab.config.base import _as_enum, _require
from normlab.config.data import DataConfig
from normlab.config.norm import NormConfig


class Precision(Enum):
    """Autocast dtype for the forward pass; parameters and optimizer state stay fp32."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class OptimName(Enum):
    """Which optimizer; AdamW (Loshchilov & Hutter 2019) is the only one."""

    adamw = "adamw"


class NormWeightDecay(Enum):
    """Which norm gains (a norm module's ``weight``) get ``optim.weight_decay``
    (``optim.norm_weight_decay``); biases and every other 1-D parameter never do."""

    none = "none"  # no norm gain decays
    all = "all"  # every norm gain decays
    # the input norms' gains only: attn_in and mlp_in, the pre-norms that feed a sublayer (pre and
    # peri placement); not the output norms (attn_out, mlp_out, final), the QK-norms (inside
    # attention: their gain is a logit temperature) or the embedding norm (it feeds the stream)
    input_only = "input_only"


class LrSchedule(Enum):
    """The learning rate after warm-up (``optim.schedule``): ``cosine`` decays to ``min_lr`` over
    the whole run (Loshchilov & Hutter 2017); ``wsd`` (Hu et al. 2024, arXiv:2404.06395) holds
    ``lr`` and decays over the last ``decay_fraction`` of the steps."""

    cosine = "cosine"
    wsd = "wsd"


class DecayShape(Enum):
    """How ``wsd`` decays from ``lr`` to ``min_lr`` as its progress p goes from 0 to 1
    (``optim.decay_shape``); ``sqrt`` is the "1-sqrt" cool-down that Hägele et al. 2024
    (arXiv:2405.18392) found best."""

    sqrt = "sqrt"  # lr factor 1 - sqrt(p)
    linear = "linear"  # 1 - p
    cosine = "cosine"  # (1 + cos(pi p)) / 2


class LoggerKind(Enum):
    wandb = "wandb"
    none = "none"


class WandbMode(Enum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass
class ModelConfig:
    """GPT shape. ``context_length`` is the number of positions (tokens per training sequence).

    ``embedding_scale`` (Zhu et al. 2025, section 7): a learnable scalar on the embedding;
    ``false``: none; ``true``: initialised at sqrt(d_model); a number > 0: initialised there.
    """

    name: str = "gpt2_small"
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    context_length: int = 1024
    vocab_size: int | None = None  # null: taken from the tokenizer (256 for bytes)
    dropout: float = 0.0
    linear_bias: bool = True
    tie_head: bool = True  # the output head shares the token embedding (Press & Wolf 2017)
    embedding_scale: bool | int | float = False  # embedding x learnable scalar: false|true|init

    def __post_init__(self) -> None:
        _require(self.n_layer >= 1, "model.n_layer", self.n_layer, "must be >= 1")
        _require(self.n_head >= 1, "model.n_head", self.n_head, "must be >= 1")
        _require(self.d_model >= 1, "model.d_model", self.d_model, "must be >= 1")
        _require(
            self.d_model % self.n_head == 0,
            "model.d_model",
            self.d_model,
            f"must be divisible by model.n_head={self.n_head}",
        )
        _require(
            self.context_length >= 2, "model.context_length", self.context_length, "must be >= 2"
        )
        _require(
            self.vocab_size is None or self.vocab_size >= 2,
            "model.vocab_size",
            self.vocab_size,
            "must be null (from the tokenizer) or >= 2",
        )
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "must be in [0, 1)")
        scale = self.embedding_scale
        _require(
            isinstance(scale, bool)
            or (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0),
            "model.embedding_scale",
            scale,
            "false (none), true (a learnable scalar initialised at sqrt(d_model)) or a finite "
            "number > 0 (its initial value)",
        )

    @property
    def resolved_embedding_scale(self) -> float | None:
        """The embedding scalar's initial value: None (``false``: no scalar), ``sqrt(d_model)``
        (``true``) or the number given."""
        if self.embedding_scale is False:
            return None
        if self.embedding_scale is True:
            return math.sqrt(self.d_model)
        return float(self.embedding_scale)


@dataclass
class PrecisionConfig:
    """``dtype`` is the autocast dtype; fp16 also turns on a gradient scaler (``init_scale``)."""

    dtype: Precision = Precision.fp32
    init_scale: float = 65536.0  # fp16: the grad scaler's first loss scale

    def __post_init__(self) -> None:
        _require(self.init_scale > 0, "precision.init_scale", self.init_scale, "must be > 0")


@dataclass
class OptimConfig:
    """AdamW (Loshchilov & Hutter 2019) with linear warm-up then cosine decay to ``min_lr``, or
    warm-up, stable ``lr`` and a decay over the last ``decay_fraction`` of the steps (``wsd``).

    ``anneal_at`` (wsd only): budgets as fractions of ``max_steps``; each is evaluated on a
    cool-down branch of the main run (``training/anneal.py``; ``budgets`` gives the steps).
    """

    name: OptimName = OptimName.adamw  # the optimizer (adamw only)
    lr: float = 6e-4  # peak learning rate, after warm-up
    min_lr: float = 6e-5  # learning rate at the end of the decay
    weight_decay: float = 0.1  # on matrices; see norm_weight_decay for the norm gains
    norm_weight_decay: NormWeightDecay = NormWeightDecay.none  # which norm gains decay too
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.95  # AdamW second-moment decay
    eps: float = 1e-8  # AdamW denominator eps (not the norms' eps)
    warmup_steps: int = 100  # linear warm-up steps from lr/warmup_steps to lr
    decay: bool = True  # decay to min_lr as the schedule says; false keeps lr constant
    grad_clip: float = 1.0  # max global grad norm; 0 turns clipping off
    grad_accum: int = 1
    schedule: LrSchedule = LrSchedule.cosine  # after warm-up: cosine, or wsd (stable, then decay)
    decay_fraction: float = 0.2  # wsd: the fraction of a budget's steps spent decaying, in (0, 1]
    decay_shape: DecayShape = DecayShape.sqrt  # wsd: the decay's shape: sqrt, linear or cosine
    anneal_at: list[float] = field(default_factory=list)  # wsd: budgets (of max_steps) annealed

    def __post_init__(self) -> None:
        self.name = _as_enum(OptimName, self.name, "optim.name")
        self.norm_weight_decay = _as_enum(
            NormWeightDecay, self.norm_weight_decay, "optim.norm_weight_decay"
        )
        self.schedule = _as_enum(LrSchedule, self.schedule, "optim.schedule")
        self.decay_shape = _as_enum(DecayShape, self.decay_shape, "optim.decay_shape")
        self._check_wsd()
        _require(
            math.isfinite(self.lr) and self.lr > 0,
            "optim.lr",
            self.lr,
            "must be a finite number > 0",
        )
        _require(
            0 <= self.min_lr <= self.lr,
            "optim.min_lr",
            self.min_lr,
            f"must be in [0, optim.lr={self.lr}]",
        )
        _require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        _require(0 <= self.beta1 < 1, "optim.beta1", self.beta1, "must be in [0, 1)")
        _require(0 <= self.beta2 < 1, "optim.beta2", self.beta2, "must be in [0, 1)")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")
        _require(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "must be >= 0 (0 = off)")
        _require(self.grad_accum >= 1, "optim.grad_accum", self.grad_accum, "must be >= 1")

    def _check_wsd(self) -> None:
        """``decay_fraction`` in (0, 1]; ``anneal_at`` increasing fractions in (0, 1), with
        ``schedule=wsd`` and ``decay=true`` only (``TrainConfig._check_anneal`` needs
        ``max_steps``)."""
        frac = self.decay_fraction
        ok = math.isfinite(frac) and 0 < frac <= 1
        _require(ok, "optim.decay_fraction", frac, "must be in (0, 1] (of a budget's steps)")
        at = [float(f) for f in self.anneal_at]
        _require(
            all(0 < f < 1 for f in at) and all(a < b for a, b in zip(at, at[1:], strict=False)),
            "optim.anneal_at",
            at,
            "must be distinct fractions of max_steps in (0, 1), increasing, e.g. [0.25,0.5,0.75]",
        )
        _require(
            not at or self.schedule == LrSchedule.wsd,
            "optim.anneal_at",
            at,
            f"needs optim.schedule=wsd (a cool-down branch leaves a stable phase; got "
            f"optim.schedule={self.schedule.name})",
        )
        _require(
            not at or self.decay,
            "optim.anneal_at",
            at,
            "needs optim.decay=true (without a decay a branch is the main run itself)",
        )
        self.anneal_at = at

    def decay_start(self, max_steps: int) -> int:
        """wsd: steps before the decay, ``D = max_steps - round(decay_fraction * max_steps)``."""
        return max_steps - round(self.decay_fraction * max_steps)

    def budgets(self, max_steps: int) -> list[tuple[int, int]]:
        """``(T, D)`` per ``anneal_at`` fraction f: the budget ``T = round(f * max_steps)`` steps
        and its branch point ``D = decay_start(T)`` (the branch runs steps ``D..T-1``)."""
        out = []
        for f in self.anneal_at:
            budget = round(f * max_steps)
            out.append((budget, self.decay_start(budget)))
        return out


@dataclass
class LoggerConfig:
    """Experiment tracking. ``kind=wandb`` also writes metrics.jsonl; ``none`` writes only that."""

    kind: LoggerKind = LoggerKind.wandb
    mode: WandbMode = WandbMode.offline
    project: str = "normlab"  # wandb project
    entity: str | None = None  # wandb entity (user or team); null: your default
    group: str | None = None  # null: <model>-<norm kind>-<impl>-<placement>-<precision>
    name: str | None = None  # null: the group plus the seed
    tags: list[str] = field(default_factory=list)  # wandb run tags
    init_timeout_s: float = 30.0  # seconds wandb.init waits for its server; then metrics.jsonl only

    def __post_init__(self) -> None:
        _require(
            self.init_timeout_s > 0, "logger.init_timeout_s", self.init_timeout_s, "must be > 0"
        )


def _distinct(names: list[str]) -> bool:
    """Non-empty names without ``/`` (metric keys hold them), none twice."""
    names = list(names)
    return all(n and "/" not in n for n in names) and len(set(names)) == len(names)


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass
class TrainConfig:
    """Everything one run needs. Built from the composed Hydra config by ``cli.to_train_config``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0  # the pairing key; also init_seed and data_seed where those are null
    init_seed: int | None = None  # initial weights and dropout; null: seed
    data_seed: int | None = None  # training batch order; null: seed
    max_steps: int = 2000
    eval_interval: int = 200
    eval_batches: int = 20
    log_interval: int = 1
    timing_warmup_steps: int = 5
    device: str = "auto"
    compile: bool = False
    peak_tflops: float | int | str = "auto"  # MFU denominator, TFLOP/s; auto: the measured peak
    progress: bool = True
    diag_interval: int | None = (
        None  # per-block diagnostics every N steps (diag/ keys); null: off, no hooks
    )
    debug: bool = False  # show tracebacks for user errors instead of one line
    divergence_factor: float | None = 2.0  # loss > factor x max(first loss, ln vocab): diverged
    max_skipped_fraction: float | None = 0.5  # more fp16 skips (calibration aside): diverged
    eval_data: list[str] = field(default_factory=list)  # held-out corpora: conf/data/*.yaml names
    max_time_s: float | None = None  # budget in training-step seconds: then evaluate and complete
    sample_interval: int | None = None  # text sample to train.log/wandb every N steps, at the end
    sample_tokens: int = 64  # new tokens per sample (sample_interval)
    eval_tasks: list[str] = field(default_factory=list)  # downstream tasks scored at evaluations
    eval_task_items: int | None = 200  # first N items per eval_tasks task; null: all of them

    def __post_init__(self) -> None:
        _require(self.max_steps >= 1, "max_steps", self.max_steps, "must be >= 1")
        _require(
            self.divergence_factor is None
            or (math.isfinite(self.divergence_factor) and self.divergence_factor > 1),
            "divergence_factor",
            self.divergence_factor,
            "must be null (off) or a finite number > 1",
        )
        _require(
            self.max_skipped_fraction is None or 0 <= self.max_skipped_fraction < 1,
            "max_skipped_fraction",
            self.max_skipped_fraction,
            "must be null (only a run that skipped every step fails) or in [0, 1)",
        )
        _require(self.eval_interval >= 1, "eval_interval", self.eval_interval, "must be >= 1")
        _require(self.eval_batches >= 1, "eval_batches", self.eval_batches, "must be >= 1")
        _require(self.log_interval >= 1, "log_interval", self.log_interval, "must be >= 1")
        for key in ("seed", "init_seed", "data_seed"):
            value = getattr(self, key)
            _require(
                value is None or value >= 0,
                key,
                value,
                "must be >= 0" + ", or null (seed)" * (key != "seed"),
            )
        _require(
            bool(_DEVICE.match(self.device)),
            "device",
            self.device,
            "allowed: auto, cpu, cuda, cuda:N",
        )
        _require(
            self.peak_tflops == "auto"
            or (
                isinstance(self.peak_tflops, (int, float))
                and not isinstance(self.peak_tflops, bool)
                and math.isfinite(self.peak_tflops)
                and self.peak_tflops > 0
            ),
            "peak_tflops",
            self.peak_tflops,
            "must be auto (the device's measured matmul peak) or a number of TFLOP/s > 0",
        )
        self.norm.check(self.model.n_layer)  # the block schedule against the model's blocks
        self._check_more_keys()
        self._check_anneal()
        inputs = {"attn_in", "mlp_in"} & set(self.norm.used_positions())
        _require(
            self.optim.norm_weight_decay != NormWeightDecay.input_only or bool(inputs),
            "optim.norm_weight_decay",
            self.optim.norm_weight_decay.name,
            f"norm.placement={self.norm.placement.name} has no input norms (attn_in, mlp_in) "
            "to decay; allowed: none, all",
        )

    def _check_more_keys(self) -> None:
        names, every, diag = list(self.eval_data), self.sample_interval, self.diag_interval
        distinct = _distinct(names)
        budget = self.max_time_s is None or (math.isfinite(self.max_time_s) and self.max_time_s > 0)
        for key, ok, allowed in [
            ("eval_data", distinct, "must be distinct data config names, e.g. [wiki_vital,kjv]"),
            ("max_time_s", budget, "must be null (no time budget) or a finite number > 0 (s)"),
            ("sample_interval", every is None or every >= 1, "must be null (off) or >= 1"),
            ("sample_tokens", self.sample_tokens >= 1, "must be >= 1"),
            ("diag_interval", diag is None or diag >= 1, "must be null (off) or >= 1"),
            ("eval_tasks", _distinct(self.eval_tasks), "must be distinct task names, e.g. [piqa]"),
            (
                "eval_task_items",
                self.eval_task_items is None or self.eval_task_items >= 1,
                "must be null (every item) or >= 1 (items per task)",
            ),
            ("timing_warmup_steps", self.timing_warmup_steps >= 0, "must be >= 0"),
        ]:
            _require(ok, key, getattr(self, key), allowed)

    def _check_anneal(self) -> None:
        """wsd against ``max_steps``: the decay starts after warm-up; each ``anneal_at`` budget T
        is >= 2 steps, below ``max_steps`` and distinct, and branches at D < T with ``warmup_steps
        <= D <=`` the main run's decay start; no ``anneal_at`` with ``max_time_s``."""
        optim, n = self.optim, self.max_steps
        if optim.schedule != LrSchedule.wsd or not optim.decay:
            return
        start, warmup = optim.decay_start(n), optim.warmup_steps
        _require(
            start >= warmup,
            "optim.decay_fraction",
            optim.decay_fraction,
            f"with max_steps={n} the decay would start after step {start}, inside the warm-up "
            f"(optim.warmup_steps={warmup}): lower one of them",
        )
        if not optim.anneal_at:
            return
        _require(
            self.max_time_s is None,
            "optim.anneal_at",
            optim.anneal_at,
            "needs max_time_s=null (a time budget cuts the run short; branches are budgets in "
            "steps)",
        )
        seen: set[int] = set()
        for f, (budget, branch) in zip(optim.anneal_at, optim.budgets(n), strict=True):
            _require(
                2 <= budget < n
                and budget not in seen
                and warmup <= branch < budget
                and branch <= start,
                "optim.anneal_at",
                optim.anneal_at,
                f"{f:g} x max_steps={n} is a budget of T={budget} steps branching after step "
                f"D={branch}; each needs 2 <= T < max_steps, its own T, a cool-down of at least "
                f"one step (D < T), and optim.warmup_steps={warmup} <= D <= {start} (the main "
                "run's decay start)",
            )
            seen.add(budget)

    @property
    def weights_seed(self) -> int:
        """The seed of the initial weights and dropout: ``init_seed``, or ``seed`` when null."""
        return self.seed if self.init_seed is None else self.init_seed

    @property
    def order_seed(self) -> int:
        """The seed of the training batch order: ``data_seed``, or ``seed`` when null."""
        return self.seed if self.data_seed is None else self.data_seed

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step (all micro-batches)."""
        return self.data.batch_size * self.optim.grad_accum * self.model.context_length


@dataclass(frozen=True)
class RunOptions:
    """How this invocation runs, beyond what it trains; not hashed, so it may differ between the
    invocations of one run. ``resume``: None (a new run, refused over checkpoints), ``"auto"`` (the
    newest valid checkpoint, if any) or ``"required"`` (one must exist); ``force``: resume a
    changed config (the differences logged and kept in the summary)."""

    ckpt_interval: int = 200  # 0: checkpoints only at the end and on SIGTERM/SIGINT
    ckpt_keep: int = 2
    max_loss: float | None = None  # a training loss above it counts as divergence
    resume: str | None = None
    force: bool = False
    threads: int | None = None  # torch intra-op threads; None: commands/train.py's auto rule
    conf_dir: str | None = (
        None  # where eval_data's conf/data/<name>.yaml are read (commands set it)
    )
    swept: tuple[str, ...] = ()  # "key=value" of this sweep job's swept keys (the progress bar)

    def __post_init__(self) -> None:
        allowed = "null, auto or required"
        _require(self.resume in (None, "auto", "required"), "resume", self.resume, allowed)


@dataclass
class CliConfig(TrainConfig):
    """The schema of ``conf/train.yaml``: ``TrainConfig`` plus the keys of one invocation, which
    become ``RunOptions`` (not hashed: they may change when a run is resumed)."""

    ckpt_interval: int = 200  # checkpoint every N steps, at the end and on a signal (0: only those)
    ckpt_keep: int = 2  # keep the newest K checkpoints
    max_loss: float | None = None  # a training loss above it ends the run as diverged; null: off
    resume: str | None = None  # null: new run; auto: continue from the newest checkpoint; <dir>
    force: bool = False  # resume even if the config differs from the checkpoint's
    threads: int | None = None  # CPU threads for torch; null: $OMP_NUM_THREADS, else half the cores

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, ok, allowed in [
            ("threads", self.threads is None or self.threads >= 1, "must be null (auto) or >= 1"),
            ("ckpt_interval", self.ckpt_interval >= 0, "must be >= 0 (0: only at the end)"),
            ("ckpt_keep", self.ckpt_keep >= 1, "must be >= 1"),
            (
                "max_loss",
                self.max_loss is None or (math.isfinite(self.max_loss) and self.max_loss > 0),
                "must be null or a finite number > 0",
            ),
        ]:
            _require(ok, key, getattr(self, key), allowed)

    def train_config(self) -> TrainConfig:
        """The ``TrainConfig`` part (what the run trains; hashed)."""
        return TrainConfig(**{k: getattr(self, k) for k in TrainConfig.__dataclass_fields__})
