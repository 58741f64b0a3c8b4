"""What the study scripts share: compose a config as ``train`` does, set up its model inputs, name
the output dir, write Markdown tables.

Why: docs/experiments.md
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from normlab.compose import compose
from normlab.config import TrainConfig


def with_default_experiment(overrides: list[str], name: str) -> list[str]:
    """``overrides`` with ``experiment=<name>`` in front unless they choose an experiment."""
    return (
        list(overrides)
        if any(o.startswith("experiment=") for o in overrides)
        else [f"experiment={name}", *overrides]
    )


@dataclass
class StudyInputs:
    """A config resolved for its device and one training batch ``x``, ``y`` of shape
    ``(batch_size, context_length)``."""

    cfg: TrainConfig
    device: torch.device
    x: torch.Tensor
    y: torch.Tensor


def study_inputs(overrides: list[str]) -> StudyInputs:
    """Build the run as ``train`` does (``build_run``) and take its training batch 0; raises
    ConfigError, DataError as ``train`` would."""
    from normlab.training.setup import build_run

    run = build_run(compose(overrides))
    x, y = run.sampler.train_batch(0, 0)
    return StudyInputs(run.cfg, run.device, x, y)


def output_dir(name: str, out: str | Path | None = None) -> Path:
    """``out``, or ``outputs/studies/<name>/<time>``; created."""
    path = Path(out) if out else Path("outputs/studies") / name / time.strftime("%Y-%m-%d_%H-%M-%S")
    path.mkdir(parents=True, exist_ok=True)
    return path


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (cells as given, converted with ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])
