"""The run record: where a run is (``Progress``), its status, and ``summary.json``.

``RunRecord`` is the one writer of ``status``: ``running`` (``start_record``), then exactly one of
``complete`` (``completed``, or ``diverged`` for too many fp16 scaler skips), ``diverge``,
``interrupt`` or ``fail``; ``close`` adds the outcome's keys and ``write_summary`` writes the file
atomically. A run that fails before its record exists gets ``failed_summary``.

Why, and every key of summary.json: docs/running.md
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.config import RunOptions, TrainConfig, to_plain
from normlab.norms.backends import impl_class, kernel_backend
from normlab.training import distributed
from normlab.training.diagnostics import ZERO_ROWS_SUFFIX, named_norms
from normlab.training.metrics import DIAG_PREFIX, NAMES, Divergence, MetricsBuffer
from normlab.training.peak import resolve_peak
from normlab.training.resume import config_hash
from normlab.training.setup import Run, versions
from normlab.training.tracking import StepTimer
from normlab.training.validation import final_eval

log = logging.getLogger(__name__)

#: Every status a run can have; ``running`` until the loop ends one way or another.
STATUSES = ("running", "completed", "diverged", "interrupted", "failed")


@dataclass
class Progress:
    """Where the loop is: ``step`` (0-based, in progress), ``done`` (steps done), the ``max_time_s``
    clock, the last evaluation's ``val/`` keys, and wall time: previous processes' (``wall_before``)
    plus this one's since ``t_start`` (``time.perf_counter``)."""

    step: int
    done: int
    train_time_s: float
    val_loss: float | None
    val_row: dict[str, Any]
    wall_before: float
    t_start: float

    def set_eval(self, row: dict[str, Any]) -> None:
        """Keep an evaluation's ``val/`` keys (``validation.eval_row``)."""
        self.val_row, self.val_loss = row, row[NAMES["val_loss"]]

    def wall_time_s(self) -> float:
        return self.wall_before + time.perf_counter() - self.t_start


@dataclass
class RunRecord:
    """A run's progress and its summary (``summary.json``); the status is set only here."""

    progress: Progress
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.summary["status"]

    def _set(self, status: str, **keys: Any) -> None:
        assert status in STATUSES, status
        self.summary.update(status=status, **keys)

    def diverge(self, d: Divergence) -> None:
        """A step counted as divergence (``metrics.Limits``): ``diverged``."""
        self._set(
            "diverged",
            diverged_at_step=d.step,
            diverged_reason=d.reason,
            last_finite_loss=d.last_finite_loss,
        )
        log.error("run diverged at step %d: %s", d.step, d.reason)

    def interrupt(self, signal_name: str, checkpointed: bool = True) -> None:
        """A signal stopped the run after step ``progress.done``: ``interrupted``; not
        ``checkpointed`` for a KeyboardInterrupt outside the loop's handler."""
        done = self.progress.done
        self._set("interrupted", signal=signal_name, interrupted_at_step=done)
        if checkpointed:
            log.warning(
                "%s received: stopped after step %d with a checkpoint; resume=auto continues",
                signal_name,
                done,
            )

    def fail(self, error: str, traceback: str) -> None:
        """An exception ended the run during step ``progress.step + 1``: ``failed``."""
        self._set("failed", error=error, failed_at_step=self.progress.step + 1, traceback=traceback)

    def complete(
        self, stopped_by: str, metrics: MetricsBuffer, max_skipped_fraction: float | None
    ) -> None:
        """``completed`` at ``max_steps`` or the time budget (``stopped_by``); ``diverged`` if the
        fp16 scaler skipped every step or over ``max_skipped_fraction`` after its calibration."""
        skipped, steps, frac = metrics.skipped_steps, self.progress.done, max_skipped_fraction
        calib = metrics.calibration_skips  # the scale halving down from init_scale: not counted
        counted, after = skipped - calib, steps - calib  # the steps after the calibration
        if skipped and (skipped >= steps or (frac is not None and counted > frac * after)):
            limit = "every step" if frac is None else f"max_skipped_fraction={frac:g}"
            of = f"{skipped} of {steps}" if skipped >= steps else f"{counted} of {after}"
            calibration = f" after its start-up calibration ({calib} skips)" if calib else ""
            self._set(
                "diverged",
                diverged_at_step=steps,
                diverged_reason=(
                    f"the fp16 grad scaler skipped {of} optimizer steps{calibration} "
                    f"(non-finite gradients; limit: {limit})"
                ),
                last_finite_loss=metrics.last_finite_loss,
            )
            log.error("run did not train: %s", self.summary["diverged_reason"])
            return
        self._set("completed", stopped_by=stopped_by)

    def set_annealed(self, points: list[dict[str, Any]]) -> None:
        """``summary["annealed"]``: ``{"budget_steps", "val_loss", "val_bpb"}`` of each annealed
        point (``anneal.py``; null losses for a diverged branch), sorted by budget."""
        self.summary["annealed"] = [
            {
                "budget_steps": p["budget_steps"],
                "val_loss": p.get(NAMES["val_loss"]),
                "val_bpb": p.get(NAMES["val_bpb"]),
            }
            for p in sorted(points, key=lambda p: p["budget_steps"])
        ]

    def flag_zero_rows(self, row: dict[str, Any]) -> None:
        """Record the first diagnosed step where a norm output exact-zero rows from non-zero input
        (``summary["norm_zero_rows"]``: an overflowed statistic), with a warning."""
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

    def close(self, run: Run, timer: StepTimer, metrics: MetricsBuffer) -> dict[str, Any]:
        """Add the keys of the outcome, whatever it was; returns the summary."""
        p, status, world = self.progress, self.status, distributed.world_size()
        completed = status == "completed"
        steps = p.step if status == "failed" else p.done
        tokens_per_step = run.cfg.tokens_per_step  # global: every rank's micro-batches
        flops_per_step = run.model.flops_per_token() * tokens_per_step
        peak = resolve_peak(run.cfg.peak_tflops, run.device, run.cfg.precision.dtype.name)
        self.summary.update(
            steps_done=steps,
            stopped_by=self.summary.get("stopped_by") if completed else None,
            train_time_s=p.train_time_s,
            final_val_bpb=p.val_row.get(NAMES["val_bpb"]) if completed else None,
            final_eval=final_eval(p.val_row, [s.name for s in run.evals]) if completed else None,
            **peak,
            steps_completed=steps,
            final_val_loss=p.val_loss if completed else None,
            last_val_loss=p.val_loss,
            skipped_steps=metrics.skipped_steps,
            calibration_skips=metrics.calibration_skips,
            loss_spikes=metrics.spikes.count,
            loss_spike_steps=metrics.spikes.steps,
            loss_spike_rule={"window": metrics.spikes.window, "k": metrics.spikes.k},
            max_grad_norm=metrics.max_grad_norm,
            final_downstream=_downstream(run) if completed else None,
            wall_time_s=p.wall_time_s(),
            step_times_ms=timer.measured_ms,
            # MFU per device
            **timer.summary(tokens_per_step, flops_per_step, peak["peak_tflops"] * world),
        )
        return self.summary


def start_record(run: Run, opts: RunOptions, t_start: float) -> RunRecord:
    """The record of a starting run (``status: running``), a resumed run's from ``run.state``."""
    cfg, state = run.cfg, run.state
    summary: dict[str, Any] = {
        "status": "running",
        "seed": cfg.seed,
        "init_seed": cfg.weights_seed,
        "data_seed": cfg.order_seed,
        "max_steps": cfg.max_steps,
        "max_time_s": cfg.max_time_s,
        "tokens_per_step": cfg.tokens_per_step,
        "norm": run.config_dict["norm"],
        "norm_impl": cfg.norm.impl.name,
        "precision": cfg.precision.dtype.name,
        "params": run.model.num_params(),
        "device": str(run.device),
        "world_size": distributed.world_size(),
        "versions": versions(run.device, cfg.compile),
        "preflight": run.preflight,
        "kernels": kernels_record(run.model, run.device, cfg.compile),
        "data": {**_data_record(run.data), "tokenizer_digest": run.data.tokenizer_digest()},
        "eval_data": {s.name: _data_record(s.data) for s in run.evals},
        "config": run.config_dict,
        "config_hash": config_hash(run.config_dict),
        "run_options": dataclasses.asdict(opts),
    }
    if run.resume:
        summary["resumed"] = {
            "from_step": run.start,
            "checkpoint": run.resume.path.name,
            "skipped": run.resume.skipped,
            "forced_config_diff": run.forced_diff,
        }
        log.info("resuming from %s at step %d", run.resume.path, run.start)
    progress = Progress(
        step=run.start,
        done=run.start,
        train_time_s=state.get("train_time_s", 0.0),
        val_loss=state.get("val_loss"),
        val_row=state.get("val_row") or {},
        wall_before=state.get("wall_time_s", 0.0),
        t_start=t_start,
    )
    return RunRecord(progress=progress, summary=summary)


def failed_summary(
    cfg: TrainConfig, opts: RunOptions, error: str, traceback: str
) -> dict[str, Any]:
    """The summary of a run that failed before its record existed: ``failed`` with ``error``,
    ``traceback`` and its config, no step."""
    config = to_plain(cfg)
    summary: dict[str, Any] = {
        "status": "failed",
        "error": error,
        "failed_at_step": None,
        "seed": cfg.seed,
        "max_steps": cfg.max_steps,
        "config": config,
        "config_hash": config_hash(config),
        "run_options": dataclasses.asdict(opts),
        "traceback": traceback,
    }
    assert summary["status"] in STATUSES
    return summary


def kernels_record(model, device, compiled: bool) -> dict[str, dict[str, str]]:
    """``summary.json``'s ``kernels`` of a ``GPT``: ``{position: {"impl_class", "backend"}}``
    (``backends.kernel_backend``, detected by availability); a block whose norm differs from the
    position's first adds ``"<pos> (block i)"``."""
    out: dict[str, dict[str, str]] = {}
    for name, _, module in named_norms(model):
        where, _, pos = name.rpartition("/")
        block = where.removeprefix("block") if where.startswith("block") else None
        pos = pos if block is not None else where  # embedding/norm -> embedding
        entry = {
            "impl_class": impl_class(module),
            "backend": kernel_backend(module, device, compiled),
        }
        key = pos if out.get(pos, entry) == entry else f"{pos} (block {block})"
        out.setdefault(key, entry)
    return out


def _downstream(run: Run) -> dict[str, dict[str, Any]]:
    """``{task: TaskResult as a dict}`` of the last evaluation (``eval_tasks``; empty without)."""
    results = run.downstream.results if run.downstream is not None else []
    return {r.task: r.as_dict() for r in results}


def _data_record(data) -> dict[str, Any]:
    return {
        "cache": str(data.directory),
        "tokens": data.meta["tokens"],
        "bytes_per_token": data.val_bytes_per_token,
    }


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` atomically: a kill while writing leaves the previous one."""
    tmp = run_dir / f".summary.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, run_dir / "summary.json")
