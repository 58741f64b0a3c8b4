"""The ``train`` console script: the only module that sees Hydra or a DictConfig.

Composes ``conf/train.yaml`` with the user's overrides, validates it into a typed
:class:`~normlab.config.TrainConfig` plus :class:`~normlab.config.RunOptions`, and calls
:func:`normlab.training.loop.train`. A user error (a value out of range, a missing data file, a precision
the device cannot run, an output dir that cannot be written, a checkpoint of another config) prints
one line on stderr and exits with status 2 before any training; ``debug=true`` shows the traceback.

Exit status of a single run: 0 completed, 1 diverged or failed (one line; the traceback is in
``summary.json``), 2 bad input, 128 + N when signal N (SIGTERM, SIGINT, SIGUSR2) stopped it after a checkpoint.
In a multirun a job that fails does not stop the others: :class:`SweepFailures` lists the failed
jobs at the end and the sweep exits 1; a signal stops the whole sweep.

``train resume=<run dir>`` continues that run: :func:`prepare_args` re-applies the overrides the run
was started with (``<run dir>/.hydra/overrides.yaml``; overrides typed now come after and win) and
sets ``hydra.run.dir`` to it, leaving its ``.hydra/`` record as the run's first invocation wrote it.
The same command with ``hydra.run.dir=<run dir> resume=auto`` (a requeue script) starts the run or
continues it, whichever applies; ``-m ... hydra.sweep.dir=<sweep dir> resume=auto`` does so per job.

Several processes (``torchrun --nproc_per_node=N -m normlab.commands.train ...``, or a submitit job with several
tasks): every rank runs the Hydra app on the same command line; rank 0's run dir is the run's. Under
torchrun, ranks > 0 get a private scratch dir for Hydra's own files (removed at exit) and receive rank
0's run dir before training, so a run has one run dir, one ``.hydra/``, one ``train.log``; under
submitit every task's Hydra already has the job's dir (its tasks write the same ``.hydra/`` files)
and ranks > 0 leave ``train.log`` to rank 0. Messages are printed by rank 0. Under a submitit
launcher ``resume: null`` means ``auto``: a requeued job continues.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
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
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from normlab.compose import find_conf_dir, register_schema, to_train_config, validate
from normlab.config import ConfigError, RunOptions

log = logging.getLogger("normlab")

# conf/hydra/launcher/submitit_*.yaml are typed by the plugin's configs of the same names (Hydra's
# automatic schema matching), which warns of its deprecation each time; here, not in main(), so that
# submitit's job processes (they import this module to run _task) are quiet too.
warnings.filterwarnings(
    "ignore", message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema"
)


def to_run_options(cfg: DictConfig, run_dir: Path) -> RunOptions:
    """The invocation keys of a composed config as :class:`normlab.config.RunOptions`.

    ``resume=<path>`` must name ``run_dir`` (``prepare_args`` makes it so) and becomes ``required``.

    Raises:
        ConfigError: a value out of range, or a resume path that is not this run's dir.
    """
    full = validate(cfg)
    resume = full.resume
    if resume not in (None, "auto"):
        if Path(resume).expanduser().resolve() != run_dir.resolve():
            raise ConfigError(
                f"resume={resume} is not this run's dir {run_dir}: use resume=<run dir> alone, or hydra.run.dir=<run dir> resume=auto"
            )
        resume = "required"
    return RunOptions(
        ckpt_interval=full.ckpt_interval,
        ckpt_keep=full.ckpt_keep,
        max_loss=full.max_loss,
        resume=resume,
        force=full.force,
    )


# --- before Hydra: resume by path, output dir checks ----------------------------------------------

#: Hydra flags that only print something; they need no writable output dir.
_INFO_FLAGS = {
    "--help",
    "-h",
    "--hydra-help",
    "--version",
    "--cfg",
    "-c",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
    "--resolve",
}
#: Less free space than this in the output dir is reported as a full disk before anything runs.
MIN_FREE_BYTES = 64 << 20


def _value(args: list[str], key: str) -> str | None:
    """The value of the last ``key=value`` override in ``args`` (None if absent)."""
    found = None
    for a in args:
        if a.lstrip("+~").split("=", 1)[0] == key and "=" in a:
            found = a.split("=", 1)[1]
    return found


def check_output_dir(key: str, template: str) -> None:
    """Refuse an output dir (``hydra.run.dir`` or ``hydra.sweep.dir``) that cannot be created and written.

    The part of ``template`` before its first ``${`` is checked: its nearest existing ancestor must
    be a folder, writable (a temporary file is created and removed there), with at least
    :data:`MIN_FREE_BYTES` free.

    Raises:
        ConfigError: one line naming the key, the folder and the reason.
    """
    target = Path(template.split("${", 1)[0] or ".").expanduser()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{key}={template} cannot be created: {probe} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"{key}={template} is not writable: {probe}: {e.strerror or e}") from None
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"{key}={template} has no room: {free / 2**20:.0f} MiB free in {probe} (at least {MIN_FREE_BYTES >> 20} MiB needed)"
        )


def prepare_args(args: list[str], conf_dir: Path) -> list[str]:
    """The command line Hydra gets: ``resume=<run dir>`` expanded, output dirs checked.

    ``resume=<run dir>`` (single runs only) puts the run's original overrides first, the typed
    ones after them (later wins), then ``hydra.run.dir=<run dir>``. When the run dir of a single run
    already holds a ``.hydra/`` record, ``hydra.output_subdir=null`` keeps Hydra from overwriting it:
    it stays the record of the run's first invocation (``summary.json`` has the config in effect).

    Raises:
        ConfigError: a resume path that is not a run dir, resume by path in a multirun, or an
            output dir that cannot be written.
    """
    if any(a.split("=", 1)[0] in _INFO_FLAGS for a in args):
        return args
    launcher = _value(args, "hydra/launcher") or ""
    if (
        launcher.startswith("submitit")
        and importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None
    ):
        raise ConfigError(
            f"hydra/launcher={launcher} needs the hydra-submitit-launcher plugin: pip install 'normlab[slurm]'"
        )
    multirun = "-m" in args or "--multirun" in args
    resume = _value(args, "resume")
    if resume not in (None, "null", "auto"):
        run_dir = Path(resume).expanduser()
        if multirun:
            raise ConfigError(
                f"resume={resume} resumes one run; to continue a sweep use hydra.sweep.dir=<sweep dir> resume=auto"
            )
        if not (run_dir / "checkpoints").is_dir():
            raise ConfigError(
                f"resume={resume} is not a run dir with checkpoints ({run_dir / 'checkpoints'} does not exist)"
            )
        overrides_file = run_dir / ".hydra" / "overrides.yaml"
        original = (
            yaml.safe_load(overrides_file.read_text()) or [] if overrides_file.is_file() else []
        )
        keep = [
            o for o in original if _value([o], "resume") is None and _value([o], "force") is None
        ]
        args = [*keep, *args, f"hydra.run.dir={run_dir}"]
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    run_dir_arg = _value(args, "hydra.run.dir")
    if not multirun and run_dir_arg and (Path(run_dir_arg).expanduser() / ".hydra").is_dir():
        args = [*args, "hydra.output_subdir=null"]  # keep the record of the run's first invocation
    template = _value(args, key)
    if template is None:  # the default in train.yaml, read unresolved (${now:...} needs Hydra)
        node: Any = yaml.safe_load((conf_dir / "train.yaml").read_text())
        for part in key.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        template = node if isinstance(node, str) else "."
    check_output_dir(key, template)
    return args


# --- the task and the sweep's failure report ------------------------------------------------------


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
            if _launch_rank() == 0:  # the other ranks of a torchrun sweep fail the same jobs
                print(
                    f"normlab: {len(self.failures)} of {self.jobs} runs did not complete:",
                    file=sys.stderr,
                )
                for run_dir, message in self.failures:
                    print(f"normlab:   {run_dir}: {message}", file=sys.stderr)
            sys.exit(1)


def _launch_rank() -> int:
    """This process's rank as torchrun set it (``RANK``; 0 without torchrun). Read before the
    process group exists; :mod:`normlab.training.distributed` (which imports torch) knows it afterwards."""
    return int(os.environ.get("RANK", "0"))


def _say(message: str) -> None:
    """``normlab: <message>`` on stderr, from rank 0 only (every rank would say the same)."""
    from normlab.training import distributed

    if distributed.is_main():
        print(f"normlab: {message}", file=sys.stderr)


def _fail(message: str, exit_code: int, context: str = "") -> JobFailure:
    """Print ``normlab: <message><context>``; exit in a single run, return a :class:`JobFailure`
    (without ``context``: the sweep report names the run dir itself) in a multirun."""
    _say(f"{message}{context}")
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(exit_code)
    return JobFailure(message)


def _failed_summary(run_dir: Path) -> bool:
    """Whether ``run_dir/summary.json`` records a failure (an exception before training writes none)."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status") == "failed"
    except (OSError, ValueError):
        return False


def _join_ranks() -> Path:
    """Join the process group if this is one of several processes; returns the run dir: Hydra's,
    rank 0's on every rank. Ranks > 0 log errors only (their warnings are rank 0's), to the console only."""
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


def _run_options(cfg: DictConfig, run_dir: Path) -> RunOptions:
    """:func:`to_run_options`; under a submitit launcher ``resume: null`` becomes ``auto`` so that a
    job requeued after a pre-emption or a time limit continues from its checkpoint."""
    opts = to_run_options(cfg, run_dir)
    if opts.resume is None and "submitit" in str(HydraConfig.get().launcher.get("_target_", "")):
        log.info(
            "resume=auto: a submitit job continues from its run dir's checkpoint when it is requeued"
        )
        opts = dataclasses.replace(opts, resume="auto")
    return opts


def _task(cfg: DictConfig) -> float | JobFailure:
    from normlab.data.tokens import DataError  # deferred: keeps `train --help` fast
    from normlab.training import distributed
    from normlab.training.loop import free_memory, train

    run_dir = _join_ranks()
    debug = bool(cfg.get("debug", False))
    try:
        summary = train(to_train_config(cfg), run_dir, _run_options(cfg, run_dir))
    except (ConfigError, DataError) as e:
        if debug:
            raise
        return _fail(f"error: {e}", 2)
    except KeyboardInterrupt:
        _say(
            f"interrupted; resume=auto with hydra.run.dir={run_dir} continues from its last checkpoint"
        )
        sys.exit(128 + signal.SIGINT)
    except Exception as e:
        if debug:
            raise
        line = str(e).splitlines()[0] if str(e) else ""
        where = (
            f"traceback in {run_dir / 'summary.json'}"
            if _failed_summary(run_dir)
            else "debug=true shows the traceback"
        )
        return _fail(f"run failed: {type(e).__name__}: {line} ({where})", 1)
    finally:
        free_memory()
    if summary["status"] == "interrupted":  # a signal stops a sweep too: the machine is going away
        hc = HydraConfig.get()
        again = f"train resume={run_dir}"
        if hc.mode == RunMode.MULTIRUN:
            again = (
                f"the same command with hydra.sweep.dir={Path(hc.sweep.dir).resolve()} resume=auto"
            )
        sig = signal.Signals[summary["signal"]]
        requeue = distributed.preempt_handler(sig.name)  # submitit's, under a submitit launcher
        _say(
            f"{sig.name} after step {summary['steps_completed']}: checkpoint saved; "
            + (
                "handed to submitit, which requeues the job (unless max_num_timeout is spent); it continues from there"
                if requeue
                else f"continue with: {again}"
            )
        )
        if requeue:
            requeue(sig, None)  # on rank 0: requeues and exits
        sys.exit(128 + sig)
    if summary["status"] == "diverged":
        s = summary
        return _fail(
            f"diverged at step {s['diverged_at_step']}: {s['diverged_reason']} (last finite loss {s['last_finite_loss']})",
            1,
            f" in {run_dir}",
        )
    return summary["final_val_loss"]


def main() -> None:
    """Entry point of the ``train`` console script (Hydra parses ``sys.argv``).

    Under torchrun, ranks > 0 run Hydra in a private scratch dir (``hydra.run.dir`` and
    ``hydra.sweep.dir``, no ``.hydra/``, no ``[HYDRA]`` log lines), removed at exit; their runs
    use rank 0's run dir.
    """
    register_schema()
    conf_dir = find_conf_dir()
    try:
        sys.argv[1:] = prepare_args(sys.argv[1:], conf_dir)
    except ConfigError as e:
        if _launch_rank() == 0:
            print(f"normlab: error: {e}", file=sys.stderr)
        sys.exit(2)
    scratch = None
    if _launch_rank() > 0:
        scratch = tempfile.mkdtemp(prefix=f"normlab-rank{_launch_rank()}-")
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
