"""Faults that must not cost a sweep: divergence, bad input, crashes, wandb, unwritable dirs."""

from __future__ import annotations

import gc
import json
import logging
import math
import subprocess
from pathlib import Path

import pytest
import torch
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from normlab.commands import overrides as cli_overrides
from normlab.commands import train as cli
from normlab.commands.overrides import check_output_dir, prepare_args
from normlab.commands.train import JobFailure, SweepFailures
from normlab.compose import find_conf_dir
from normlab.config import ConfigError
from normlab.model import GPT
from normlab.training.loop import RunOptions, train

from ..conftest import ONE_THREAD, TINY, TRAIN_MAIN, run_cli


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One intra-op thread for every test here (see conftest.one_thread)."""


def cli_run(args: list[str], cwd: Path, code: str = TRAIN_MAIN) -> subprocess.CompletedProcess:
    return run_cli(args, cwd, code=code, env=ONE_THREAD)


#: The real CLI, with one fault: the job with optim.lr=2e-3 raises at its third step.
CRASH_AT_LR_2E_3 = """
import normlab.training.loop as train
lr_at = train.lr_at
def lr_at_or_crash(step, max_steps, cfg):
    if cfg.lr == 2e-3 and step == 2:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return lr_at(step, max_steps, cfg)
train.lr_at = lr_at_or_crash
from normlab.commands.train import main
main()
"""


@pytest.mark.slow
def test_a_multirun_with_diverging_and_crashing_jobs_completes_the_others_and_exits_nonzero(
    tmp_path,
):
    sweep = tmp_path / "sweep"
    r = cli_run(
        [
            "-m",
            "optim.lr=1e-3,1e30,2e-3,3e-3",
            *TINY,
            "logger=wandb",  # each job's wandb run is closed, the crashed one too
            "optim.min_lr=0",
            "optim.warmup_steps=0",
            "optim.grad_clip=0",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
        code=CRASH_AT_LR_2E_3,
    )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr + r.stdout
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name.split("-lr")[0] for j in jobs] == [
        f"{i}_layer-cpp-pre-fp32-seed0" for i in range(4)
    ], "named by the implementation that runs and the swept lr"
    assert jobs[0].name.endswith("-lr0.001") and jobs[2].name.endswith("-lr0.002")
    status = {
        j.name[0]: json.loads((j / "summary.json").read_text())["status"]
        for j in jobs
        if (j / "summary.json").exists()
    }
    assert status == {
        "0": "completed",
        "1": "diverged",
        "2": "failed",
        "3": "completed",
    }, "every job's dir says what happened; the jobs after a failure run"
    crash_log = (jobs[2] / "train.log").read_text()
    assert "Traceback (most recent call last)" in crash_log and "lr_at_or_crash" in crash_log
    diverged = json.loads((jobs[1] / "summary.json").read_text())
    assert diverged["diverged_at_step"] >= 1 and math.isfinite(diverged["last_finite_loss"])
    failed = json.loads((jobs[2] / "summary.json").read_text())
    assert (
        failed["failed_at_step"] == 3
        and failed["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    report = r.stderr[r.stderr.index("normlab: 2 of 4 runs did not complete:") :].splitlines()
    why = f"{diverged['diverged_reason']} (last finite loss {diverged['last_finite_loss']})"
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert report[1:] == [
        f"normlab:   {jobs[1]}: diverged at step {diverged['diverged_at_step']}: {why}",
        f"normlab:   {jobs[2]}: run failed: {crash} "
        f"(traceback in {jobs[2]}/train.log and summary.json)",
    ]
    for job in (
        jobs[0],
        jobs[1],
        jobs[2],
        jobs[3],
    ):  # every wandb run was closed before the next job
        (debug_log,) = job.glob("wandb/offline-run-*/logs/debug.log")
        assert "finishing run" in debug_log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("multirun", [False, True], ids=["run", "multirun"])
def test_an_output_dir_that_cannot_be_created_is_one_line_before_anything_runs(tmp_path, multirun):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    r = cli_run(
        [*(["-m"] if multirun else []), *TINY, "logger=none", f"{key}={blocker}/run"], tmp_path
    )
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"normlab: error: {key}={blocker}/run cannot be created: {blocker} is a file, not a folder"
    ]


def test_output_dir_checks_catch_unwritable_and_full_disks(tmp_path, monkeypatch):
    check_output_dir("hydra.run.dir", str(tmp_path / "new" / "${now:%H}"))  # a fresh folder is fine

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as m:  # root ignores chmod, so the refusal is simulated
        m.setattr(cli_overrides.tempfile, "TemporaryFile", refuse)
        with pytest.raises(ConfigError, match=r"is not writable: .*: Permission denied$"):
            check_output_dir("hydra.run.dir", str(tmp_path / "run"))
    full_disk = type("Usage", (), {"free": 1 << 20})()
    monkeypatch.setattr(cli_overrides.shutil, "disk_usage", lambda p: full_disk)
    with pytest.raises(ConfigError, match="has no room: 1 MiB free"):
        check_output_dir("hydra.run.dir", str(tmp_path / "run"))


def test_resume_by_path_reapplies_the_runs_overrides_and_keeps_its_record(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- model=tiny\n- seed=3\n- resume=auto\n")
    args = prepare_args([f"resume={run}", "seed=4", "progress=false"], find_conf_dir())
    assert args == [
        "model=tiny",
        "seed=3",
        f"resume={run}",
        "seed=4",
        "progress=false",
        f"hydra.run.dir={run}",
        "hydra.output_subdir=null",
    ]
    with pytest.raises(ConfigError, match="is not a run dir with checkpoints"):
        prepare_args([f"resume={tmp_path}"], find_conf_dir())
    with pytest.raises(
        ConfigError, match="to continue a sweep use hydra.sweep.dir=<sweep dir> resume=auto"
    ):
        prepare_args(["-m", f"resume={run}"], find_conf_dir())


# --- in-process ----------------------------------------------------------------------------------


def test_wandb_failing_to_start_or_to_log_does_not_stop_training(
    cfg_tiny, tmp_path, monkeypatch, caplog
):
    import wandb

    def no_wandb(**kwargs):
        raise RuntimeError("wandb-core could not be started")

    monkeypatch.setattr(wandb, "init", no_wandb)
    summary = train(cfg_tiny("logger=wandb"), tmp_path / "a", RunOptions())
    assert summary["status"] == "completed"
    assert len((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()) == 7  # steps 0-6
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "wandb" in r.message]
    assert (
        len(warnings) == 1
        and "wandb could not start (wandb-core could not be started)" in warnings[0].message
    )
    monkeypatch.undo()

    class BrokenRun:
        id = "broken"
        summary: dict = {}

        def log(self, *a, **k):
            raise OSError("disk quota exceeded")

        def finish(self, *a, **k):
            raise OSError("disk quota exceeded")

    monkeypatch.setattr(wandb, "init", lambda **kwargs: BrokenRun())
    caplog.clear()
    summary = train(cfg_tiny("logger=wandb"), tmp_path / "b", RunOptions())
    assert summary["status"] == "completed"
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 7
    assert sum("wandb stopped accepting metrics" in r.message for r in caplog.records) == 1


def test_a_loss_above_max_loss_ends_the_run_as_diverged(cfg_tiny, tmp_path):
    summary = train(cfg_tiny(), tmp_path, RunOptions(max_loss=1.0))
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 1
    assert (
        summary["diverged_reason"].endswith("above max_loss=1")
        and summary["last_finite_loss"] is None
    )
    assert not list((tmp_path / "checkpoints").glob("*.pt")), "a diverged state is not checkpointed"


def test_an_exception_mid_run_is_recorded_as_failed_and_the_wandb_run_closed(
    cfg_tiny, tmp_path, monkeypatch
):
    import normlab.training.validation as train_module

    calls = {"n": 0}
    evaluate = train_module.evaluate

    def evaluate_then_crash(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # evaluations at steps 0, 3 and 6
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", evaluate_then_crash)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        train(cfg_tiny("logger=wandb"), tmp_path, RunOptions())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_at_step"] == 6
    assert summary["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "evaluate_then_crash" in summary["traceback"]
    import wandb

    assert wandb.run is None, "the wandb run must be finished"


def test_a_run_leaves_no_model_and_no_compiled_state_behind(cfg_tiny, tmp_path, monkeypatch):
    resets = []
    monkeypatch.setattr(torch.compiler, "reset", lambda: resets.append(True))
    torch.compile(torch.sin, backend="eager")(torch.zeros(1))  # dynamo in use, as with compile=true
    train(cfg_tiny("max_steps=2"), tmp_path, RunOptions())
    with pytest.raises(ConfigError):  # a refused start releases everything too
        train(cfg_tiny("max_steps=2"), tmp_path, RunOptions())
    assert len(resets) == 2
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is GPT]


def test_the_sweep_report_counts_failed_jobs_and_exits_1(capsys):
    report = SweepFailures()

    def job(run_dir: str, status: JobStatus, value) -> None:
        ret = JobReturn(status=status)
        ret.return_value = value
        report.on_job_end(OmegaConf.create({"hydra": {"runtime": {"output_dir": run_dir}}}), ret)

    job("out/0", JobStatus.COMPLETED, 2.5)
    job("out/1", JobStatus.COMPLETED, JobFailure("diverged at step 3: non-finite loss nan"))
    job("out/2", JobStatus.FAILED, ValueError("boom"))
    with pytest.raises(SystemExit) as exit_:
        report.on_multirun_end(OmegaConf.create({}))
    assert exit_.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "normlab: 2 of 3 runs did not complete:",
        "normlab:   out/1: diverged at step 3: non-finite loss nan",
        "normlab:   out/2: failed: the exception is shown above",
    ]
    SweepFailures().on_multirun_end(OmegaConf.create({}))  # no failure: no exit


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ckpt_interval=-1", "ckpt_interval=-1 is not allowed: must be >= 0 (0: only at the end)"),
        ("ckpt_keep=0", "ckpt_keep=0 is not allowed: must be >= 1"),
        ("max_loss=-2", "max_loss=-2.0 is not allowed: must be null or a finite number > 0"),
        ("resume=/elsewhere", "resume=/elsewhere is not this run's dir"),
    ],
)
def test_the_run_keys_are_range_checked_in_one_line(compose_cfg, tmp_path, override, message):
    with pytest.raises(ConfigError) as e:
        cli.to_run_options(compose_cfg([override]), tmp_path)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
