"""``train(cfg, run_dir, opts) -> summary``: one training run, no Hydra inside.

``setup.build_run`` does every refusing check and builds the run; :func:`train_loop` below is the
loop, read top to bottom. Per-step metrics stay on the device (``metrics.py``) until a log step,
an evaluation, a checkpoint or the end, where the host reads them once and checks every step for
divergence. Before the first step (the row of step 0), every ``eval_interval`` steps and at the
end the model is evaluated on the same fixed validation batches and those of the held-out corpora
(``evaluation.py``: loss and bits per byte); every ``ckpt_interval`` steps, at the end, and when
SIGTERM, SIGINT or SIGUSR2 (submitit's warning) arrives a checkpoint is saved; every
``sample_interval`` steps and at the end a text sample is logged. ``summary.json`` is written
whatever the outcome (``run_state.py``, ``summary.py``).

The end is ``max_steps``, or the time budget ``max_time_s`` (training-step seconds, the clock of
``run_state.py``): once spent, the step that spent it is the last, evaluated and checkpointed, and
the run completes (``stopped_by: max_time_s``). The learning-rate schedule stays the one over
``max_steps``: a budget cuts it short, it does not compress it (so runs of one config with
different budgets take identical steps up to where each stops).

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
from normlab.training.evaluation import eval_row
from normlab.training.run_state import Progress, finish, open_run
from normlab.training.setup import build_run, describe_error, free_memory
from normlab.training.step import lr_at

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
    """The loop: from ``run.start`` to ``max_steps`` or the ``max_time_s`` budget; sets
    ``p.summary["status"]`` at its end."""
    cfg = run.cfg
    with distributed.StopSignals() as stop:
        if run.start == 0:  # the curves start at the initial model (a resumed run logged it)
            p.log_initial_eval(eval_row(run))
        for step in range(run.start, cfg.max_steps):
            p.step = step
            # schedule (over max_steps, whatever the time budget); diagnostics every diag_interval
            lr = lr_at(step, cfg.max_steps, cfg.optim)
            diag = ActivationRecorder() if p.diag_due(step + 1) else None
            # the step: micro-batches forward + backward, unscale, clip, AdamW (no host sync)
            p.timer.start()
            loss_sum, grad_norm = training_step.train_step(run, step, lr, diag)
            ms = p.timer.stop(record=diag is None)  # diagnosed steps are slower: not timed
            p.done = done = step + 1
            p.train_time_s += ms / 1e3  # the max_time_s clock: training steps only
            extra = {**diag.stats, **gain_stats(run.model)} if diag is not None else None
            p.metrics.add(done, loss_sum, grad_norm, lr, ms, extra, p.train_time_s)
            # the time budget, spent on any rank, makes this step the last (evaluated, saved)
            last = done == cfg.max_steps or p.out_of_time(cfg.max_time_s)
            # sync on log steps and before an evaluation or a checkpoint: read, check, log
            evaluating = done % cfg.eval_interval == 0 or last
            saving = last or p.ckpt_due(done, opts.ckpt_interval)
            if (p.log_due(done) or evaluating or saving) and not sync(run, p, evaluating):
                return  # diverged
            # a signal to any rank stops them all here, after a checkpoint
            code = distributed.all_reduce_max(stop.code)
            stopping = signal.Signals(code).name if code and not last else None
            if stopping and len(p.metrics) and not sync(run, p, evaluating=False):
                return
            if saving or stopping:
                p.save(run, done)
            if p.sample_due(done, last):
                p.sample(run, done)
            if stopping:
                p.interrupt(stopping)
                return
            if last:
                break
    p.complete("max_time_s" if p.done < cfg.max_steps else "max_steps")


def sync(run, p: Progress, evaluating: bool) -> bool:
    """Read the buffered steps (the host sync), check every one for divergence, evaluate on the
    fixed validation batches (and the held-out corpora's) when ``evaluating``, log the rows. False
    when the run diverged."""
    rows, diverged = p.metrics.flush()
    if diverged is not None:
        p.log_rows(rows, last_logged=True)
        p.diverge(diverged)
        return False
    if evaluating:
        p.set_eval(eval_row(run))
        rows[-1].update(p.val_row)
    p.log_rows(rows, last_logged=evaluating)
    return True
