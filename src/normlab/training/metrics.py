"""Metric names (the one place they are written) and the buffer that keeps per-step values on the
device until a log step, where the host reads them all at once and checks them for divergence.

Every row of ``metrics.jsonl`` (and of wandb) holds ``step`` and the keys of :data:`NAMES` but the
``val/`` ones, which evaluation rows add (with :func:`eval_keys` per held-out corpus); the row of
step 0 (the evaluation before the first step) holds only ``step``, ``perf/train_time_s`` (0) and
the ``val/`` keys. Diagnostic rows add ``diag/...`` keys (``diagnostics.py``). Runs written
before the rename used the names in :data:`OLD_NAMES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from normlab.training import distributed

#: Metric keys of ``metrics.jsonl`` and wandb, by what they measure.
NAMES = {
    "loss": "train/loss",  # mean training loss over the step's micro-batches (nats/token)
    "lr": "train/lr",  # learning rate of the step
    "grad_norm": "train/grad_norm",  # global gradient L2 norm before clipping (after unscaling)
    "step_time_ms": "perf/step_time_ms",  # wall time of the optimizer step (ms)
    "tokens_per_s": "perf/tokens_per_s",  # tokens of the step / its wall time
    "train_time_s": "perf/train_time_s",  # training-step wall time of the run so far (s)
    "val_loss": "val/loss",  # mean loss over the fixed validation batches (nats/token)
    "val_bpb": "val/bpb",  # the same in bits per byte: val/loss / ln 2 / bytes per token
}
#: New name -> the name runs written before the rename used (``train/loss`` and ``val/loss`` kept).
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


@dataclass
class Divergence:
    """The first step of a run that counts as divergence, why, and the last finite loss before
    it."""

    step: int
    reason: str
    last_finite_loss: float | None


@dataclass
class Limits:
    """What ends a run as diverged (``loop.py``): a non-finite loss; a non-finite gradient norm
    unless an fp16 grad scaler skips that step (``scaler_enabled``); a loss above ``max_loss``; a
    loss above ``divergence_factor * max(first loss, ln vocab_size)`` (the first loss of the run:
    about ``ln vocab_size`` for a freshly initialised model). None turns a rule off."""

    scaler_enabled: bool = False
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
    """Per-step metrics kept on the device between host syncs.

    :meth:`add` stores one step's ``(loss_sum, grad_norm)`` tensors without reading them;
    :meth:`flush` gathers the steps added since the last flush over every rank, reads them back in
    one transfer (the host sync), and checks every step in order, so divergence is found at the
    step it happened however many steps a flush covers. ``skipped_steps`` counts the steps whose
    gradient norm was non-finite with an fp16 grad scaler: the scaler skipped their optimizer step.
    """

    grad_accum: int
    tokens_per_step: int
    limits: Limits
    first_loss: float | None = None  # the run's first training loss (kept in checkpoints)
    last_finite_loss: float | None = None
    skipped_steps: int = 0
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
        """Keep step ``step`` (1-based: steps done) for the next :meth:`flush`; no host sync.
        ``train_time_s``: the run's training-step seconds up to and including this step."""
        timed = {NAMES["train_time_s"]: train_time_s} if train_time_s is not None else {}
        self._pending.append((step, lr, step_time_ms, {**timed, **(extra or {})}))
        self._values.append(torch.stack([loss_sum, grad_norm]))

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> tuple[list[dict[str, Any]], Divergence | None]:
        """Rows of the steps added since the last flush, up to the first diverged one (included),
        and that divergence (or None). Every rank gets the same rows and the same verdict: losses
        are summed over ranks and gradient norms maxed, in rank order."""
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
            self.last_finite_loss = loss
            self.skipped_steps += self.limits.scaler_enabled and not math.isfinite(grad)
        return out, None

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
