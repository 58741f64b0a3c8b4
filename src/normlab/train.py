"""``train(cfg, run_dir) -> summary``: one training run, no Hydra inside.

Order of work: resolve the device, the norm implementation and the precision (errors here stop the
run before anything is trained or written), prepare the token cache, build the model and optimizer,
then loop. Every ``eval_interval`` steps and at the end the model is evaluated on the same fixed
validation batches. The loop stops early with status ``diverged`` at the first non-finite loss or
gradient norm; ``summary.json`` is written whatever the outcome.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import platform
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .config import ConfigError, OptimConfig, TrainConfig, to_plain
from .data import BatchSampler, prepare
from .model import GPT
from .norms import resolve_norm
from .precision import autocast, check_precision, grad_scaler
from .tracking import MetricsLogger, StepTimer

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu. Raises ConfigError for an absent CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} is not available on this machine (no CUDA); allowed here: auto, cpu")
    return device


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every CUDA device) generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def lr_at(step: int, max_steps: int, cfg: OptimConfig) -> float:
    """Learning rate for 0-based ``step``: linear warm-up to ``lr``, then cosine decay to ``min_lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.decay:
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices (dim >= 2) and none on gains and biases."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=device.type == "cuda"
    )


def versions(device: torch.device, compiled: bool) -> dict[str, Any]:
    """Versions and hardware that change numbers, recorded with every run."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "compile": compiled,
    }


@torch.no_grad()
def evaluate(model: GPT, sampler: BatchSampler, n_batches: int, ctx_factory) -> float:
    """Mean cross-entropy (nats/token) over the fixed validation batches ``0..n_batches-1``."""
    model.eval()
    losses = []
    for i in range(n_batches):
        x, y = sampler.val_batch(i)
        with ctx_factory():
            _, loss = model(x, y)
        losses.append(loss.item())
    model.train()
    return float(np.mean(losses))


def train(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """Train one model as ``cfg`` says; write ``metrics.jsonl`` and ``summary.json`` in ``run_dir``.

    Returns the summary (also written to ``run_dir/summary.json``): ``status`` is ``completed``,
    ``diverged`` (non-finite loss or gradient norm) or ``failed`` (an exception, re-raised).

    Raises:
        ConfigError, DataError: bad input, before any training step.
    """
    t_start = time.perf_counter()
    device = resolve_device(cfg.device)
    norm_cfg = resolve_norm(cfg.norm, device.type)
    check_precision(cfg.precision.dtype, device)
    data = prepare(cfg.data)
    cfg = dataclasses.replace(
        cfg,
        norm=norm_cfg,
        model=dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or data.vocab_size),
    )
    if cfg.model.vocab_size < data.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's {data.vocab_size}")

    seed_everything(cfg.seed)
    model = GPT(cfg.model, cfg.norm).to(device)
    fwd = torch.compile(model) if cfg.compile else model
    optimizer = make_optimizer(model, cfg.optim, device)
    scaler = grad_scaler(cfg.precision, device)
    sampler = BatchSampler(data, cfg.data.batch_size, cfg.model.context_length, cfg.seed, device)

    def ctx():
        return autocast(cfg.precision.dtype, device)

    config_dict = to_plain(cfg)
    summary: dict[str, Any] = {
        "status": "running",
        "seed": cfg.seed,
        "max_steps": cfg.max_steps,
        "norm": to_plain(cfg.norm),
        "norm_impl": cfg.norm.impl.name,
        "precision": cfg.precision.dtype.name,
        "params": model.num_params(),
        "device": str(device),
        "versions": versions(device, cfg.compile),
        "data": {"cache": str(data.directory), "tokens": data.meta["tokens"]},
        "config": config_dict,
    }
    log.info("model %s: %.2fM parameters, norm %s/%s on %s", cfg.model.name, summary["params"] / 1e6, cfg.norm.kind.name, cfg.norm.impl.name, device)
    sink = MetricsLogger(run_dir, cfg, config_dict)
    timer = StepTimer(device, cfg.timing_warmup_steps)
    tokens_per_step = cfg.tokens_per_step
    flops_per_step = model.flops_per_token() * tokens_per_step
    val_loss = last_finite_loss = None
    step = done = 0
    bar = tqdm(total=cfg.max_steps, desc=f"{cfg.norm.kind.name}/{cfg.norm.impl.name}", unit="step", disable=not cfg.progress, dynamic_ncols=True, mininterval=1.0)
    try:
        for step in range(cfg.max_steps):
            lr = lr_at(step, cfg.max_steps, cfg.optim)
            for group in optimizer.param_groups:
                group["lr"] = lr
            timer.start()
            loss_sum = 0.0
            for micro in range(cfg.optim.grad_accum):
                x, y = sampler.train_batch(step, micro)
                with ctx():
                    _, loss = fwd(x, y)
                scaler.scale(loss / cfg.optim.grad_accum).backward()
                loss_sum += loss.detach().float()
            scaler.unscale_(optimizer)
            clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            train_loss = (loss_sum / cfg.optim.grad_accum).item()
            dt_ms = timer.stop()

            done = step + 1
            row: dict[str, Any] = {"step": done, "train/loss": train_loss, "lr": lr, "grad_norm": grad_norm, "step_time_ms": dt_ms, "tokens_per_s": tokens_per_step / (dt_ms / 1e3)}
            diverged = not (math.isfinite(train_loss) and (math.isfinite(grad_norm) or scaler.is_enabled()))
            if not diverged:
                last_finite_loss = train_loss
            if diverged or done % cfg.eval_interval == 0 or done == cfg.max_steps:
                if not diverged:
                    val_loss = evaluate(fwd, sampler, cfg.eval_batches, ctx)
                    row["val/loss"] = val_loss
            if diverged or done % cfg.log_interval == 0 or "val/loss" in row:
                sink.log(row)
            bar.update(1)
            bar.set_postfix(loss=f"{train_loss:.3f}", val=f"{val_loss:.3f}" if val_loss is not None else "-", tok_s=f"{row['tokens_per_s']:.0f}")
            if diverged:
                summary.update(status="diverged", diverged_at_step=done, last_finite_loss=last_finite_loss)
                log.error("run diverged at step %d (loss %s, grad norm %s)", done, train_loss, grad_norm)
                break
        else:
            summary["status"] = "completed"
            done = cfg.max_steps
    except KeyboardInterrupt:
        summary.update(status="interrupted", interrupted_at_step=step + 1)
        raise
    except Exception as e:
        summary.update(status="failed", error=f"{type(e).__name__}: {e}", failed_at_step=step + 1)
        raise
    finally:
        bar.close()
        summary.update(
            steps_completed=done if summary["status"] in ("completed", "diverged") else step,
            final_val_loss=val_loss if summary["status"] == "completed" else None,
            last_val_loss=val_loss,
            wall_time_s=time.perf_counter() - t_start,
            step_times_ms=timer.measured_ms,
            **timer.summary(tokens_per_step, flops_per_step, cfg.peak_tflops),
        )
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        sink.finish(summary, exit_code=0 if summary["status"] == "completed" else 1)
    return summary
