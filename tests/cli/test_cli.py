"""The real ``train`` CLI end to end: run dirs, multirun, offline wandb, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from normlab.training import host_memory

from ..conftest import REPO, TINY, run_cli

pytestmark = pytest.mark.slow


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.json"))


def test_single_run_writes_hydra_config_metrics_summary_and_offline_wandb_run(tmp_path):
    r = run_cli([*TINY, "logger=wandb", "norm=rms", "precision=bf16", "seed=7"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (run,) = run_dirs(tmp_path / "outputs" / "runs")
    assert (run / ".hydra" / "config.yaml").is_file() and (
        run / ".hydra" / "overrides.yaml"
    ).is_file()
    composed = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert composed["norm"]["kind"] == "rms" and composed["seed"] == 7
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (
        len(rows) == 7  # step 0 (the initial model's evaluation) and 6 steps
        and {"step", "train/loss", "train/lr", "train/grad_norm", "perf/step_time_ms"}
        | {"perf/tokens_per_s"}
        <= rows[1].keys()
    )
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["status"] == "completed" and summary["precision"] == "bf16" and summary["seed"] == 7
    )
    # the result and where it is, as the last line (a new user need not know the run dir)
    assert r.stderr.splitlines()[-1] == (
        f"normlab: completed 6 steps: final val loss {summary['final_val_loss']:.4f} nats/token; "
        f"{(run / 'summary.json').resolve()}"
    )
    for key in (
        "final_val_loss",
        "step_time_ms_median",
        "step_time_ms_p90",
        "tokens_per_s",
        "mfu",
        "params",
        "norm_impl",
    ):
        assert summary[key] is not None, key
    # a CPU run keeps freed host memory in the process (training.host_memory) and says so
    assert summary["versions"]["malloc"] == host_memory.KEPT or host_memory._libc() is None
    (wandb_run,) = (run / "wandb").glob("offline-run-*")
    assert list(wandb_run.glob("*.wandb")), "offline wandb run has no data file"


def test_multirun_over_norms_makes_one_run_dir_per_job(tmp_path):
    r = run_cli(["-m", "norm=layer,rms", *TINY, "logger=wandb", "max_steps=3"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = run_dirs(tmp_path / "outputs" / "sweeps")
    assert len(runs) == 2
    kinds = sorted(json.loads((d / "summary.json").read_text())["norm"]["kind"] for d in runs)
    assert kinds == ["layer", "rms"]
    for d in runs:
        assert (d / "metrics.jsonl").is_file() and list((d / "wandb").glob("offline-run-*"))
    assert (runs[0].parent / "multirun.yaml").is_file()


BAD_INPUTS = [
    (["norm=batchnorm"], ["batchnorm", "layer", "rms"]),
    (["precision=fp8"], ["fp8", "bf16", "fp16", "fp32"]),
    (["norm.eps=0"], ["norm.eps=0"]),
    (["norm.eps=-1"], ["norm.eps=-1"]),
    (["norm.placement=middle"], ["middle", "pre", "post"]),
    (["max_steps=0"], ["max_steps=0"]),
    (["model.d_model=130"], ["model.d_model=130", "n_head=4"]),
    (["data.path=/nonexistent/corpus"], ["/nonexistent/corpus", "does not exist"]),
    (["device=cuda"], ["device=cuda needs a CUDA GPU and this machine has none"]),
]


@pytest.mark.parametrize(("overrides", "fragments"), BAD_INPUTS, ids=[o[0][0] for o in BAD_INPUTS])
def test_bad_input_stops_before_training_with_a_clear_message(tmp_path, overrides, fragments):
    r = run_cli([*TINY, *overrides], cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, (fragment, r.stderr)
    assert not list(tmp_path.rglob("metrics.jsonl")), "training started"


def test_user_errors_from_normlab_are_exactly_one_line(tmp_path):
    r = run_cli([*TINY, "norm.eps=0"], cwd=tmp_path)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    allowed = "must be a finite number > 0 (or null for the default 1e-5)"
    assert lines == [f"normlab: error: norm.eps=0.0 is not allowed: {allowed}"]


def test_wheel_ships_conf_and_kernel_source_so_train_finds_them_without_the_repository(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheel_dir.glob("normlab-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "normlab" / "conf" / "train.yaml").is_file()
    assert (
        site / "normlab" / "norms" / "cpu_kernels.cpp"
    ).is_file()  # impl=cpp builds it on first use
    code = "from normlab.compose import find_conf_dir; print(find_conf_dir())"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(out.stdout.strip()) == site / "normlab" / "conf"
    r = subprocess.run(
        [sys.executable, "-m", "normlab.commands.train", "--cfg", "job", "norm=rms"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "kind: rms" in r.stdout


def test_source_checkout_finds_the_top_level_conf():
    from normlab.compose import find_conf_dir

    assert find_conf_dir() == REPO / "conf"
