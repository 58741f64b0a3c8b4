"""Shared fixtures: compose the real configs (shrunk to CPU size) and run the real CLI."""

from __future__ import annotations

import copy
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# Triton chooses interpreter or compiler when triton.language and each kernel are first imported,
# and torch imports triton as a side effect of other imports (dynamo, inductor): on a CPU the whole
# session must see TRITON_INTERPRET=1 before the first import of torch, whatever module a test
# collection reaches first. NORMLAB_TEST_DEVICE=cuda (the GPU check) compiles instead.
if os.environ.get("NORMLAB_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from normlab.compose import compose_cli, compose_dict, find_conf_dir  # noqa: E402
from normlab.config import CliConfig, TrainConfig  # noqa: E402
from normlab.training import tracking  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = find_conf_dir()

#: Overrides that make any config a seconds-long CPU run.
TINY = [
    "model=tiny",
    "model.n_layer=2",
    "model.context_length=32",
    "data.batch_size=4",
    "max_steps=6",
    "eval_interval=3",
    "eval_batches=2",
    "timing_warmup_steps=1",
    "progress=false",
    "device=cpu",
    "logger=none",  # starting wandb costs seconds a process: the tests of tracking ask for it
]


@pytest.fixture(scope="session", autouse=True)
def _one_intra_op_thread():
    """Tests run on one thread: on 2 shared cores, two-thread torch regions wait for the busier
    core and tiny steps run many times slower. Tests of thread counts set their own."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def _isolated_env(tmp_path_factory):
    """One token cache for the whole session, wandb offline and quiet, outside the user's home."""
    cache = tmp_path_factory.mktemp("normlab-cache")
    old = {k: os.environ.get(k) for k in ("NORMLAB_CACHE", "WANDB_SILENT", "WANDB_MODE")}
    os.environ.update(NORMLAB_CACHE=str(cache), WANDB_SILENT="true")
    os.environ.pop("WANDB_MODE", None)
    yield cache
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def cfg_tiny() -> Callable[..., TrainConfig]:
    """``cfg_tiny(*overrides) -> TrainConfig``: the real ``conf/train.yaml`` composed through
    :func:`normlab.compose.compose_cli` (as ``train`` composes it) with :data:`TINY` and then
    ``overrides`` (later wins), validated. Each distinct override list is composed once per
    session; every call returns a fresh copy, so a test may change what it gets.
    ``cfg_tiny.cli(*overrides)`` gives the full :class:`CliConfig` (invocation keys included).
    """
    composed: dict[tuple[str, ...], CliConfig] = {}

    def full(*overrides: str) -> CliConfig:
        if overrides not in composed:
            composed[overrides] = compose_cli([*TINY, *overrides])
        return copy.deepcopy(composed[overrides])

    def make(*overrides: str) -> TrainConfig:
        return full(*overrides).train_config()

    make.cli = full  # type: ignore[attr-defined]
    return make


@pytest.fixture
def compose_cfg() -> Callable[[list[str] | None], DictConfig]:
    """``compose_cfg(overrides) -> DictConfig`` of ``conf/train.yaml``, not shrunk and not yet
    validated (:func:`normlab.compose.compose_dict`, schema-typed like ``train``)."""
    return lambda overrides=None: compose_dict(list(overrides or []))


#: What the ``train`` console script runs.
TRAIN_MAIN = "from normlab.commands.train import main; main()"
#: Environment for subprocesses that must run on one thread.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def run_cli(
    args: list[str],
    cwd: Path,
    timeout: float = 300,
    code: str = TRAIN_MAIN,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python -c code args`` (by default the real ``train`` console script) in ``cwd``
    (outputs/ lands there), with ``env`` added to this process's environment."""
    full = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0", **(env or {}))
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def train_main(monkeypatch, capsys) -> Callable[[list[str], Path], tuple[int, str, str]]:
    """``train_main(args, cwd) -> (exit status, stdout, stderr)``: the ``train`` console script's
    ``main()`` with ``args`` in this process (no interpreter start, no torch import: seconds less
    than :func:`run_cli`), in ``cwd``; the environment, the root logger (Hydra configures it per
    job) and torch's thread count are restored after the test."""
    from normlab.commands.overrides import SWEPT_ENV
    from normlab.commands.train import main

    root = logging.getLogger()
    handlers, level, threads = root.handlers[:], root.level, torch.get_num_threads()
    for name in (SWEPT_ENV, "WANDB_QUIET"):  # main sets them: monkeypatch restores them
        old = os.environ.get(name)
        monkeypatch.setenv(name, old or "unset")  # undo: back to the old value, or unset
        if old is None:
            monkeypatch.delenv(name)

    def run(args: list[str], cwd: Path) -> tuple[int, str, str]:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["train", *args])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            # as the interpreter maps it: None is 0, a message is 1
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    yield run
    root.handlers[:], root.level = handlers, level
    torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """One intra-op thread: on 2 shared cores, more threads make tiny steps 100x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def signal_after_step(monkeypatch):
    """``signal_after_step(sig, step)``: send ``sig`` to this process right after metrics.jsonl
    gets the row of ``step`` (a deterministic interruption point for in-process runs). A later
    call re-arms it for the runs that follow; ``step=None`` disarms it."""
    armed: dict = {}
    log = tracking.MetricsLogger.log

    def log_then_signal(self, row):
        log(self, row)
        if armed and armed["step"] is not None and row["step"] == armed["step"]:
            os.kill(os.getpid(), armed["sig"])

    monkeypatch.setattr(tracking.MetricsLogger, "log", log_then_signal)

    def arm(sig: signal.Signals, step: int | None) -> None:
        armed.update(sig=sig, step=step)

    return arm
