"""``summary.json``: what a run records when it starts (:func:`start_summary`), the keys of its
outcome (:func:`outcome_keys`, added by ``run_state.finish`` whatever the outcome), and the atomic
write (:func:`write_summary`).

Keys of the outcome (besides status, step times, MFU): ``steps_completed`` and ``steps_done``
(the same count: optimizer steps done), ``stopped_by`` (``max_steps`` or ``max_time_s`` for a
completed run, else null), ``train_time_s`` (the training steps' wall time, the clock of
``max_time_s``), ``final_val_loss`` / ``final_val_bpb`` / ``final_eval`` (``{name: {"loss",
"bpb"}}`` of the held-out corpora; null unless completed) and ``last_val_loss``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from normlab.config import RunOptions
from normlab.training import distributed
from normlab.training.evaluation import final_eval
from normlab.training.metrics import NAMES
from normlab.training.resume import config_hash
from normlab.training.setup import versions
from normlab.training.step import Run

log = logging.getLogger(__name__)


def start_summary(run: Run, opts: RunOptions) -> dict[str, Any]:
    """The summary of a run that starts (``status: running``): what it is and what it trains."""
    cfg = run.cfg
    summary: dict[str, Any] = {
        "status": "running",
        "seed": cfg.seed,
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
        "data": _data_record(run.data),
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
    return summary


def _data_record(data) -> dict[str, Any]:
    return {
        "cache": str(data.directory),
        "tokens": data.meta["tokens"],
        "bytes_per_token": data.val_bytes_per_token,
    }


def outcome_keys(run: Run, p) -> dict[str, Any]:
    """The keys of a run's outcome that ``run_state.finish`` adds to the summary of ``p`` (its
    :class:`~normlab.training.run_state.Progress`): steps, stop reason, training time, the final
    bits per byte and held-out results."""
    completed = p.summary["status"] == "completed"
    return {
        "steps_done": p.step if p.summary["status"] == "failed" else p.done,
        "stopped_by": p.summary.get("stopped_by") if completed else None,
        "train_time_s": p.train_time_s,
        "final_val_bpb": p.val_row.get(NAMES["val_bpb"]) if completed else None,
        "final_eval": final_eval(p.val_row, [s.name for s in run.evals]) if completed else None,
    }


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` atomically: a kill while writing leaves the previous one."""
    tmp = run_dir / f".summary.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, run_dir / "summary.json")
