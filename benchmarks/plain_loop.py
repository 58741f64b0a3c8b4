"""A minimal plain-PyTorch training loop: the A side of ``python -m benchmarks baseline``.

The same model (normlab's ``GPT``, built from the same seed by ``training.setup.build_model``, so
the same initial weights), the same batches (the same ``BatchSampler``: batches are a pure function
of the seed and the step) and the same settings (AdamW with the same groups and flags, the same
learning-rate schedule, gradient clipping, autocast dtype, ``torch.compile``) as ``train``, but the
step itself written the way nanoGPT's ``train.py`` writes it: set the lr, then per micro-batch
forward under autocast and backward, clip, step, ``zero_grad``. No metrics buffer, no timers, no
diagnostics, no DDP context, no grad scaler unless fp16 needs one. Whatever normlab's
``train_step`` costs beyond this loop is harness overhead (``benchmarks.profile_step`` shows where).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from normlab.compose import compose
from normlab.config import Precision, TrainConfig
from normlab.data.tokens import BatchSampler, prepare
from normlab.norms import resolve_norm
from normlab.training.setup import FUSED_ADAMW_DEVICES, build_model
from normlab.training.step import lr_at
from normlab.training.tracking import synchronize

_DTYPES = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


class PlainLoop:
    """One plain training setup for ``cfg`` (resolved here as ``build_run`` resolves it);
    :meth:`run_step` runs and times one optimizer step. ``step`` is the next 0-based step."""

    #: What ``studies.bench_step`` reports as this setup's loop.
    loop = "plain"

    def __init__(self, cfg: TrainConfig, device: torch.device):
        data = prepare(cfg.data)
        cfg = dataclasses.replace(
            cfg,
            norm=resolve_norm(cfg.norm, device.type),
            model=dataclasses.replace(
                cfg.model, vocab_size=cfg.model.vocab_size or data.vocab_size
            ),
        )
        self.cfg, self.device, self.step = cfg, device, 0
        self.overrides: list[str] = []  # what it was composed from (build_plain sets them)
        self.model = build_model(cfg, device)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        fused = device.type in FUSED_ADAMW_DEVICES
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.optim.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            eps=cfg.optim.eps,
            fused=fused or None,
            foreach=None if fused else True,
        )
        self.fwd = torch.compile(self.model) if cfg.compile else self.model
        self.sampler = BatchSampler(
            data, cfg.data.batch_size, cfg.model.context_length, cfg.seed, device
        )
        dtype = _DTYPES.get(cfg.precision.dtype)
        self.ctx = (
            (lambda: torch.autocast(device.type, dtype=dtype))
            if dtype is not None
            else contextlib.nullcontext
        )
        fp16 = cfg.precision.dtype == Precision.fp16
        self.scaler = torch.amp.GradScaler(device.type, enabled=fp16)

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step at 0-based ``step``; returns the last micro-batch's loss (0-dim, on
        the device, not read)."""
        cfg = self.cfg
        lr = lr_at(step, cfg.max_steps, cfg.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        accum = cfg.optim.grad_accum
        for micro in range(accum):
            x, y = self.sampler.train_batch(step, micro)
            with self.ctx():
                _, loss = self.fwd(x, y)
            self.scaler.scale(loss / accum).backward()
        if cfg.optim.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def run_step(self) -> float:
        """One step, device synchronized at both ends (as ``bench_step.StepSetup.run_step``); wall
        ms."""
        synchronize(self.device)
        t0 = time.perf_counter()
        self.train_step(self.step)
        synchronize(self.device)
        self.step += 1
        return (time.perf_counter() - t0) * 1e3


def build_plain(overrides: list[str], device: torch.device) -> PlainLoop:
    """The plain loop for ``conf/train.yaml`` composed with ``overrides`` on ``device`` (the one
    normlab's setup of the same overrides resolved).

    Raises:
        ConfigError, DataError: as ``compose`` and ``prepare`` raise them.
    """
    plain = PlainLoop(compose(list(overrides)), device)
    plain.overrides = list(overrides)
    return plain
