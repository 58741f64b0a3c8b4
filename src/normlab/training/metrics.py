"""Metric names (the one place they are written), the on-device buffer that the host reads once
per log step and checks for divergence, and the loss-spike rule.

Every row of ``metrics.jsonl`` holds ``step`` and the keys of ``NAMES`` but the ``val/`` ones,
which evaluation rows add; step 0's row holds ``step``, ``perf/train_time_s`` and ``val/`` keys.
A spike (``SpikeCounter``) is a loss above the median of the ``SPIKE_WINDOW`` losses before it
plus ``SPIKE_K`` scaled MADs; an excursion counts once.

Why: docs/running.md
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from normlab.training import distributed

#: Metric keys of ``metrics.jsonl`` and wandb, by what they measure.
NAMES = {
    "loss": "train/loss",  # mean training loss over the step's micro-batches (nats/token)
    "lr": "train/lr",  # learning rate of the step
    "grad_norm": "train/grad_norm",  # global gradient L2 norm before clipping (after unscaling)
    "spikes": "train/spikes",  # loss spikes so far in the run (SpikeCounter's rule; cumulative)
    "step_time_ms": "perf/step_time_ms",  # wall time of the optimizer step (ms)
    "tokens_per_s": "perf/tokens_per_s",  # tokens of the step / its wall time
    "train_time_s": "perf/train_time_s",  # training-step wall time of the run so far (s)
    "val_loss": "val/loss",  # mean loss over the fixed validation batches (nats/token)
    "val_bpb": "val/bpb",  # the same in bits per byte: val/loss / ln 2 / bytes per token
}
#: Metric key -> its short legacy key in run dirs (``train/loss``, ``val/loss`` have none).
OLD_NAMES = {
    "train/lr": "lr",
    "train/grad_norm": "grad_norm",
    "perf/step_time_ms": "step_time_ms",
    "perf/tokens_per_s": "tokens_per_s",
}
DIAG_PREFIX = "diag/"


def eval_keys(name: str) -> tuple[str, str]:
    """``(loss key, bpb key)`` of the held-out corpus ``name``: ``val/<name>/loss``, ``.../bpb``."""
    return f"val/{name}/loss", f"val/{name}/bpb"


#: Steps of the rolling window of the spike rule (the losses of the steps before the one judged).
SPIKE_WINDOW = 50
#: How many scaled MADs above the window's median a loss must be to count as a spike.
SPIKE_K = 6.0
#: The MAD of Gaussian noise times this is its standard deviation (1 / Phi^-1(3/4)).
MAD_SCALE = 1.4826
#: At most this many spike steps are kept for ``summary.json``'s ``loss_spike_steps``.
MAX_SPIKE_STEPS = 100


@dataclass
class SpikeCounter:
    """Online spike count over losses fed in step order (non-finite ones skipped): ``count``,
    ``steps`` (the first step of each, at most ``MAX_SPIKE_STEPS``). Raises ValueError for
    ``window`` < 3 or ``k`` not finite > 0."""

    window: int = SPIKE_WINDOW
    k: float = SPIKE_K
    count: int = 0
    steps: list[int] = field(default_factory=list)
    in_spike: bool = False
    recent: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 3:
            raise ValueError(f"spike window={self.window!r}: must be an integer >= 3 (steps)")
        if not (isinstance(self.k, (int, float)) and math.isfinite(self.k) and self.k > 0):
            raise ValueError(f"spike k={self.k!r}: must be a finite number > 0 (scaled MADs)")
        self.recent = deque(self.recent, maxlen=self.window)

    def threshold(self) -> float | None:
        """The line a loss must exceed to be a spike (None until the window is full)."""
        if len(self.recent) < self.window:
            return None
        values = sorted(self.recent)  # two medians of window floats: microseconds a step
        med = _median_sorted(values)
        mad = _median_sorted(sorted(abs(v - med) for v in values))
        return med + self.k * MAD_SCALE * mad

    def update(self, step: int, loss: float) -> bool:
        """Judge ``loss`` against the window, then keep it; True when it starts an excursion."""
        if not math.isfinite(loss):
            return False
        line = self.threshold()
        above = line is not None and loss > line
        new = above and not self.in_spike
        if new:
            self.count += 1
            if len(self.steps) < MAX_SPIKE_STEPS:
                self.steps.append(step)
        self.in_spike = above
        self.recent.append(loss)
        return new

    def state(self) -> dict:
        """What a checkpoint keeps (plain Python values)."""
        return {
            "window": self.window,
            "k": self.k,
            "count": self.count,
            "steps": list(self.steps),
            "in_spike": self.in_spike,
            "recent": list(self.recent),
        }

    @classmethod
    def from_state(cls, state: dict | None) -> SpikeCounter:
        """The counter of a checkpoint's ``state`` (a new one for None)."""
        return cls(**state) if state else cls()


def _median_sorted(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else 0.5 * (values[mid - 1] + values[mid])


@dataclass
class Divergence:
    """The first step of a run that counts as divergence, why, and the last finite loss."""

    step: int
    reason: str
    last_finite_loss: float | None


@dataclass
class Limits:
    """What ends a run as diverged: a non-finite loss or (without a scaler) gradient norm, a loss
    above ``max_loss`` or ``divergence_factor * max(first loss, ln vocab_size)``; None: rule off.
    ``scaler_calibration``: ``precision.calibration_skips_max``."""

    scaler_enabled: bool = False
    scaler_calibration: int = 0
    max_loss: float | None = None
    divergence_factor: float | None = None
    vocab_size: int = 2

    def reason(self, loss: float, grad_norm: float, first_loss: float | None) -> str | None:
        """Why a step with this loss and gradient norm counts as divergence, or None."""
        if not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if not math.isfinite(grad_norm) and not self.scaler_enabled:
            return f"non-finite gradient norm {grad_norm}"
        if self.max_loss is not None and loss > self.max_loss:
            return f"loss {loss:.4g} above max_loss={self.max_loss:g}"
        if self.divergence_factor is not None and first_loss is not None:
            ref = max(first_loss, math.log(self.vocab_size))
            if loss > self.divergence_factor * ref:
                return (
                    f"loss {loss:.4g} above divergence_factor={self.divergence_factor:g} x "
                    f"{ref:.4g} (max of the first loss and ln vocab_size)"
                )
        return None


@dataclass
class MetricsBuffer:
    """Per-step metrics kept on the device between host syncs; ``flush`` checks every step, so
    divergence is found at its step. ``skipped_steps``: fp16 scaler skips, ``calibration_skips``
    those of its start-up; ``max_grad_norm``: the largest finite one before clipping."""

    grad_accum: int
    tokens_per_step: int
    limits: Limits
    first_loss: float | None = None  # the run's first training loss (kept in checkpoints)
    last_finite_loss: float | None = None
    skipped_steps: int = 0
    calibration_skips: int = 0
    spikes: SpikeCounter = field(default_factory=SpikeCounter)
    max_grad_norm: float | None = None
    _pending: list[tuple[int, float, float, dict[str, float]]] = field(default_factory=list)
    _values: list[torch.Tensor] = field(default_factory=list)

    def add(
        self,
        step: int,
        loss_sum: torch.Tensor,
        grad_norm: torch.Tensor,
        lr: float,
        step_time_ms: float,
        extra: dict[str, float] | None = None,
        train_time_s: float | None = None,
    ) -> None:
        """Keep step ``step`` (1-based) for the next ``flush``, no host sync; ``train_time_s``:
        the training-step seconds up to and including it."""
        timed = {NAMES["train_time_s"]: train_time_s} if train_time_s is not None else {}
        self._pending.append((step, lr, step_time_ms, {**timed, **(extra or {})}))
        self._values.append(torch.stack([loss_sum, grad_norm]))

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> tuple[list[dict[str, Any]], Divergence | None]:
        """Rows of the steps added since the last flush, up to the first diverged one (included),
        and that divergence or None; the same on every rank (losses summed, norms maxed)."""
        if not self._pending:
            return [], None
        rows = distributed.gather_rows(torch.stack(self._values))  # (ranks, n * 2), on the CPU
        per_rank = rows.reshape(rows.shape[0], -1, 2)
        loss = per_rank[:, :, 0].sum(0) / self.grad_accum
        losses, grads = torch.stack([loss, per_rank[:, :, 1].max(0).values]).tolist()  # the sync
        pending, self._pending, self._values = self._pending, [], []
        out: list[dict[str, Any]] = []
        for (step, lr, ms, extra), loss, grad in zip(pending, losses, grads, strict=True):
            out.append(self._row(step, loss, grad, lr, ms, extra))
            why = self.limits.reason(loss, grad, self.first_loss)
            if self.first_loss is None:
                self.first_loss = loss
            if why is not None:
                return out, Divergence(step, why, self.last_finite_loss)
            self._track(step, loss, grad)
            out[-1][NAMES["spikes"]] = self.spikes.count
            self.last_finite_loss = loss
            self._count_skip(step, grad)
        return out, None

    def _count_skip(self, step: int, grad: float) -> None:
        """Count step ``step`` (1-based) if the scaler skipped it; as calibration if every step
        before it was one and the scale had not halved down to 1."""
        if not (self.limits.scaler_enabled and not math.isfinite(grad)):
            return
        self.skipped_steps += 1
        if self.calibration_skips == step - 1 and step <= self.limits.scaler_calibration:
            self.calibration_skips += 1

    def _track(self, step: int, loss: float, grad: float) -> None:
        """The run's stability record: the spike count and the largest finite gradient norm."""
        self.spikes.update(step, loss)
        if math.isfinite(grad) and (self.max_grad_norm is None or grad > self.max_grad_norm):
            self.max_grad_norm = grad

    def _row(
        self, step: int, loss: float, grad: float, lr: float, ms: float, extra: dict[str, float]
    ) -> dict[str, Any]:
        return {
            "step": step,
            NAMES["loss"]: loss,
            NAMES["lr"]: lr,
            NAMES["grad_norm"]: grad,
            NAMES["step_time_ms"]: ms,
            NAMES["tokens_per_s"]: self.tokens_per_step / (ms / 1e3),
            **extra,
        }
