"""``train(cfg, run_dir, opts) -> summary``: one training run, no Hydra inside.

Order of work: resolve the device, the norm implementation and the precision, prepare the token
cache, find the checkpoint to resume from and check it against the config (errors here stop the run
before anything is trained or written), build the model and optimizer, then loop. Every
``eval_interval`` steps and at the end the model is evaluated on the same fixed validation batches;
every ``ckpt_interval`` steps, at the end, and when SIGTERM, SIGINT or SIGUSR2 (submitit's warning)
arrives a checkpoint is saved (``checkpoint.py``). The loop stops early with status ``diverged`` at the first non-finite loss or
gradient norm (or a loss above ``max_loss``); ``summary.json`` is written whatever the outcome.

A resumed run continues from the checkpoint's step with the same weights, optimizer and scaler
state, RNG states and batches, so on CPU in fp32 it logs bit for bit the losses of a run that was
never interrupted.

Under ``torchrun`` (``distributed.py``) every rank runs this function on the same config: the model
is wrapped in DistributedDataParallel, rank r of N computes micro-batches r, r + N, ... of each step
(the global batch is ``optim.grad_accum`` micro-batches whatever N), the ranks agree after every
step on the loss (the mean over all micro-batches) and on a stop signal, and only rank 0 writes
metrics, the summary, checkpoints and wandb. Every rank loads the checkpoint it resumes from.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import os
import platform
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from normlab.config import ConfigError, OptimConfig, RunOptions, TrainConfig, to_plain
from normlab.data.tokens import BatchSampler, prepare
from normlab.model import GPT
from normlab.norms import resolve_norm
from normlab.norms.preflight import preflight
from normlab.training import distributed
from normlab.training.checkpoint import (
    CKPT_DIR,
    check_free_space,
    check_resumable,
    config_hash,
    find_resume_point,
    rng_state,
    save_checkpoint,
)
from normlab.training.diagnostics import ActivationRecorder, block_grad_norms, gain_stats
from normlab.training.distributed import resolve_device, seed_everything
from normlab.training.precision import autocast, check_precision, grad_scaler
from normlab.training.tracking import MetricsLogger, StepTimer

log = logging.getLogger(__name__)


def free_memory() -> None:
    """Release what a finished run leaves behind: unreachable objects, torch.compile's caches and
    graphs, cached CUDA blocks. Called after every run, so the jobs of a multirun start clean."""
    gc.collect()
    if "torch._dynamo" in sys.modules:  # only if something was compiled; importing it is slow
        torch.compiler.reset()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def lr_at(step: int, max_steps: int, cfg: OptimConfig) -> float:
    """Learning rate for 0-based ``step``: linear warm-up to ``lr``, then cosine decay to ``min_lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.decay:
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (cfg.lr - cfg.min_lr)


def make_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, device: torch.device
) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices (dim >= 2) and none on gains and biases."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
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
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "compile": compiled,
    }


@torch.no_grad()
def evaluate(model: GPT, sampler: BatchSampler, n_batches: int, ctx_factory) -> float:
    """Mean cross-entropy (nats/token) over the fixed validation batches ``0..n_batches-1``.

    With several processes each evaluates its share (batches rank, rank + N, ...); the losses are
    gathered and averaged in batch order, as one process does.
    """
    model.eval()
    mine = {}
    for i in distributed.shard(n_batches):
        x, y = sampler.val_batch(i)
        with ctx_factory():
            _, loss = model(x, y)
        mine[i] = loss.item()
    model.train()
    losses = {i: v for part in distributed.all_gather(mine) for i, v in part.items()}
    return float(np.mean([losses[i] for i in range(n_batches)]))


def accumulate(
    module: torch.nn.Module,
    eager: torch.nn.Module,
    sampler: BatchSampler,
    step: int,
    cfg: TrainConfig,
    scaler,
    ctx_factory,
    diag: ActivationRecorder | None,
) -> torch.Tensor:
    """Forward and backward of this rank's micro-batches of ``step``; returns the sum of their losses.

    Rank r of N takes micro-batches r, r + N, ... of ``optim.grad_accum``. Each loss is divided by
    ``grad_accum / N`` and DDP averages over the N ranks, so the gradient is the mean over all
    micro-batches of the step, as in one process. Gradients are all-reduced with the last
    micro-batch only. ``diag`` hooks micro-batch 0 (rank 0's), run eagerly (``eager``).
    """
    micros = distributed.shard(cfg.optim.grad_accum)
    loss_sum = 0.0
    for n, micro in enumerate(micros):
        x, y = sampler.train_batch(step, micro)
        with distributed.sync_gradients(eager, sync=n == len(micros) - 1):
            if diag is not None and micro == 0:  # hooks on the first micro-batch only, eager
                with (
                    ctx_factory(),
                    diag.hooks(getattr(eager, "module", eager)),
                ):  # the GPT inside DDP
                    _, loss = eager(x, y)
            else:
                with ctx_factory():
                    _, loss = module(x, y)
            scaler.scale(loss / len(micros)).backward()
        loss_sum += loss.detach().float()
    return loss_sum


class _NoSink:
    """What ranks > 0 log to: nothing (rank 0 writes metrics.jsonl and wandb)."""

    wandb_run_id = None

    def log(self, row: dict[str, Any]) -> None:
        pass

    def finish(self, summary: dict[str, Any], exit_code: int = 0) -> None:
        pass


def build_model(cfg: TrainConfig, device: torch.device) -> GPT:
    """Seed every generator with ``cfg.seed`` and build the GPT on ``device``.

    ``cfg.norm`` must be resolved and ``cfg.model.vocab_size`` set. For one seed, every norm variant
    gets the same initial weights for the parameters they share (norms draw no random numbers).
    """
    seed_everything(cfg.seed)
    return GPT(cfg.model, cfg.norm).to(device)


def divergence(
    loss: float, grad_norm: float, scaler_enabled: bool, max_loss: float | None
) -> str | None:
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
    ``interrupted`` (SIGTERM, SIGINT or SIGUSR2: a checkpoint was saved) or ``failed`` (an exception,
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
    world, main = distributed.world_size(), distributed.is_main()
    if cfg.optim.grad_accum % world:
        raise ConfigError(
            f"optim.grad_accum={cfg.optim.grad_accum} is not divisible by the {world} processes: the {cfg.optim.grad_accum} micro-batches of a step are shared out among them; use a multiple of {world}"
        )
    device = resolve_device(cfg.device)
    norm_cfg = resolve_norm(cfg.norm, device.type)
    check_precision(cfg.precision.dtype, device)
    # the norms see the fp32 residual stream whatever the autocast dtype (see norms/preflight.py)
    norm_check = preflight(norm_cfg, cfg.model.d_model, device, torch.float32)
    data = prepare(cfg.data)
    cfg = dataclasses.replace(
        cfg,
        norm=norm_cfg,
        model=dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or data.vocab_size),
    )
    if cfg.model.vocab_size < data.vocab_size:
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's {data.vocab_size}"
        )
    config_dict = to_plain(cfg)
    resume = find_resume_point(run_dir, opts.resume)  # every rank loads it

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
    ddp = distributed.wrap(model, device)  # the model itself in a single process
    fwd = torch.compile(ddp) if cfg.compile else ddp
    eval_fwd = fwd if ddp is model else torch.compile(model) if cfg.compile else model
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
        "world_size": world,
        "versions": versions(device, cfg.compile),
        "preflight": norm_check,
        "data": {"cache": str(data.directory), "tokens": data.meta["tokens"]},
        "config": config_dict,
        "config_hash": config_hash(config_dict),
        "run_options": dataclasses.asdict(opts),
    }
    if resume:
        summary["resumed"] = {
            "from_step": start,
            "checkpoint": resume.path.name,
            "skipped": resume.skipped,
            "forced_config_diff": forced_diff,
        }
        log.info("resuming from %s at step %d", resume.path, start)
    log.info(
        "model %s: %.2fM parameters, norm %s/%s on %s%s",
        cfg.model.name,
        summary["params"] / 1e6,
        cfg.norm.kind.name,
        cfg.norm.impl.name,
        device,
        f" x {world} processes" if world > 1 else "",
    )
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    sink = (
        MetricsLogger(
            run_dir,
            cfg,
            config_dict,
            resume_step=start if resume else None,
            wandb_run_id=ckpt.get("wandb_run_id"),
        )
        if main
        else _NoSink()
    )
    timer = StepTimer(device, cfg.timing_warmup_steps)
    timer.times_ms = list(ckpt.get("step_times_ms", []))
    tokens_per_step = cfg.tokens_per_step  # global: every rank's micro-batches
    flops_per_step = model.flops_per_token() * tokens_per_step
    val_loss, last_finite_loss = ckpt.get("val_loss"), ckpt.get("last_finite_loss")
    wall_before = ckpt.get("wall_time_s", 0.0)
    if resume:  # last: model building and wandb above may draw random numbers
        distributed.restore_rank_rng(ckpt.get("rng_ranks") or [ckpt["rng"]], cfg.seed, start)
        resume.state = None  # free the loaded tensors
    else:
        distributed.seed_rank(cfg.seed, start)  # ranks > 0: their own dropout masks
    del ckpt

    def save(done: int) -> None:
        """Checkpoint after step ``done`` (rank 0 writes; every rank's RNG state goes in it);
        a failure is logged, the run goes on, older ones stay."""
        rngs = distributed.all_gather(rng_state())
        if not main:
            return
        state = {
            "step": done,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rngs[0],
            "rng_ranks": rngs if world > 1 else None,
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
            log.error(
                "could not save the checkpoint of step %d (%s); the previous one stays", done, e
            )

    step = done = start
    bar = tqdm(
        total=cfg.max_steps,
        initial=start,
        desc=f"{cfg.norm.kind.name}/{cfg.norm.impl.name}",
        unit="step",
        disable=not (cfg.progress and main),
        dynamic_ncols=True,
        mininterval=1.0,
    )
    stop = distributed.StopSignals()
    try:
        with stop:
            for step in range(start, cfg.max_steps):
                lr = lr_at(step, cfg.max_steps, cfg.optim)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                diag = (
                    ActivationRecorder()
                    if cfg.diag_interval and (step + 1) % cfg.diag_interval == 0
                    else None
                )
                timer.start()
                loss_sum = accumulate(fwd, ddp, sampler, step, cfg, scaler, ctx, diag)
                scaler.unscale_(optimizer)
                if diag is not None:
                    diag.stats.update(block_grad_norms(model))
                clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                # Every rank's loss sum and gradient norm, reduced in rank order: the same loss and
                # the same divergence verdict on every rank.
                rows = distributed.gather_rows(
                    torch.stack([loss_sum, loss_sum.new_tensor(grad_norm)])
                )
                train_loss, grad_norm = (
                    (rows[:, 0].sum() / cfg.optim.grad_accum).item(),
                    rows[:, 1].max().item(),
                )
                dt_ms = timer.stop(record=diag is None)  # diagnosed steps are slower: not timed

                done = step + 1
                row: dict[str, Any] = {
                    "step": done,
                    "train/loss": train_loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "step_time_ms": dt_ms,
                    "tokens_per_s": tokens_per_step / (dt_ms / 1e3),
                }
                if diag is not None:
                    row.update(diag.stats, **gain_stats(model))
                diverged = divergence(train_loss, grad_norm, scaler.is_enabled(), opts.max_loss)
                if not diverged:
                    last_finite_loss = train_loss
                    if done % cfg.eval_interval == 0 or done == cfg.max_steps:
                        val_loss = evaluate(eval_fwd, sampler, cfg.eval_batches, ctx)
                        row["val/loss"] = val_loss
                if diverged or done % cfg.log_interval == 0 or "val/loss" in row:
                    sink.log(row)
                bar.update(1)
                bar.set_postfix(
                    loss=f"{train_loss:.3f}",
                    val=f"{val_loss:.3f}" if val_loss is not None else "-",
                    tok_s=f"{row['tokens_per_s']:.0f}",
                )
                if diverged:
                    summary.update(
                        status="diverged",
                        diverged_at_step=done,
                        diverged_reason=diverged,
                        last_finite_loss=last_finite_loss,
                    )
                    log.error("run diverged at step %d: %s", done, diverged)
                    break
                code = distributed.all_reduce_max(
                    stop.code
                )  # a signal to any rank stops them all here
                stop_signal = signal.Signals(code).name if code else None
                interrupted = stop_signal is not None and done < cfg.max_steps
                if (
                    interrupted
                    or done == cfg.max_steps
                    or (opts.ckpt_interval and done % opts.ckpt_interval == 0)
                ):
                    save(done)
                if interrupted:
                    summary.update(
                        status="interrupted", signal=stop_signal, interrupted_at_step=done
                    )
                    log.warning(
                        "%s received: stopped after step %d with a checkpoint; resume=auto continues",
                        stop_signal,
                        done,
                    )
                    break
            else:
                summary["status"] = "completed"
                done = cfg.max_steps
    except KeyboardInterrupt:
        summary.update(status="interrupted", signal="SIGINT", interrupted_at_step=done)
        raise
    except Exception as e:
        summary.update(
            status="failed",
            error=f"{type(e).__name__}: {e}",
            failed_at_step=step + 1,
            traceback=traceback.format_exc(),
        )
        raise
    finally:
        bar.close()
        summary.update(
            steps_completed=step if summary["status"] == "failed" else done,
            final_val_loss=val_loss if summary["status"] == "completed" else None,
            last_val_loss=val_loss,
            wall_time_s=wall_before + time.perf_counter() - t_start,
            step_times_ms=timer.measured_ms,
            **timer.summary(
                tokens_per_step, flops_per_step, cfg.peak_tflops * world
            ),  # MFU per device
        )
        try:
            if main:
                write_summary(run_dir, summary)
        finally:
            sink.finish(summary, exit_code=0 if summary["status"] == "completed" else 1)
    return summary


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` atomically: a kill while writing leaves the previous one, not half of this."""
    tmp = run_dir / f".summary.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, run_dir / "summary.json")
