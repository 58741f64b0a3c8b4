"""A run's bookkeeping around the loop: its summary, metric sinks, step timer, metric buffer,
progress bar, checkpoints, the stop decisions (signals, ``max_time_s``), training samples, and the
``summary.json`` written whatever the outcome.

:func:`open_run` starts it (after ``build_run``'s checks passed), :class:`Progress` is what the loop
updates, :func:`finish` writes the summary (``summary.py``) and closes the sinks.

The time budget's clock, ``Progress.train_time_s``: the sum of the training steps' wall times as
the step timer measures them (``tracking.StepTimer``: from before the step's first forward to
after its optimizer step), every step counted, warm-up and diagnosed ones too; evaluation,
checkpoints, samples, logging and the host syncs between steps are not. It is kept in checkpoints,
so a resumed run continues the same clock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from normlab.config import RunOptions
from normlab.config.schedule import norm_tag
from normlab.data.corpus import DataError
from normlab.training import distributed
from normlab.training.checkpoint import CKPT_DIR, save_checkpoint
from normlab.training.diagnostics import ZERO_ROWS_SUFFIX
from normlab.training.evaluation import training_sample
from normlab.training.metrics import DIAG_PREFIX, NAMES, Divergence, Limits, MetricsBuffer
from normlab.training.peak import resolve_peak
from normlab.training.resume import rng_state
from normlab.training.step import Run
from normlab.training.summary import outcome_keys, start_summary, write_summary
from normlab.training.tracking import MetricsLogger, NoSink, StepTimer, variant_label

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """What the loop updates: ``step`` (0-based, being worked on), ``done`` (steps done), the last
    evaluation (``val_loss``, and ``val_row``: its ``val/`` keys), the training time, the metric
    buffer and timer, the summary; and where rows, samples and checkpoints go."""

    run_dir: Path
    opts: RunOptions
    summary: dict[str, Any]
    sink: MetricsLogger | NoSink
    timer: StepTimer
    metrics: MetricsBuffer
    bar: Any
    t_start: float
    wall_before: float = 0.0
    val_loss: float | None = None
    step: int = 0
    done: int = 0
    log_interval: int = 1
    diag_interval: int | None = None
    max_skipped_fraction: float | None = None
    val_row: dict[str, Any] = field(default_factory=dict)
    train_time_s: float = 0.0  # the max_time_s clock (module docstring)
    sample_interval: int | None = None
    tokenizer: Any = None  # for samples, loaded at the first one

    def diag_due(self, done: int) -> bool:
        return bool(self.diag_interval) and done % self.diag_interval == 0

    def log_due(self, done: int) -> bool:
        return done % self.log_interval == 0

    @staticmethod
    def ckpt_due(done: int, interval: int) -> bool:
        return bool(interval) and done % interval == 0

    def sample_due(self, done: int, last: bool) -> bool:
        return bool(self.sample_interval) and (done % self.sample_interval == 0 or last)

    def set_eval(self, row: dict[str, Any]) -> None:
        """Keep an evaluation's ``val/`` keys (:func:`~normlab.training.evaluation.eval_row`)."""
        self.val_row, self.val_loss = row, row[NAMES["val_loss"]]

    def log_initial_eval(self, row: dict[str, Any]) -> None:
        """Log the evaluation of the initial model as the row of step 0 (training time 0)."""
        self.set_eval(row)
        self.sink.log({"step": 0, NAMES["train_time_s"]: 0.0, **row})
        self.bar.set_postfix(val=f"{self.val_loss:.3f}")

    def out_of_time(self, max_time_s: float | None) -> bool:
        """The time budget is spent on any rank (an all-reduce with a budget and several ranks)."""
        late = max_time_s is not None and self.train_time_s >= max_time_s
        return max_time_s is not None and bool(distributed.all_reduce_max(int(late)))

    def sample(self, run: Run, done: int) -> None:
        """A text sample after step ``done`` (rank 0) to train.log and the sink's table."""
        if not distributed.is_main() or not self.sample_interval:
            return
        try:
            self.tokenizer = self.tokenizer or run.data.load_tokenizer()
        except DataError as e:  # samples never stop training
            log.warning("no samples: the tokenizer cannot be loaded (%s)", e)
            self.sample_interval = None
            return
        prompt, text = training_sample(run, self.tokenizer)
        log.info("sample after step %d (prompt %r):\n%s", done, prompt, text)
        self.sink.log_sample(done, prompt, text)

    def log_rows(self, rows: list[dict[str, Any]], last_logged: bool) -> None:
        """Log the rows of log steps (and the last row when ``last_logged``); move the bar; flag the
        first diagnosed step where a norm zeroed rows (``summary["norm_zero_rows"]``)."""
        for i, row in enumerate(rows):
            self._flag_zero_rows(row)
            if self.log_due(row["step"]) or (last_logged and i == len(rows) - 1):
                self.sink.log(row)
        if rows:
            last = rows[-1]
            self.bar.update(last["step"] - self.bar.n)
            val = f"{self.val_loss:.3f}" if self.val_loss is not None else "-"
            tok_s = f"{last[NAMES['tokens_per_s']]:.0f}"
            self.bar.set_postfix(loss=f"{last[NAMES['loss']]:.3f}", val=val, tok_s=tok_s)

    def _flag_zero_rows(self, row: dict[str, Any]) -> None:
        if "norm_zero_rows" in self.summary:
            return
        zeroed = {
            k.removeprefix(DIAG_PREFIX).removesuffix(ZERO_ROWS_SUFFIX): v
            for k, v in row.items()
            if k.endswith(ZERO_ROWS_SUFFIX) and v
        }
        if zeroed:
            self.summary["norm_zero_rows"] = {"step": row["step"], "rows": zeroed}
            log.warning(
                "step %d: norms output exact-zero rows from non-zero input (an overflowed "
                "statistic): %s",
                row["step"],
                zeroed,
            )

    def diverge(self, d: Divergence) -> None:
        self.summary.update(
            status="diverged",
            diverged_at_step=d.step,
            diverged_reason=d.reason,
            last_finite_loss=d.last_finite_loss,
        )
        log.error("run diverged at step %d: %s", d.step, d.reason)

    def interrupt(self, signal_name: str) -> None:
        self.summary.update(status="interrupted", signal=signal_name, interrupted_at_step=self.done)
        log.warning(
            "%s received: stopped after step %d with a checkpoint; resume=auto continues",
            signal_name,
            self.done,
        )

    def complete(self, stopped_by: str = "max_steps") -> None:
        """The loop reached ``max_steps`` or the time budget (``stopped_by``): ``completed``, unless
        the fp16 grad scaler skipped every optimizer step or more than ``max_skipped_fraction`` of
        them (then ``diverged``)."""
        skipped, steps, frac = self.metrics.skipped_steps, self.done, self.max_skipped_fraction
        if skipped and (skipped >= steps or (frac is not None and skipped > frac * steps)):
            limit = "every step" if frac is None else f"max_skipped_fraction={frac:g}"
            self.summary.update(
                status="diverged",
                diverged_at_step=steps,
                diverged_reason=(
                    f"the fp16 grad scaler skipped {skipped} of {steps} optimizer steps "
                    f"(non-finite gradients; limit: {limit})"
                ),
                last_finite_loss=self.metrics.last_finite_loss,
            )
            log.error("run did not train: %s", self.summary["diverged_reason"])
            return
        self.summary.update(status="completed", stopped_by=stopped_by)

    def save(self, run: Run, done: int) -> None:
        """Checkpoint after step ``done`` (rank 0 writes; every rank's RNG state goes in it);
        a failure is logged, the run goes on, older ones stay."""
        rngs = distributed.all_gather(rng_state())
        if not distributed.is_main():
            return
        state = {
            "step": done,
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict(),
            "rng": rngs[0],
            "rng_ranks": rngs if len(rngs) > 1 else None,
            "sampler": {"step": done, "seed": run.cfg.seed},
            "config": run.config_dict,
            "config_hash": self.summary["config_hash"],
            "wandb_run_id": self.sink.wandb_run_id,
            "val_loss": self.val_loss,
            "val_row": self.val_row,
            "train_time_s": self.train_time_s,
            "last_finite_loss": self.metrics.last_finite_loss,
            "first_loss": self.metrics.first_loss,
            "skipped_steps": self.metrics.skipped_steps,
            "step_times_ms": list(self.timer.measured_ms),
            "wall_time_s": self.wall_time_s(),
        }
        try:
            path = save_checkpoint(self.run_dir / CKPT_DIR, state, self.opts.ckpt_keep)
            log.info("checkpoint %s", path)
        except OSError as e:
            log.error(
                "could not save the checkpoint of step %d (%s); the previous one stays", done, e
            )

    def wall_time_s(self) -> float:
        return self.wall_before + time.perf_counter() - self.t_start


def open_run(run: Run, run_dir: Path, opts: RunOptions) -> Progress:
    """Start a run's bookkeeping: summary, metrics sinks (rank 0), timer, metric buffer, bar; then
    restore (resumed run) or derive (ranks > 0) the RNG streams, last: wandb may draw numbers."""
    t_start = time.perf_counter()
    cfg, state, main, world = run.cfg, run.state, distributed.is_main(), distributed.world_size()
    summary = start_summary(run, opts)
    log.info(
        "model %s: %.2fM parameters, norm %s/%s (design %s) on %s%s",
        cfg.model.name,
        summary["params"] / 1e6,
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
        run.scaler.is_enabled(), opts.max_loss, cfg.divergence_factor, cfg.model.vocab_size
    )
    metrics = MetricsBuffer(
        cfg.optim.grad_accum,
        cfg.tokens_per_step,
        limits,
        first_loss=state.get("first_loss"),
        last_finite_loss=state.get("last_finite_loss"),
        skipped_steps=state.get("skipped_steps", 0),
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
    if run.resume:  # last: model building and wandb above may draw random numbers
        distributed.restore_rank_rng(state.get("rng_ranks") or [state["rng"]], cfg.seed, run.start)
    else:
        distributed.seed_rank(cfg.seed, run.start)  # ranks > 0: their own dropout masks
    p = Progress(run_dir, opts, summary, sink, timer, metrics, bar, t_start)
    p.wall_before, p.val_loss = state.get("wall_time_s", 0.0), state.get("val_loss")
    p.val_row, p.train_time_s = state.get("val_row") or {}, state.get("train_time_s", 0.0)
    p.sample_interval = cfg.sample_interval
    p.step = p.done = run.start
    p.log_interval, p.diag_interval = cfg.log_interval, cfg.diag_interval
    p.max_skipped_fraction = cfg.max_skipped_fraction
    run.state = {"step": run.start}  # free the checkpoint's RNG states and the rest
    return p


def finish(run: Run, p: Progress, run_dir: Path) -> None:
    """Complete the summary, write ``summary.json`` (rank 0) and close the sinks, whatever
    failed."""
    p.bar.close()
    status, world = p.summary["status"], distributed.world_size()
    tokens_per_step = run.cfg.tokens_per_step  # global: every rank's micro-batches
    flops_per_step = run.model.flops_per_token() * tokens_per_step
    peak = resolve_peak(run.cfg.peak_tflops, run.device, run.cfg.precision.dtype.name)
    p.summary.update(outcome_keys(run, p))
    p.summary.update(
        **peak,
        steps_completed=p.step if status == "failed" else p.done,
        final_val_loss=p.val_loss if status == "completed" else None,
        last_val_loss=p.val_loss,
        skipped_steps=p.metrics.skipped_steps,
        wall_time_s=p.wall_time_s(),
        step_times_ms=p.timer.measured_ms,
        # MFU per device
        **p.timer.summary(tokens_per_step, flops_per_step, peak["peak_tflops"] * world),
    )
    try:
        if distributed.is_main():
            write_summary(run_dir, p.summary)
    finally:
        p.sink.finish(p.summary, exit_code=0 if status == "completed" else 1)
