"""A set of downstream tasks prepared once for one tokenizer and context length, then scored as
often as wanted: by ``normlab-eval`` on a finished run, or at every evaluation of a training run.

:func:`prepare_suite` reads the tasks (:mod:`normlab.evals.tasks`) and tokenizes every choice into
its windows (:mod:`normlab.evals.scoring`); :func:`score_suite` runs the model over them and
returns one :class:`~normlab.evals.scoring.TaskResult` per task; :func:`metric_row` flattens the
results into metric keys (``downstream/<task>/acc``, ``.../acc_norm``, ``.../bpb``) for
``metrics.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from normlab.evals.scoring import TaskResult, Window, build_windows, score_windows, task_result
from normlab.evals.tasks import Item, check_tasks, load_task


@dataclass(frozen=True)
class PreparedTask:
    """One task's items and the windows that score them (``split``: choices in several)."""

    name: str
    items: list[Item]
    windows: list[Window]
    n_requests: int
    split: int


def prepare_suite(
    names: list[str] | tuple[str, ...], limit: int | None, tokenizer, context_length: int
) -> list[PreparedTask]:
    """The first ``limit`` items (all when None) of each task in ``names``, tokenized with
    ``tokenizer`` for a model of ``context_length`` positions.

    Raises:
        ConfigError: an unknown or repeated task, ``limit`` < 1, the package missing.
    """
    out = []
    for name in check_tasks(names):
        items = load_task(name, limit)
        ws, split = build_windows(items, tokenizer, context_length)
        n_requests = sum(len(it.choices) for it in items)
        out.append(PreparedTask(name, items, ws, n_requests, split))
    return out


def score_suite(
    model, suite: list[PreparedTask], device: torch.device, batch_size: int = 16, autocast=None
) -> list[TaskResult]:
    """Every task of ``suite`` scored with ``model`` (left in the mode it was in)."""
    out = []
    for task in suite:
        logliks = score_windows(model, task.windows, task.n_requests, device, batch_size, autocast)
        out.append(task_result(task.name, task.items, logliks, task.split))
    return out


def metric_row(results: list[TaskResult]) -> dict[str, float]:
    """``{"downstream/<task>/<metric>": value}``: acc and acc_norm (fractions), or bpb."""
    row = {}
    for r in results:
        for key in ("acc", "acc_norm", "bpb"):
            value = getattr(r, key)
            if value is not None:
                row[f"downstream/{r.task}/{key}"] = value
    return row
