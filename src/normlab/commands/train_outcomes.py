"""What a ``train`` job says happened: the one line on stderr, the run dir's ``train.log`` and
``summary.json``, what a multirun job returns, and the sweep's report of the jobs that failed."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig


@dataclasses.dataclass(frozen=True)
class JobFailure:
    """What a multirun job returns when its run did not complete (a completed run returns its
    final validation loss). ``message`` is one line."""

    message: str


class SweepFailures(Callback):
    """Hydra callback (``hydra.callbacks`` in ``conf/train.yaml``): remembers the jobs of a
    multirun that did not complete and, after the last one, lists them and exits with status 1."""

    def __init__(self) -> None:
        self.jobs = 0
        self.failures: list[tuple[str, str]] = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        self.jobs += 1
        if job_return.status == JobStatus.FAILED:  # an exception escaped the task (debug=true)
            value = JobFailure("failed: the exception is shown above")
        else:
            value = job_return.return_value
        if isinstance(value, JobFailure):
            self.failures.append((str(config.hydra.runtime.output_dir), value.message))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.failures:
            if launch_rank() == 0:  # the other ranks of a torchrun sweep fail the same jobs
                n = len(self.failures)
                print(f"normlab: {n} of {self.jobs} runs did not complete:", file=sys.stderr)
                for run_dir, message in self.failures:
                    print(f"normlab:   {run_dir}: {message}", file=sys.stderr)
            sys.exit(1)


def launch_rank() -> int:
    """This process's rank as torchrun set it (``RANK``; 0 without torchrun), read before torch."""
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Rank 0 of the process group once joined; before that, of torchrun's or submitit's tasks."""
    dist = sys.modules.get("normlab.training.distributed")
    if dist is not None and dist.world_size() > 1:
        return dist.is_main()
    ranks = ("RANK", "SUBMITIT_LOCAL_GLOBALID", "SLURM_PROCID")
    return all(os.environ.get(v, "0") == "0" for v in ranks)


def say(message: str) -> None:
    """``normlab: <message>`` on stderr, from rank 0 only (every rank would say the same)."""
    if is_main():
        print(f"normlab: {message}", file=sys.stderr)


def to_train_log(message: str, exc_info: bool = False) -> None:
    """Write ``message`` (and the current traceback) to the job's ``train.log`` only: the console
    already has the one line."""
    record = logging.LogRecord(
        "normlab", logging.ERROR, __file__, 0, message, None, sys.exc_info() if exc_info else None
    )
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.handle(record)


def fail(message: str, exit_code: int, context: str = "") -> JobFailure:
    """Print ``normlab: <message><context>``; exit in a single run, return a :class:`JobFailure`
    (without ``context``: the sweep report names the run dir itself) in a multirun."""
    say(f"{message}{context}")
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(exit_code)
    return JobFailure(message)


def read_summary(run_dir: Path) -> dict[str, Any]:
    """``run_dir/summary.json`` as a dict; empty when absent or unreadable."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def refuse(run_dir: Path, message: str) -> JobFailure:
    """A run refused before it started: the reason goes to ``train.log`` and, unless the dir
    already records a run, to ``summary.json`` (``status: refused``); then :func:`fail`."""
    to_train_log(f"refused: {message}")
    if is_main() and not (run_dir / "summary.json").exists():
        record = {"status": "refused", "error": message, "run_dir": str(run_dir)}
        (run_dir / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    return fail(f"error: {message}", 2)


class KeepJobRecords(Callback):
    """Hydra callback (``hydra.callbacks`` in ``conf/train.yaml``): a sweep run again into its own
    dir (``-m ... hydra.sweep.dir=<dir> resume=auto``) keeps each existing job's ``.hydra/``
    record as the job's first invocation wrote it (Hydra rewrites it before the task runs).

    The records are read when the sweep starts and written back when each job starts; the
    callback travels with the jobs to a submitit launcher's processes.
    """

    def __init__(self) -> None:
        self.records: dict[str, dict[str, bytes]] = {}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("resume") != "auto":
            return
        for hydra_dir in Path(str(config.hydra.sweep.dir)).glob("*/.hydra"):
            files = {p.name: p.read_bytes() for p in hydra_dir.glob("*.yaml")}
            self.records[str(hydra_dir.parent.resolve())] = files

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        job_dir = Path(str(config.hydra.runtime.output_dir)).resolve()
        for name, content in self.records.get(str(job_dir), {}).items():
            (job_dir / ".hydra" / name).write_bytes(content)


def already_completed(done: dict[str, Any], full) -> bool:
    """Whether a run's summary ``done`` says it completed what the config ``full`` asks:
    ``max_steps``, or a time budget of at least ``max_time_s`` (a larger budget, or none,
    continues a run that its budget stopped)."""
    if done.get("status") != "completed":
        return False
    if done.get("steps_completed", 0) >= full.max_steps:
        return True
    budget, spent = full.max_time_s, done.get("train_time_s") or 0.0
    return done.get("stopped_by") == "max_time_s" and budget is not None and spent >= budget
