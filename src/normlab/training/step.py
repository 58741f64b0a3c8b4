"""The training step: the learning-rate schedule and one optimizer step of a ``Run``.

``train_step`` is the one optimizer step: the loop, ``normlab-bench step`` and the norm-cost study
call it, so the benchmarks time the step that trains. It leaves its loss and gradient norm on the
device: reading them is the caller's host sync.

Why: docs/benchmarks.md
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from normlab.config import DecayShape, LrSchedule, OptimConfig
from normlab.training import distributed
from normlab.training.diagnostics import ActivationRecorder, block_grad_norms
from normlab.training.setup import Run


def lr_at(step: int, max_steps: int, cfg: OptimConfig) -> float:
    """Learning rate of 0-based ``step`` of ``max_steps``: linear warm-up to ``lr``, then (with
    ``optim.decay``) cosine to ``min_lr`` (Loshchilov & Hutter 2017) or wsd (Hu et al. 2024), whose
    decay shapes are in ``_wsd_decay``; ``min_lr`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.decay:
        return cfg.lr
    if cfg.schedule == LrSchedule.wsd:
        return _wsd_decay(step, max_steps, cfg)
    progress = (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (cfg.lr - cfg.min_lr)


def _wsd_decay(step: int, max_steps: int, cfg: OptimConfig) -> float:
    """``lr`` until ``D = decay_start``, then ``min_lr + (lr - min_lr) * f(p)``, ``p = (step + 1 -
    D) / (max_steps - D)``, f = 1 - sqrt(p) (Hägele et al. 2024), 1 - p or (1 + cos(pi p)) / 2."""
    start = cfg.decay_start(max_steps)
    if step < start:
        return cfg.lr
    p = min(1.0, (step + 1 - start) / max(1, max_steps - start))  # past the end: min_lr
    if cfg.decay_shape == DecayShape.sqrt:
        factor = 1.0 - math.sqrt(p)
    elif cfg.decay_shape == DecayShape.linear:
        factor = 1.0 - p
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * p))
    return cfg.min_lr + factor * (cfg.lr - cfg.min_lr)


def _accumulate(
    run: Run, step: int, diag: ActivationRecorder | None, mark: Callable[[str], None] | None
) -> torch.Tensor:
    """Forward and backward of this rank's micro-batches of ``step`` (r, r + N, ...); the sum of
    their losses, 0-dim fp32 on the device. ``diag`` hooks micro-batch 0, run eagerly."""
    micros = distributed.shard(run.cfg.optim.grad_accum)
    losses = []
    for n, micro in enumerate(micros):
        if mark is not None:
            mark("forward")
        x, y = run.sampler.train_batch(step, micro)
        with distributed.sync_gradients(run.ddp, sync=n == len(micros) - 1):
            if diag is not None and micro == 0:  # hooks on the first micro-batch only, eager
                with run.autocast(), diag.hooks(run.model):
                    _, loss = run.ddp(x, y)
            else:
                with run.autocast():
                    _, loss = run.fwd(x, y)
            if mark is not None:
                mark("backward")
            # / (grad_accum / N), DDP averages over N: the mean over all micro-batches of the step
            run.scaler.scale(loss / len(micros)).backward()
        losses.append(loss.detach())
    # one op for the usual single micro-batch (no zeros + add per step); float(): fp16/bf16 losses
    return (losses[0] if len(losses) == 1 else torch.stack(losses).sum()).float()


def train_step(
    run: Run,
    step: int,
    lr: float,
    diag: ActivationRecorder | None = None,
    mark: Callable[[str], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step (forward, backward, unscale, clip, AdamW); ``mark`` is called as each
    phase starts. Returns 0-dim fp32 device tensors ``(loss_sum, grad_norm)``: this rank's summed
    micro-batch losses (nats/token) and the global L2 norm before clipping; no host sync."""
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = _accumulate(run, step, diag, mark)
    if mark is not None:
        mark("optimizer")
    run.scaler.unscale_(run.optimizer)
    if diag is not None:
        diag.stats.update(block_grad_norms(run.model))
    clip = run.cfg.optim.grad_clip if run.cfg.optim.grad_clip > 0 else float("inf")
    # foreach=True on CPU too: one C++ loop over the gradients (torch._foreach_norm, _foreach_mul_)
    # instead of a Python loop of per-tensor norm and mul ops (PyTorch's CPU default); same values
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), clip, foreach=True)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm.float()  # clip_grad_norm_ computes it without a graph
