"""``train(cfg, run_dir, opts) -> summary``: one training run, no Hydra inside.

``setup.build_run`` does every refusing check; ``train_loop`` is the loop, read top to bottom.
Per-step metrics stay on the device until a sync, where the host reads them once and checks each
step for divergence. The run ends at ``max_steps`` or once ``max_time_s`` is spent, and
``summary.json`` is written whatever the outcome. Under ``torchrun`` every rank runs this; only
rank 0 writes.

Why: docs/running.md
"""

from __future__ import annotations

import logging
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from normlab.config import ConfigError, RunOptions, TrainConfig
from normlab.config.schedule import norm_tag
from normlab.data.corpus import DataError
from normlab.training import distributed
from normlab.training import step as training_step
from normlab.training.anneal import Annealer, open_annealer
from normlab.training.checkpoint import CKPT_DIR, save_checkpoint
from normlab.training.diagnostics import ActivationRecorder, gain_stats
from normlab.training.lock import own_run_dir
from normlab.training.metrics import NAMES, Limits, MetricsBuffer, SpikeCounter
from normlab.training.precision import calibration_skips_max
from normlab.training.record import RunRecord, failed_summary, start_record, write_summary
from normlab.training.resume import rng_state
from normlab.training.setup import (
    Run,
    build_run,
    describe_error,
    forbid_eager_fallback,
    free_memory,
)
from normlab.training.step import lr_at
from normlab.training.tracking import MetricsLogger, NoSink, StepTimer, variant_label
from normlab.training.validation import TextSamples, eval_row

__all__ = ["RunOptions", "train"]

log = logging.getLogger(__name__)


def train(
    cfg: TrainConfig, run_dir: Path, opts: RunOptions | None = None, downstream: Any = None
) -> dict[str, Any]:
    """Train as ``cfg`` says into ``run_dir`` (owned by this process: ``lock.own_run_dir``);
    returns the summary, ``status`` completed, diverged, interrupted or failed (re-raised).
    Raises ConfigError, DataError (nothing written) and RunDirBusy (another process owns it)."""
    opts = opts or RunOptions()
    # downstream: the DownstreamEval of cfg.eval_tasks (required with them, refused without)
    try:
        with own_run_dir(run_dir):
            run, record, metrics, timer, out = start(cfg, run_dir, opts, downstream)
            try:
                train_loop(run, record, metrics, timer, out)
            except KeyboardInterrupt:
                record.interrupt("SIGINT", checkpointed=False)
                raise
            except Exception as e:
                record.fail(describe_error(e), traceback.format_exc())
                raise
            finally:
                finish(run, record, metrics, timer, out)
            return record.summary
    finally:
        free_memory()  # here only, whatever the outcome


def start(
    cfg: TrainConfig, run_dir: Path, opts: RunOptions, downstream: Any
) -> tuple[Run, RunRecord, MetricsBuffer, StepTimer, Outputs]:
    """``build_run``, then ``open_run``; a failure but a refusal writes a ``failed`` summary."""
    try:
        run = build_run(cfg, run_dir, opts, downstream)
        return (run, *open_run(run, run_dir, opts))
    except (ConfigError, DataError):
        raise
    except Exception as e:
        if distributed.is_main():
            summary = failed_summary(cfg, opts, describe_error(e), traceback.format_exc())
            try:
                write_summary(run_dir, summary)
            except OSError as write_error:  # the run's own exception is the one to see
                log.error("could not write %s/summary.json (%s)", run_dir, write_error)
        raise


def train_loop(
    run: Run, record: RunRecord, metrics: MetricsBuffer, timer: StepTimer, out: Outputs
) -> None:
    """The loop: from ``run.start`` to ``max_steps`` or the ``max_time_s`` budget; sets the
    record's status at its end (``completed``, ``diverged`` or ``interrupted``)."""
    cfg, progress = run.cfg, record.progress
    # compilation never falls back to eager silently, for this run's steps only (no global change)
    with distributed.StopSignals() as stop, forbid_eager_fallback(cfg):
        if run.start == 0:  # the curves start at the initial model (a resumed run logged it)
            out.log_initial_eval(record, eval_row(run))
        out.anneal.after_step(run, run.start, stop)  # a branch a signal cut before this resume
        for step in range(run.start, cfg.max_steps):
            progress.step = step
            # schedule (over max_steps, whatever the time budget); diagnostics every diag_interval
            lr = lr_at(step, cfg.max_steps, cfg.optim)
            diag = ActivationRecorder() if due(step + 1, cfg.diag_interval) else None
            # the step: micro-batches forward + backward, unscale, clip, AdamW (no host sync)
            timer.start()
            loss_sum, grad_norm = training_step.train_step(run, step, lr, diag)
            ms = timer.stop(record=diag is None)  # diagnosed steps are slower: not timed
            progress.done = done = step + 1
            progress.train_time_s += ms / 1e3  # the max_time_s clock: training steps only
            extra = {**diag.stats, **gain_stats(run.model)} if diag is not None else None
            metrics.add(done, loss_sum, grad_norm, lr, ms, extra, progress.train_time_s)
            # the time budget, spent on any rank, makes this step the last (evaluated, saved)
            last = done == cfg.max_steps or out_of_time(progress.train_time_s, cfg.max_time_s)
            # sync on log steps and before an evaluation or a checkpoint: read, check, log
            evaluating = done % cfg.eval_interval == 0 or last
            saving = last or due(done, out.ckpt_interval)
            branching = bool(out.anneal.due(done))  # a branch starts from a checked state
            syncing = due(done, cfg.log_interval) or evaluating or saving or branching
            if syncing and not sync(run, record, metrics, out, evaluating):
                return  # diverged
            # cool-down branches (optim.anneal_at): annealed points; the run goes on unchanged
            out.anneal.after_step(run, done, stop)
            # a signal to any rank stops them all here, after a checkpoint
            code = distributed.all_reduce_max(stop.code)
            stopping = signal.Signals(code).name if code and not last else None
            if stopping and len(metrics) and not sync(run, record, metrics, out, False):
                return
            # checkpoint, text sample; then stop on a signal or after the last step
            if saving or stopping:
                out.save(run, record, metrics, timer)
            if out.samples.due(done, last):
                out.samples.write(run, done)
            if stopping:
                record.interrupt(stopping)
                return
            if last:
                break
    stopped_by = "max_time_s" if progress.done < cfg.max_steps else "max_steps"
    record.complete(stopped_by, metrics, cfg.max_skipped_fraction)
    if record.status == "completed" and stopped_by == "max_steps":
        out.anneal.complete(run, progress.val_row)  # wsd: the budget max_steps point


def due(done: int, interval: int | None) -> bool:
    """Whether something done every ``interval`` steps (None or 0: never) is due after ``done``."""
    return bool(interval) and done % interval == 0


def out_of_time(train_time_s: float, max_time_s: float | None) -> bool:
    """The time budget is spent on any rank (an all-reduce with a budget and several ranks)."""
    late = max_time_s is not None and train_time_s >= max_time_s
    return max_time_s is not None and bool(distributed.all_reduce_max(int(late)))


def sync(
    run: Run, record: RunRecord, metrics: MetricsBuffer, out: Outputs, evaluating: bool
) -> bool:
    """Read the buffered steps (the host sync), check each for divergence, evaluate when
    ``evaluating``, log the rows; False when the run diverged."""
    rows, diverged = metrics.flush()
    if diverged is not None:
        out.log_rows(record, rows, last_logged=True)
        record.diverge(diverged)
        return False
    if evaluating:
        record.progress.set_eval(eval_row(run))
        rows[-1].update(record.progress.val_row)
    out.log_rows(record, rows, last_logged=evaluating)
    return True


@dataclass
class Outputs:
    """Where a run's outputs go: rows to ``sink`` (``metrics.jsonl`` and wandb; none on ranks > 0),
    the ``bar``, text ``samples``, checkpoints (the newest ``ckpt_keep``), annealed points."""

    run_dir: Path
    sink: MetricsLogger | NoSink
    bar: Any  # tqdm
    samples: TextSamples
    log_interval: int
    ckpt_interval: int
    ckpt_keep: int
    anneal: Annealer

    def log_initial_eval(self, record: RunRecord, row: dict[str, Any]) -> None:
        """Log the evaluation of the initial model as the row of step 0 (training time 0)."""
        record.progress.set_eval(row)
        self.sink.log({"step": 0, NAMES["train_time_s"]: 0.0, **row})
        self.bar.set_postfix(val=f"{record.progress.val_loss:.3f}")

    def log_rows(self, record: RunRecord, rows: list[dict[str, Any]], last_logged: bool) -> None:
        """Log the rows of log steps (and the last when ``last_logged``), move the bar, flag zeroed
        norm rows (``RunRecord.flag_zero_rows``)."""
        for i, row in enumerate(rows):
            record.flag_zero_rows(row)
            if due(row["step"], self.log_interval) or (last_logged and i == len(rows) - 1):
                self.sink.log(row)
        if rows:
            last, val_loss = rows[-1], record.progress.val_loss
            self.bar.update(last["step"] - self.bar.n)
            val = f"{val_loss:.3f}" if val_loss is not None else "-"
            tok_s = f"{last[NAMES['tokens_per_s']]:.0f}"
            self.bar.set_postfix(loss=f"{last[NAMES['loss']]:.3f}", val=val, tok_s=tok_s)

    def save(self, run: Run, record: RunRecord, metrics: MetricsBuffer, timer: StepTimer) -> None:
        """Checkpoint after step ``record.progress.done`` (rank 0 writes; every rank's RNG state
        goes in it); a failure is logged, the run goes on, older ones stay."""
        rngs = distributed.all_gather(rng_state())
        if not distributed.is_main():
            return
        p = record.progress
        state = {
            "step": p.done,
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict(),
            "rng": rngs[0],
            "rng_ranks": rngs if len(rngs) > 1 else None,
            "sampler": {"step": p.done, "seed": run.cfg.order_seed},
            "config": run.config_dict,
            "config_hash": record.summary["config_hash"],
            "wandb_run_id": self.sink.wandb_run_id,
            "val_loss": p.val_loss,
            "val_row": p.val_row,
            "train_time_s": p.train_time_s,
            "last_finite_loss": metrics.last_finite_loss,
            "first_loss": metrics.first_loss,
            "skipped_steps": metrics.skipped_steps,
            "calibration_skips": metrics.calibration_skips,
            "spikes": metrics.spikes.state(),
            "max_grad_norm": metrics.max_grad_norm,
            "step_times_ms": list(timer.measured_ms),
            "wall_time_s": p.wall_time_s(),
        }
        try:
            path = save_checkpoint(self.run_dir / CKPT_DIR, state, self.ckpt_keep)
            log.info("checkpoint %s", path)
        except OSError as e:
            log.error(
                "could not save the checkpoint of step %d (%s); the previous one stays", p.done, e
            )


def open_run(
    run: Run, run_dir: Path, opts: RunOptions
) -> tuple[RunRecord, MetricsBuffer, StepTimer, Outputs]:
    """A run's record, metric buffer, step timer (a resumed run's from its checkpoint) and outputs;
    then the RNG streams, restored or derived per rank."""
    t_start = time.perf_counter()
    cfg, state, main, world = run.cfg, run.state, distributed.is_main(), distributed.world_size()
    record = start_record(run, opts, t_start)
    log.info(
        "model %s: %.2fM parameters, norm %s/%s (design %s) on %s%s",
        cfg.model.name,
        record.summary["params"] / 1e6,
        cfg.norm.kind.name,
        cfg.norm.impl.name,
        norm_tag(run.config_dict["norm"]),  # placement, qk, embedding, schedule, positions
        run.device,
        f" x {world} processes" if world > 1 else "",
    )
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        resume_step = run.start if run.resume else None
        sink = MetricsLogger(run_dir, cfg, run.config_dict, resume_step, state.get("wandb_run_id"))
    else:
        sink = NoSink()
    limits = Limits(
        scaler_enabled=run.scaler.is_enabled(),
        scaler_calibration=calibration_skips_max(cfg.precision),
        max_loss=opts.max_loss,
        divergence_factor=cfg.divergence_factor,
        vocab_size=cfg.model.vocab_size,
    )
    metrics = MetricsBuffer(
        grad_accum=cfg.optim.grad_accum,
        tokens_per_step=cfg.tokens_per_step,
        limits=limits,
        first_loss=state.get("first_loss"),
        last_finite_loss=state.get("last_finite_loss"),
        skipped_steps=state.get("skipped_steps", 0),
        calibration_skips=state.get("calibration_skips", 0),
        spikes=SpikeCounter.from_state(state.get("spikes")),
        max_grad_norm=state.get("max_grad_norm"),
    )
    timer = StepTimer(run.device, cfg.timing_warmup_steps, state.get("step_times_ms", []))
    bar = tqdm(
        total=cfg.max_steps,
        initial=run.start,
        desc=variant_label(cfg, opts.swept),
        unit="step",
        disable=not (cfg.progress and main),
        dynamic_ncols=True,
        mininterval=1.0,
    )
    out = Outputs(
        run_dir=run_dir,
        sink=sink,
        bar=bar,
        samples=TextSamples(interval=cfg.sample_interval, sink=sink),
        log_interval=cfg.log_interval,
        ckpt_interval=opts.ckpt_interval,
        ckpt_keep=opts.ckpt_keep,
        anneal=open_annealer(run, run_dir),  # a resumed run's: cut back to its step
    )
    if run.resume:  # last: model building and wandb above may draw random numbers
        distributed.restore_rank_rng(
            state.get("rng_ranks") or [state["rng"]], cfg.weights_seed, run.start
        )
    else:
        distributed.seed_rank(cfg.weights_seed, run.start)  # ranks > 0: their own dropout masks
    run.state = {"step": run.start}  # free the checkpoint's RNG states and the rest
    return record, metrics, timer, out


def finish(
    run: Run, record: RunRecord, metrics: MetricsBuffer, timer: StepTimer, out: Outputs
) -> None:
    """Close the record, write ``summary.json`` (rank 0) and close the sinks, whatever failed."""
    out.bar.close()
    if out.anneal.enabled:
        record.set_annealed(out.anneal.points)
    summary = record.close(run, timer, metrics)
    try:
        if distributed.is_main():
            write_summary(out.run_dir, summary)
    finally:
        out.sink.finish(summary, exit_code=0 if record.status == "completed" else 1)
