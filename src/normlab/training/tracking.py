"""Where metrics go (``metrics.jsonl`` always, wandb when chosen) and how step time is measured.

Logging never stops training: a sink that cannot start or write is logged once and dropped. A
resumed run continues the same wandb run and cuts ``metrics.jsonl`` back to the checkpoint's step
before appending, so every step appears once.

Why: docs/running.md
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normlab.config import LoggerKind, TrainConfig, to_plain
from normlab.config.files import read_rows
from normlab.config.schedule import TAG_KEYS, norm_tag

log = logging.getLogger(__name__)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so a clock read measures it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Wall time per optimizer step in ms, device synchronized at both ends; this process's first
    ``warmup_steps`` are left out; ``previous_ms``: previous processes' measured times."""

    def __init__(
        self, device: torch.device, warmup_steps: int, previous_ms: list[float] | None = None
    ):
        self.device, self.warmup_steps = device, warmup_steps
        self.previous_ms: list[float] = list(previous_ms or [])
        self.times_ms: list[float] = []  # every step this process timed, warm-up included
        self._t0 = 0.0

    def start(self) -> None:
        synchronize(self.device)
        self._t0 = time.perf_counter()

    def stop(self, record: bool = True) -> float:
        """End the step; returns its duration in ms, kept for the summary when ``record``."""
        synchronize(self.device)
        dt = (time.perf_counter() - self._t0) * 1e3
        if record:
            self.times_ms.append(dt)
        return dt

    @property
    def measured_ms(self) -> list[float]:
        """Step times after each process's warm-up, in ms."""
        return self.previous_ms + self.times_ms[self.warmup_steps :]

    def summary(
        self, tokens_per_step: int, flops_per_step: float, peak_tflops: float
    ) -> dict[str, float | None]:
        """Median and p90 step time (ms), tokens/s and MFU (of ``peak_tflops``) at the median."""
        t = self.measured_ms
        if not t:
            return {
                "step_time_ms_median": None,
                "step_time_ms_p90": None,
                "tokens_per_s": None,
                "mfu": None,
            }
        med = float(np.median(t))
        return {
            "step_time_ms_median": med,
            "step_time_ms_p90": float(np.percentile(t, 90)),
            "tokens_per_s": tokens_per_step / (med / 1e3),
            "mfu": flops_per_step / (med / 1e3) / (peak_tflops * 1e12),
        }


def variant_label(cfg: TrainConfig, swept: tuple[str, ...] | list[str] = ()) -> str:
    """The progress bar's name of a run: design tag and precision, the swept ``key=value`` the tag
    does not show, the seed: ``rms-cpp-pre-fp32 optim.lr=0.001 seed=1``."""
    tag = f"{norm_tag(to_plain(cfg.norm), impl=True)}-{cfg.precision.dtype.name}"
    shown = {"norm", "precision", "precision.dtype", "seed"} | {f"norm.{k}" for k in TAG_KEYS}
    extra = [s for s in swept if s.split("=", 1)[0].lstrip("+").split(".positions")[0] not in shown]
    return " ".join([tag, *extra, f"seed={cfg.seed}"])


def run_names(cfg: TrainConfig) -> tuple[str, str]:
    """``(group, name)`` for wandb: the variant (``tiny-layer[0-1:rms]-cpp-peri-qkhead-fp32``)
    unless ``logger.group`` names one, and the variant plus the seed."""
    tag = norm_tag(to_plain(cfg.norm), impl=True)
    variant = "-".join((cfg.model.name, tag, cfg.precision.dtype.name))
    group = cfg.logger.group or variant
    name = cfg.logger.name or f"{variant}-seed{cfg.seed}"
    return group, name


class NoSink:
    """What ranks > 0 log to: nothing (rank 0 writes metrics.jsonl and wandb)."""

    wandb_run_id = None

    def log(self, row: dict[str, Any]) -> None:
        pass

    def log_sample(self, step: int, prompt: str, text: str) -> None:
        pass

    def finish(self, summary: dict[str, Any], exit_code: int = 0) -> None:
        pass


def _finite_or_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


class MetricsLogger:
    """One JSON object per logged step to ``run_dir/metrics.jsonl``, mirrored to wandb; a resumed
    run (``resume_step``) drops rows after it and continues ``wandb_run_id``."""

    def __init__(
        self,
        run_dir: Path,
        cfg: TrainConfig,
        config_dict: dict,
        resume_step: int | None = None,
        wandb_run_id: str | None = None,
    ):
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            truncate_metrics(self.path, resume_step)
        self._file = self.path.open("a" if resume_step is not None else "w", buffering=1)
        self._write_failed = False
        self._wandb_run = None
        self._samples: list[list[Any]] = []
        if cfg.logger.kind == LoggerKind.wandb:
            self._wandb_run = self._start_wandb(run_dir, cfg, config_dict, wandb_run_id)
        self.wandb_run_id: str | None = (
            self._wandb_run.id if self._wandb_run is not None else wandb_run_id
        )

    @staticmethod
    def _start_wandb(run_dir: Path, cfg: TrainConfig, config_dict: dict, run_id: str | None):
        group, name = run_names(cfg)
        try:
            import wandb

            return wandb.init(
                project=cfg.logger.project,
                entity=cfg.logger.entity,
                group=group,
                name=name,
                tags=list(cfg.logger.tags),
                config=config_dict,
                dir=str(run_dir),
                mode=cfg.logger.mode.name,
                id=run_id,
                resume="allow" if run_id else None,
                reinit="finish_previous",
                # quiet: no wandb summary and history tables printed when the run finishes
                # (the command's own result line is the last one); where the run is synced stays
                settings=wandb.Settings(init_timeout=cfg.logger.init_timeout_s, quiet=True),
            )
        except Exception as e:  # logging must never stop training
            log.warning(
                "wandb could not start (%s); metrics go to %s only",
                str(e).splitlines()[0] if str(e) else type(e).__name__,
                run_dir / "metrics.jsonl",
            )
            return None

    def log(self, row: dict[str, Any]) -> None:
        """Append ``row`` (must hold ``step``); non-finite floats are written as null in JSON."""
        if not self._write_failed:
            try:
                self._file.write(json.dumps({k: _finite_or_none(v) for k, v in row.items()}) + "\n")
            except OSError as e:
                log.error(
                    "cannot write %s (%s); training goes on, later rows are lost", self.path, e
                )
                self._write_failed = True
        if self._wandb_run is not None:
            try:
                self._wandb_run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
            except Exception as e:
                log.warning(
                    "wandb stopped accepting metrics (%s); continuing with metrics.jsonl", e
                )
                self._wandb_run = None

    def log_sample(self, step: int, prompt: str, text: str) -> None:
        """Add a text sample to the wandb table ``samples`` (columns step, prompt, text)."""
        if self._wandb_run is None:
            return
        self._samples.append([step, prompt, text])  # the whole table again: a logged one is fixed
        try:
            import wandb

            table = wandb.Table(columns=["step", "prompt", "text"], data=list(self._samples))
            self._wandb_run.log({"samples": table}, step=step)
        except Exception as e:
            log.warning("wandb did not take the sample of step %d (%s)", step, e)

    def finish(self, summary: dict[str, Any], exit_code: int = 0) -> None:
        """Write the summary to wandb and close both sinks (always, whatever fails)."""
        try:
            self._file.close()
        except OSError as e:
            log.error("cannot close %s (%s)", self.path, e)
        if self._wandb_run is not None:
            try:
                for k, v in summary.items():
                    if isinstance(v, (int, float, str, bool)) or v is None:
                        self._wandb_run.summary[k] = v
                self._wandb_run.finish(exit_code=exit_code)
            except Exception as e:
                log.warning("wandb could not finish cleanly (%s)", e)
            self._wandb_run = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (``files.read_rows``: torn lines left out, RunFileError)."""
    return read_rows(path)


def truncate_metrics(path: Path, last_step: int) -> None:
    """Rewrite ``metrics.jsonl`` atomically without its rows after ``last_step``."""
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
