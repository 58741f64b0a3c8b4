"""Several processes: torchrun on CPU (gloo) against one process with the same global batch, one set
of
files per run, stop signals agreed by every rank, resume on every rank; the helpers in one
process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from normlab.compose import to_train_config
from normlab.config import ConfigError
from normlab.training import checkpoint as ckpt
from normlab.training import distributed, tracking
from normlab.training.loop import RunOptions, train

from ..conftest import TINY

#: 4 micro-batches per step: 2 per rank with 2 processes, so sums and gradients are reduced in
#: another order than in one process (the losses agree to fp32 rounding, not bit for bit).
RUN = [*TINY, "optim.grad_accum=4", "eval_interval=3", "ckpt_interval=0"]

#: The real CLI under torchrun, with one fault: signal NORMLAB_TEST_SIGNAL reaches rank
#: NORMLAB_TEST_SIGNAL_RANK alone, at the end of its step NORMLAB_TEST_SIGNAL_AT.
DRIVER = """
import os, signal
import normlab.training.tracking as tracking
at = int(os.environ["NORMLAB_TEST_SIGNAL_AT"])
sig = getattr(signal, os.environ["NORMLAB_TEST_SIGNAL"])
rank = os.environ["NORMLAB_TEST_SIGNAL_RANK"]
stop, steps = tracking.StepTimer.stop, [0]
def stop_then_signal(self, record=True):
    steps[0] += 1
    if steps[0] == at and os.environ["RANK"] == rank:
        os.kill(os.getpid(), sig)
    return stop(self, record)
tracking.StepTimer.stop = stop_then_signal
from normlab.commands.train import main
main()
"""


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One intra-op thread for every test here (see conftest.one_thread)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    args: list[str], cwd: Path, nproc: int = 2, signal_at: tuple[str, int, int] | None = None
) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node=<nproc> -m normlab.cli <args>`` in
    ``cwd``."""
    scratch = cwd / "tmp"  # where ranks > 0 keep Hydra's files while they run
    scratch.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        HYDRA_FULL_ERROR="0",
        OMP_NUM_THREADS="1",
        TMPDIR=str(scratch),
    )
    target = ["-m", "normlab.commands.train"]
    if signal_at:
        env.update(
            NORMLAB_TEST_SIGNAL=signal_at[0],
            NORMLAB_TEST_SIGNAL_AT=str(signal_at[1]),
            NORMLAB_TEST_SIGNAL_RANK=str(signal_at[2]),
        )
        (cwd / "driver.py").write_text(DRIVER)
        target = [str(cwd / "driver.py")]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
        *target,
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def rows(run_dir: Path) -> list[dict]:
    return tracking.read_metrics(run_dir / "metrics.jsonl")


def files_under(root: Path) -> list[str]:
    """Every path under ``root``, relative, without wandb's and the checkpoints' insides."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if not {"wandb", "checkpoints"} & set(p.relative_to(root).parts[:-1])
    )


@pytest.mark.slow
def test_two_processes_train_like_one_write_one_run_and_stop_and_resume_together(
    compose_cfg, tmp_path
):
    # One process, the same global batch (4 micro-batches of 4 sequences per step), in process.
    single = train(
        to_train_config(compose_cfg(RUN)),
        tmp_path / "single",
        RunOptions(ckpt_interval=0),
    )
    assert single["status"] == "completed" and single["world_size"] == 1

    # Two processes; SIGTERM reaches rank 1 alone, in step 3: both stop after step 3.
    r = torchrun([*RUN, "logger=wandb"], tmp_path, signal_at=("SIGTERM", 3, 1))  # rank 0's run
    assert r.returncode != 0, r.stderr  # both ranks exit 143; torchrun reports the failure
    (run,) = (tmp_path / "outputs" / "runs").iterdir()  # one run dir: ranks > 0 made none
    assert r.stderr.count("normlab: SIGTERM after step 3: checkpoint saved") == 1, (
        r.stderr
    )  # rank 0 speaks
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["status"] == "interrupted"
        and summary["interrupted_at_step"] == 3
        and summary["world_size"] == 2
    )
    assert [row["step"] for row in rows(run)] == [0, 1, 2, 3]  # 0: the initial evaluation
    assert [s for s, _ in ckpt.list_checkpoints(run / "checkpoints")] == [3]
    state = ckpt.load_latest(run / "checkpoints").state
    assert len(state["rng_ranks"]) == 2 and state["rng_ranks"][0]["torch"].equal(
        state["rng"]["torch"]
    )
    assert files_under(tmp_path / "outputs") == [
        "runs",
        f"runs/{run.name}",
        f"runs/{run.name}/.hydra",
        f"runs/{run.name}/.hydra/config.yaml",
        f"runs/{run.name}/.hydra/hydra.yaml",
        f"runs/{run.name}/.hydra/overrides.yaml",
        f"runs/{run.name}/checkpoints",
        f"runs/{run.name}/metrics.jsonl",
        f"runs/{run.name}/summary.json",
        f"runs/{run.name}/train.log",
        f"runs/{run.name}/wandb",
    ]
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert not list((tmp_path / "tmp").glob("normlab-rank*")), (
        "ranks > 0 leave no scratch dir behind"
    )

    # Resume by path with two processes: every rank loads the checkpoint; the run completes.
    r = torchrun([f"resume={run}", "logger=none"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "outputs" / "runs").iterdir()] == [run.name]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed"]["from_step"] == 3

    # The losses of the two runs agree to fp32 rounding, step for step, validation too.
    one, two = rows(tmp_path / "single"), rows(run)
    assert [row["step"] for row in two] == [row["step"] for row in one] == list(range(0, 7))
    diff = max(
        abs(a[k] - b[k])
        for a, b in zip(one, two, strict=True)
        for k in ("train/loss", "val/loss")
        if k in a
    )
    print(f"max |loss difference| between 1 and 2 processes over 6 steps: {diff:.3g}")
    assert diff < 1e-5
    assert abs(summary["final_val_loss"] - single["final_val_loss"]) < 1e-5


# --- in process: the pre-emption signal, the helpers with one process
# -------------------------------


def test_the_preemption_signal_checkpoints_and_stops_the_run(
    compose_cfg, tmp_path, signal_after_step
):
    signal_after_step(signal.SIGUSR2, 2)
    summary = train(to_train_config(compose_cfg([*TINY])), tmp_path, RunOptions(ckpt_interval=0))
    assert (
        summary["status"] == "interrupted"
        and summary["signal"] == "SIGUSR2"
        and summary["steps_completed"] == 2
    )
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [2]
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # the handler before training is back


def test_the_preemption_signal_is_handed_on_to_submitits_handler(monkeypatch):
    def submitit_requeues(signum, frame):
        pass

    previous = signal.signal(signal.SIGUSR2, submitit_requeues)
    try:
        assert distributed.preempt_handler("SIGUSR2") is submitit_requeues
        assert distributed.preempt_handler("SIGTERM") is None  # not the pre-emption signal
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        assert distributed.preempt_handler("SIGUSR2") is None  # a plain run: nothing to hand on to
    finally:
        signal.signal(signal.SIGUSR2, previous)
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    assert distributed.preempt_signal() == signal.SIGUSR1


def test_with_one_process_the_helpers_change_nothing():
    assert (distributed.world_size(), distributed.rank(), distributed.is_main()) == (1, 0, True)
    distributed.setup()  # no torchrun variables: no process group
    assert not torch.distributed.is_initialized()
    model = torch.nn.Linear(2, 2)
    assert distributed.wrap(model, torch.device("cpu")) is model
    assert list(distributed.shard(5)) == [0, 1, 2, 3, 4]
    obj = {"a": 1}
    assert distributed.broadcast(obj) is obj and distributed.all_gather(obj) == [obj]
    assert distributed.gather_rows(torch.tensor([1.0, 2.0])).tolist() == [[1.0, 2.0]]
    assert distributed.all_reduce_max(15) == 15
    with distributed.sync_gradients(model, sync=False):
        pass


def test_a_grad_accum_that_does_not_divide_among_the_processes_is_refused(
    compose_cfg, tmp_path, monkeypatch
):
    # Under torchrun the ConfigError is one line from rank 0, like the SIGTERM message above.
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "broadcast", lambda obj, src=0: obj)  # no group to ask
    with pytest.raises(
        ConfigError, match=r"^optim.grad_accum=3 is not divisible by the 2 processes"
    ):
        train(to_train_config(compose_cfg([*TINY, "optim.grad_accum=3"])), tmp_path)
    assert not tmp_path.joinpath("metrics.jsonl").exists()
