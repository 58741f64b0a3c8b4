"""``train(cfg, run_dir, opts) -> summary``: one training run, no Hydra inside.

Order of work: resolve the device, the norm implementation and the precision, prepare the token
cache, find the checkpoint to resume from and check it against the config (errors here stop the run
before anything is trained or written), build the model and optimizer, then loop. Every
``eval_interval`` steps and at the end the model is evaluated on the same fixed validation batches;
every ``ckpt_interval`` steps, at the end, and when SIGTERM or SIGINT arrives a checkpoint is saved
(``checkpoint.py``). The loop stops early with status ``diverged`` at the first non-finite loss or
gradient norm (or a loss above ``max_loss``); ``summary.json`` is written whatever the outcome.

A resumed run continues from the checkpoint's step with the same weights, optimizer and scaler
state, RNG states and batches, so on CPU in fp32 it logs bit for bit the losses of a run that was
never interrupted.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import os
import platform
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .checkpoint import (
    CKPT_DIR,
    StopSignals,
    check_free_space,
    check_resumable,
    config_hash,
    find_resume_point,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from .config import ConfigError, OptimConfig, TrainConfig, to_plain
from .data import BatchSampler, prepare
from .diagnostics import ActivationRecorder, block_grad_norms, gain_stats
from .model import GPT
from .norms import resolve_norm
from .precision import autocast, check_precision, grad_scaler
from .tracking import MetricsLogger, StepTimer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How this invocation runs, beyond what it trains. Not part of the config hash: these may
    differ between the invocations of one run (``cli.py`` fills them from the top-level keys).

    ``resume``: None starts a new run (refused if the run dir already holds checkpoints);
    ``"auto"`` continues from the newest valid checkpoint in the run dir if there is one;
    ``"required"`` does too, and it is an error if there is none. ``force`` resumes even when the
    config differs from the checkpoint's (the differences are logged and kept in the summary).
    """

    ckpt_interval: int = 200  # 0: checkpoints only at the end and on SIGTERM/SIGINT
    ckpt_keep: int = 2
    max_loss: float | None = None  # a training loss above it counts as divergence
    resume: str | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if self.resume not in (None, "auto", "required"):
            raise ConfigError(f"resume={self.resume!r} is not allowed: null, auto or required")


def free_memory() -> None:
    """Release what a finished run leaves behind: unreachable objects, torch.compile's caches and
    graphs, cached CUDA blocks. Called after every run, so the jobs of a multirun start clean."""
    gc.collect()
    if "torch._dynamo" in sys.modules:  # only if something was compiled; importing it is slow
        torch.compiler.reset()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


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


def build_model(cfg: TrainConfig, device: torch.device) -> GPT:
    """Seed every generator with ``cfg.seed`` and build the GPT on ``device``.

    ``cfg.norm`` must be resolved and ``cfg.model.vocab_size`` set. For one seed, every norm variant
    gets the same initial weights for the parameters they share (norms draw no random numbers).
    """
    seed_everything(cfg.seed)
    return GPT(cfg.model, cfg.norm).to(device)


def divergence(loss: float, grad_norm: float, scaler_enabled: bool, max_loss: float | None) -> str | None:
    """Why this step counts as divergence, or None. An fp16 scaler skips non-finite gradients itself."""
    if not math.isfinite(loss):
        return f"non-finite loss {loss}"
    if not math.isfinite(grad_norm) and not scaler_enabled:
        return f"non-finite gradient norm {grad_norm}"
    if max_loss is not None and loss > max_loss:
        return f"loss {loss:.4g} above max_loss={max_loss:g}"
    return None


def train(cfg: TrainConfig, run_dir: Path, opts: RunOptions | None = None) -> dict[str, Any]:
    """Train one model as ``cfg`` says; write ``metrics.jsonl``, ``summary.json`` and checkpoints in ``run_dir``.

    Returns the summary (also written to ``run_dir/summary.json``): ``status`` is ``completed``,
    ``diverged`` (non-finite loss or gradient norm, or a loss above ``max_loss``),
    ``interrupted`` (SIGTERM or SIGINT: a checkpoint was saved) or ``failed`` (an exception,
    re-raised). Whatever the outcome, the wandb run is closed and memory is released.

    Raises:
        ConfigError, DataError: bad input, before any training step or file of the run.
    """
    try:
        return _train(cfg, run_dir, opts or RunOptions())
    finally:
        free_memory()


def _train(cfg: TrainConfig, run_dir: Path, opts: RunOptions) -> dict[str, Any]:
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
    config_dict = to_plain(cfg)
    resume = find_resume_point(run_dir, opts.resume)

    model = build_model(cfg, device)
    optimizer = make_optimizer(model, cfg.optim, device)
    scaler = grad_scaler(cfg.precision, device)
    forced_diff = check_resumable(resume, config_dict, model, opts.force) if resume else []
    check_free_space(run_dir, model, opts.ckpt_keep)
    ckpt = resume.state if resume else {}
    if resume:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt["scaler"]:  # empty when saved without a scaler (fp32/bf16)
            scaler.load_state_dict(ckpt["scaler"])
    fwd = torch.compile(model) if cfg.compile else model
    sampler = BatchSampler(data, cfg.data.batch_size, cfg.model.context_length, cfg.seed, device)

    def ctx():
        return autocast(cfg.precision.dtype, device)

    start = ckpt.get("step", 0)  # the sampler's position: batches are a pure function of the step
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
        "config_hash": config_hash(config_dict),
        "run_options": dataclasses.asdict(opts),
    }
    if resume:
        summary["resumed"] = {"from_step": start, "checkpoint": resume.path.name, "skipped": resume.skipped, "forced_config_diff": forced_diff}
        log.info("resuming from %s at step %d", resume.path, start)
    log.info("model %s: %.2fM parameters, norm %s/%s on %s", cfg.model.name, summary["params"] / 1e6, cfg.norm.kind.name, cfg.norm.impl.name, device)
    run_dir.mkdir(parents=True, exist_ok=True)
    sink = MetricsLogger(run_dir, cfg, config_dict, resume_step=start if resume else None, wandb_run_id=ckpt.get("wandb_run_id"))
    timer = StepTimer(device, cfg.timing_warmup_steps)
    timer.times_ms = list(ckpt.get("step_times_ms", []))
    tokens_per_step = cfg.tokens_per_step
    flops_per_step = model.flops_per_token() * tokens_per_step
    val_loss, last_finite_loss = ckpt.get("val_loss"), ckpt.get("last_finite_loss")
    wall_before = ckpt.get("wall_time_s", 0.0)
    if resume:
        restore_rng(ckpt["rng"])  # last: model building and wandb above may draw random numbers
        resume.state = None  # free the loaded tensors
    del ckpt

    def save(done: int) -> None:
        """Checkpoint after step ``done``; a failure is logged, the run goes on, older ones stay."""
        state = {
            "step": done,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rng_state(),
            "sampler": {"step": done, "seed": cfg.seed},
            "config": config_dict,
            "config_hash": summary["config_hash"],
            "wandb_run_id": sink.wandb_run_id,
            "val_loss": val_loss,
            "last_finite_loss": last_finite_loss,
            "step_times_ms": list(timer.times_ms),
            "wall_time_s": wall_before + time.perf_counter() - t_start,
        }
        try:
            path = save_checkpoint(run_dir / CKPT_DIR, state, opts.ckpt_keep)
            log.info("checkpoint %s", path)
        except OSError as e:
            log.error("could not save the checkpoint of step %d (%s); the previous one stays", done, e)

    step = done = start
    bar = tqdm(total=cfg.max_steps, initial=start, desc=f"{cfg.norm.kind.name}/{cfg.norm.impl.name}", unit="step", disable=not cfg.progress, dynamic_ncols=True, mininterval=1.0)
    stop = StopSignals()
    try:
        with stop:
            for step in range(start, cfg.max_steps):
                lr = lr_at(step, cfg.max_steps, cfg.optim)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                diag = ActivationRecorder() if cfg.diag_interval and (step + 1) % cfg.diag_interval == 0 else None
                timer.start()
                loss_sum = 0.0
                for micro in range(cfg.optim.grad_accum):
                    x, y = sampler.train_batch(step, micro)
                    if diag is not None and micro == 0:  # hooks on the first micro-batch only, eager
                        with ctx(), diag.hooks(model):
                            _, loss = model(x, y)
                    else:
                        with ctx():
                            _, loss = fwd(x, y)
                    scaler.scale(loss / cfg.optim.grad_accum).backward()
                    loss_sum += loss.detach().float()
                scaler.unscale_(optimizer)
                if diag is not None:
                    diag.stats.update(block_grad_norms(model))
                clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                train_loss = (loss_sum / cfg.optim.grad_accum).item()
                dt_ms = timer.stop(record=diag is None)  # diagnosed steps are slower: not timed

                done = step + 1
                row: dict[str, Any] = {"step": done, "train/loss": train_loss, "lr": lr, "grad_norm": grad_norm, "step_time_ms": dt_ms, "tokens_per_s": tokens_per_step / (dt_ms / 1e3)}
                if diag is not None:
                    row.update(diag.stats, **gain_stats(model))
                diverged = divergence(train_loss, grad_norm, scaler.is_enabled(), opts.max_loss)
                if not diverged:
                    last_finite_loss = train_loss
                    if done % cfg.eval_interval == 0 or done == cfg.max_steps:
                        val_loss = evaluate(fwd, sampler, cfg.eval_batches, ctx)
                        row["val/loss"] = val_loss
                if diverged or done % cfg.log_interval == 0 or "val/loss" in row:
                    sink.log(row)
                bar.update(1)
                bar.set_postfix(loss=f"{train_loss:.3f}", val=f"{val_loss:.3f}" if val_loss is not None else "-", tok_s=f"{row['tokens_per_s']:.0f}")
                if diverged:
                    summary.update(status="diverged", diverged_at_step=done, diverged_reason=diverged, last_finite_loss=last_finite_loss)
                    log.error("run diverged at step %d: %s", done, diverged)
                    break
                interrupted = stop.signal is not None and done < cfg.max_steps
                if interrupted or done == cfg.max_steps or (opts.ckpt_interval and done % opts.ckpt_interval == 0):
                    save(done)
                if interrupted:
                    summary.update(status="interrupted", signal=stop.signal, interrupted_at_step=done)
                    log.warning("%s received: stopped after step %d with a checkpoint; resume=auto continues", stop.signal, done)
                    break
            else:
                summary["status"] = "completed"
                done = cfg.max_steps
    except KeyboardInterrupt:
        summary.update(status="interrupted", signal="SIGINT", interrupted_at_step=done)
        raise
    except Exception as e:
        summary.update(status="failed", error=f"{type(e).__name__}: {e}", failed_at_step=step + 1, traceback=traceback.format_exc())
        raise
    finally:
        bar.close()
        summary.update(
            steps_completed=step if summary["status"] == "failed" else done,
            final_val_loss=val_loss if summary["status"] == "completed" else None,
            last_val_loss=val_loss,
            wall_time_s=wall_before + time.perf_counter() - t_start,
            step_times_ms=timer.measured_ms,
            **timer.summary(tokens_per_step, flops_per_step, cfg.peak_tflops),
        )
        try:  # atomically: a kill while writing leaves the previous summary, not half of this one
            tmp = run_dir / f".summary.json.tmp{os.getpid()}"
            tmp.write_text(json.dumps(summary, indent=2))
            os.replace(tmp, run_dir / "summary.json")
        finally:
            sink.finish(summary, exit_code=0 if summary["status"] == "completed" else 1)
    return summary
