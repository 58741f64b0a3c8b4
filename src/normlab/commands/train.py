"""The ``train`` console script: the only module that runs a Hydra app.

``train_args`` checks the command line first (resume by path, output dirs, every override against
the schema), so a bad key, option or value is one line on stderr and exit status 2, before Hydra
or torch starts; ``debug=true`` shows tracebacks and Hydra's full errors. In the task, the config
is validated before torch is imported; then :func:`normlab.training.loop.train` runs.

Exit status of a single run: 0 completed (or already completed: nothing is changed), 1 diverged
or failed, 2 bad input (refused), 128 + N when signal N (SIGTERM, SIGINT, SIGUSR2) stopped it after
a checkpoint. Every run dir says what happened: ``train.log`` holds the refusal or the traceback,
``summary.json`` the status (``refused`` when the run never started). In a multirun a job that
fails does not stop the others: :class:`SweepFailures` lists them at the end and exits 1.

``train resume=<run dir>`` continues that run with its own overrides (``train_args``); the same
command with ``hydra.run.dir=<run dir> resume=auto`` starts or continues it, whichever applies.
Under torchrun every rank runs this app; ranks > 0 use a private scratch dir for Hydra's files and
rank 0's run dir for the run. Under a submitit launcher ``resume: null`` means ``auto``.
"""

from __future__ import annotations

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
from hydra.types import RunMode
from omegaconf import DictConfig

from normlab.commands.overrides import value_of
from normlab.commands.schema_keys import help_text
from normlab.commands.train_args import (
    SWEPT_ENV,
    check_overrides,
    job_swept,
    prepare_args,
    swept_keys,
)
from normlab.commands.train_outcomes import (
    JobFailure,
    already_completed,
    fail,
    launch_rank,
    read_summary,
    refuse,
    say,
    to_train_log,
)
from normlab.compose import find_conf_dir, register_schema, validate
from normlab.config import CliConfig, ConfigError, RunOptions
from normlab.data.corpus import DataError, corpus_files
from normlab.data.eval_sets import check_corpus, eval_data_configs

log = logging.getLogger("normlab")

# conf/hydra/launcher/submitit_*.yaml are typed by the plugin's configs of the same names, which
# warns of its deprecation each time; here, so that submitit's job processes are quiet too.
warnings.filterwarnings(
    "ignore", message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema"
)

#: Path keys resolved against the directory ``train`` was started in (``hydra.job.chdir=true``
#: changes into the run dir before the task runs).
PATH_KEYS = ("path", "token_dir", "cache_dir")


def to_run_options(
    cfg: DictConfig | CliConfig, run_dir: Path, swept: tuple[str, ...] = ()
) -> RunOptions:
    """The invocation keys of a composed config as :class:`normlab.config.RunOptions`, with the
    config folder (``eval_data``'s data configs) and a sweep job's swept ``key=value``.

    ``resume=<path>`` must name ``run_dir`` (``prepare_args`` makes it so) and becomes ``required``.

    Raises:
        ConfigError: a value out of range, or a resume path that is not this run's dir.
    """
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
    """``full`` with its relative data paths (:data:`PATH_KEYS`) made absolute against
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
    use (at least 1). Half leaves room for the neighbours on a shared machine; on 2 busy cores two
    intra-op threads made a tiny step 2.5-3.5x slower than one (issue 16)."""
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
    """:func:`to_run_options`; under a submitit launcher ``resume: null`` becomes ``auto`` so that a
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
    """Every check that needs no torch, run before torch is imported: the schema's range checks,
    that a local corpus exists (unless a ``data.token_dir`` stands in for it), and that every
    held-out corpus (``eval_data``) names a data config whose files (or package) are here.

    Raises:
        ConfigError, DataError: one line naming the key and value.
    """
    full = with_launch_paths(validate(cfg), Path(HydraConfig.get().runtime.cwd))
    if full.data.format.name != "hub" and full.data.token_dir is None:
        corpus_files(full.data)
    for name, data in eval_data_configs(list(full.eval_data), full.data, find_conf_dir()).items():
        check_corpus(name, data)
    return full


def _task(cfg: DictConfig) -> float | JobFailure:
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    debug = bool(cfg.get("debug", False))
    try:
        full = _checked_without_torch(cfg)
    except (ConfigError, DataError) as e:
        if debug:
            raise
        return refuse(hydra_dir, str(e))
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
        summary = train(full.train_config(), run_dir, opts)
    except (ConfigError, DataError) as e:
        if debug:
            raise
        return refuse(run_dir, str(e))
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
    """:func:`prepare_args` and, unless ``debug=true``, :func:`check_overrides`; a refusal is
    one line on stderr and exit status 2."""
    try:
        args = prepare_args(args, conf_dir)
        if str(value_of(args, "debug")).lower() != "true":
            if not any(a.split("=", 1)[0] in ("--cfg", "-c", "--info", "-i") for a in args):
                check_overrides(args, conf_dir)
    except ConfigError as e:
        if launch_rank() == 0:
            print(f"normlab: error: {e}", file=sys.stderr)
        sys.exit(2)
    return args


def main() -> None:
    """Entry point of the ``train`` console script (Hydra parses ``sys.argv``).

    ``--help`` lists the groups and every key with its meaning (``--hydra-help``: Hydra's). Under
    torchrun, ranks > 0 run Hydra in a private scratch dir (no ``.hydra/``, no ``[HYDRA]`` log
    lines), removed at exit; their runs use rank 0's run dir.
    """
    register_schema()
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
