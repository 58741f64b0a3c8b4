"""A set of downstream tasks prepared once for one tokenizer and context length, then scored as
often as wanted: by ``normlab-eval`` on a finished run, or at every evaluation of a training run.

``prepare_suite`` reads the tasks and tokenizes every choice into its windows; ``score_suite``
returns one ``TaskResult`` per task; ``metric_row`` flattens them into ``downstream/<task>/...``
keys for ``metrics.jsonl``. ``DownstreamEval`` bundles the three for a training loop.

Why: docs/running.md
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from normlab.config import ConfigError
from normlab.evals.scoring import TaskResult, Window, build_windows, score_windows, task_result
from normlab.evals.tasks import Item, check_tasks, load_task, package_dir


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
    """The first ``limit`` items (all when None) of each task, tokenized with ``tokenizer`` for
    ``context_length`` positions; ConfigError: an unknown or repeated task, ``limit`` < 1, or no
    package."""
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


@dataclass
class DownstreamEval:
    """Downstream evaluation in a training loop: the first ``limit`` items of each task,
    ``batch_size`` windows per forward, tokenized once (``prepare``), scored at each call into
    ``results``. ConfigError when built (before the first step): an unknown or repeated task,
    ``limit`` or ``batch_size`` < 1, the package missing."""

    names: tuple[str, ...]
    limit: int | None = None
    batch_size: int = 16
    results: list[TaskResult] = field(default_factory=list, init=False, repr=False)
    _suite: list[PreparedTask] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.names = tuple(check_tasks(self.names))
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"downstream limit={self.limit}: must be null (all) or >= 1")
        if self.batch_size < 1:
            raise ConfigError(f"downstream batch_size={self.batch_size}: must be >= 1")
        package_dir()

    @property
    def prepared(self) -> bool:
        return self._suite is not None

    def prepare(self, tokenizer, context_length: int) -> None:
        """Read and tokenize the items for a model of ``context_length`` positions (once)."""
        if self._suite is None:
            self._suite = prepare_suite(self.names, self.limit, tokenizer, context_length)

    def __call__(self, model, tokenizer, device: torch.device, autocast=None) -> dict[str, float]:
        """``metric_row`` of ``model`` (a GPT) on the tasks, tokenized with ``tokenizer`` at the
        first call unless ``prepare`` was called (then ``tokenizer`` may be None)."""
        self.prepare(tokenizer, model.cfg.context_length)
        self.results = score_suite(model, self._suite, device, self.batch_size, autocast)
        return metric_row(self.results)
