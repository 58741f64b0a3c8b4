"""Cluster sweeps: the SLURM launcher config composes and is typed; a sweep runs through submitit's
local executor, each job trained by two submitit tasks (DDP on gloo), like one process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from normlab.commands import overrides as cli_overrides
from normlab.compose import find_conf_dir
from normlab.config import ConfigError
from normlab.training import tracking

from ..conftest import TINY, run_cli

pytest.importorskip(
    "hydra_plugins.hydra_submitit_launcher",
    reason="hydra-submitit-launcher (pip install 'normlab[slurm]')",
)


def losses(run_dir: Path) -> list[dict]:
    """The rows of metrics.jsonl without their timings."""
    return [
        {k: v for k, v in row.items() if not k.startswith("perf/")}
        for row in tracking.read_metrics(run_dir / "metrics.jsonl")
    ]


def test_the_slurm_launcher_composes_with_preemption_and_requeue_settings(tmp_path):
    r = run_cli(
        ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu", "--cfg", "hydra"],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "deprecated" not in r.stderr, r.stderr  # Hydra's schema-matching warning is silenced
    launcher = yaml.safe_load(r.stdout)["hydra"]["launcher"]
    assert launcher["_target_"].endswith("SlurmLauncher") and launcher["partition"] == "gpu"
    assert launcher["signal_delay_s"] == 120 and launcher["max_num_timeout"] == 3
    assert {"gpus_per_node", "tasks_per_node", "timeout_min", "submitit_folder"} <= launcher.keys()

    r = run_cli(
        ["hydra/launcher=submitit_slurm", "hydra.launcher.partiton=gpu", "--cfg", "hydra"],
        cwd=tmp_path,
    )
    assert r.returncode != 0 and "partiton" in r.stderr  # typed by the plugin's SlurmQueueConf


def test_a_submitit_launcher_without_the_plugin_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_overrides.importlib.util, "find_spec", lambda name: None)
    needs = "hydra/launcher=submitit_slurm needs the hydra-submitit-launcher plugin: "
    with pytest.raises(ConfigError, match=re.escape(needs + "pip install 'normlab[slurm]'")):
        cli_overrides.prepare_args(
            ["-m", "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={tmp_path}"], find_conf_dir()
        )


@pytest.mark.slow
def test_a_sweep_through_submitits_local_executor_trains_each_job_with_two_tasks(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*TINY, "max_steps=4", "optim.grad_accum=2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    cmd = [
        sys.executable,
        "-c",
        "from normlab.commands.train import main; main()",
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        f"hydra.sweep.dir={sweep}",
        "norm=layer,rms",
        *args,
    ]
    # 900 s: a hang guard, not a time limit (the sweep takes about 2 min on an idle 2-core CPU)
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    jobs = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert [p.name.split("_")[1].split("-")[0] for p in jobs] == ["layer", "rms"]

    # One micro-batch per task: the losses of one process, bit for bit. The single process is a
    # fresh `train -m` of both norms through the basic launcher (same environment, one thread, one
    # job after the other): no state of this process leaks in.
    one = subprocess.run(
        [*cmd[:3], "-m", f"hydra.sweep.dir={tmp_path / 'one'}", "norm=layer,rms", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert one.returncode == 0, one.stderr
    single = {
        json.loads((p / "summary.json").read_text())["norm"]["kind"]: p
        for p in (tmp_path / "one").glob("*/")
        if (p / "summary.json").is_file()
    }
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["world_size"] == 2
        assert summary["run_options"]["resume"] == "auto"  # a requeued job would continue
        assert sorted(p.name for p in job.iterdir()) == [
            ".hydra",
            "checkpoints",
            "metrics.jsonl",
            "summary.json",
            "train.log",
        ]
        assert losses(job) == losses(single[summary["norm"]["kind"]])
    assert (sweep / "multirun.yaml").is_file() and not (tmp_path / "outputs").exists()
