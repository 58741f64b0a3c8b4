"""``train(cfg, run_dir, opts) -> summary``: one training run, no Hydra inside.

``setup.build_run`` does every refusing check and builds the run; :func:`train_loop` below is the
loop, read top to bottom. Per-step metrics stay on the device (``metrics.py``) until a log step,
an evaluation, a checkpoint or the end, where the host reads them once and checks every step for
divergence. Every ``eval_interval`` steps and at the end the model is evaluated on the same fixed
validation batches; every ``ckpt_interval`` steps, at the end, and when SIGTERM, SIGINT or SIGUSR2
(submitit's warning) arrives a checkpoint is saved. ``summary.json`` is written whatever the
outcome (``run_state.py``).

A resumed run continues from the checkpoint's step with the same weights, optimizer and scaler
state, RNG states and batches, so on CPU in fp32 it logs bit for bit the losses of a run that was
never interrupted.

Under ``torchrun`` (``distributed.py``) every rank runs this on the same config: the model is
wrapped in DistributedDataParallel, rank r of N computes micro-batches r, r + N, ... of each step,
the ranks agree at every sync on the losses and the divergence verdict and after every step on a
stop signal, and only rank 0 writes metrics, the summary, checkpoints and wandb.
"""

from __future__ import annotations

import signal
import traceback
from pathlib import Path
from typing import Any

from normlab.config import RunOptions, TrainConfig
from normlab.training import distributed
from normlab.training import step as training_step
from normlab.training.diagnostics import ActivationRecorder, gain_stats
from normlab.training.run_state import Progress, finish, open_run
from normlab.training.setup import build_run, describe_error, free_memory
from normlab.training.step import evaluate, lr_at

__all__ = ["RunOptions", "free_memory", "train"]


def train(cfg: TrainConfig, run_dir: Path, opts: RunOptions | None = None) -> dict[str, Any]:
    """Train one model as ``cfg`` says; write ``metrics.jsonl``, ``summary.json`` and checkpoints
    in ``run_dir``.

    Returns the summary (also written to ``run_dir/summary.json``): ``status`` is ``completed``;
    ``diverged`` (a non-finite loss or gradient norm, a loss above ``max_loss`` or above
    ``divergence_factor`` x the first loss, or more than ``max_skipped_fraction`` of the steps
    skipped by the fp16 grad scaler); ``interrupted`` (SIGTERM, SIGINT or SIGUSR2: a checkpoint
    was saved) or ``failed`` (an exception, re-raised). Whatever the outcome, the wandb run is
    closed and memory is released.

    Raises:
        ConfigError, DataError: bad input, before any training step or file of the run.
    """
    opts = opts or RunOptions()
    try:
        run = build_run(cfg, run_dir, opts)
        p = open_run(run, run_dir, opts)
        try:
            train_loop(run, p, opts)
        except KeyboardInterrupt:
            p.summary.update(status="interrupted", signal="SIGINT", interrupted_at_step=p.done)
            raise
        except Exception as e:
            p.summary.update(
                status="failed",
                error=describe_error(e),
                failed_at_step=p.step + 1,
                traceback=traceback.format_exc(),
            )
            raise
        finally:
            finish(run, p, run_dir)
        return p.summary
    finally:
        free_memory()


def train_loop(run, p: Progress, opts: RunOptions) -> None:
    """The loop: from ``run.start`` to ``max_steps``; sets ``p.summary["status"]`` at its end."""
    cfg = run.cfg
    with distributed.StopSignals() as stop:
        for step in range(run.start, cfg.max_steps):
            p.step = step
            # schedule: this step's learning rate; per-block diagnostics every diag_interval steps
            lr = lr_at(step, cfg.max_steps, cfg.optim)
            diag = ActivationRecorder() if p.diag_due(step + 1) else None
            # the step: micro-batches forward + backward, unscale, clip, AdamW (no host sync)
            p.timer.start()
            loss_sum, grad_norm = training_step.train_step(run, step, lr, diag)
            ms = p.timer.stop(record=diag is None)  # diagnosed steps are slower: not timed
            p.done = done = step + 1
            extra = {**diag.stats, **gain_stats(run.model)} if diag is not None else None
            p.metrics.add(done, loss_sum, grad_norm, lr, ms, extra)
            # sync on log steps and before an evaluation or a checkpoint: read, check, log
            evaluating = done % cfg.eval_interval == 0 or done == cfg.max_steps
            saving = done == cfg.max_steps or p.ckpt_due(done, opts.ckpt_interval)
            if (p.log_due(done) or evaluating or saving) and not sync(run, p, evaluating):
                return  # diverged
            # a signal to any rank stops them all here, after a checkpoint
            code = distributed.all_reduce_max(stop.code)
            stopping = signal.Signals(code).name if code and done < cfg.max_steps else None
            if stopping and len(p.metrics) and not sync(run, p, evaluating=False):
                return
            if saving or stopping:
                p.save(run, done)
            if stopping:
                p.interrupt(stopping)
                return
    p.complete()


def sync(run, p: Progress, evaluating: bool) -> bool:
    """Read the buffered steps (the host sync), check every one for divergence, evaluate on the
    fixed validation batches when ``evaluating``, log the rows. False when the run diverged."""
    rows, diverged = p.metrics.flush()
    if diverged is not None:
        p.log_rows(rows, last_logged=True)
        p.diverge(diverged)
        return False
    if evaluating:
        p.val_loss = evaluate(run.eval_fwd, run.sampler, run.cfg.eval_batches, run.autocast)
        rows[-1][p.val_key] = p.val_loss
    p.log_rows(rows, last_logged=evaluating)
    return True
