"""conf/hydra/sweeper/optuna_lr.yaml: the Hydra Optuna sweeper (the ``[optuna]`` extra) runs
``train`` trials and minimises the value train's Hydra task returns, the final validation loss."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from ..conftest import run_cli

pytest.importorskip(
    "hydra_plugins.hydra_optuna_sweeper",
    reason='the [optuna] extra is not installed: pip install "normlab[optuna]"',
)
pytestmark = pytest.mark.slow

TRIAL = [
    "model=tiny",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.context_length=16",
    "data.batch_size=2",
    "max_steps=3",
    "eval_interval=3",
    "eval_batches=1",
    "timing_warmup_steps=1",
    "progress=false",
    "logger=none",
    "device=cpu",
    "norm.impl=torch",
    "threads=1",
]


def test_two_trials_minimise_the_final_validation_loss(tmp_path):
    out = tmp_path / "sweep"
    args = ["-m", "hydra/sweeper=optuna_lr", "hydra.sweeper.n_trials=2", *TRIAL]
    r = run_cli([*args, f"hydra.sweep.dir={out}"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    trials = [json.loads(p.read_text()) for p in sorted(out.glob("*/summary.json"))]
    assert len(trials) == 2 and all(t["status"] == "completed" for t in trials)
    lrs = [t["config"]["optim"]["lr"] for t in trials]
    assert all(3e-4 <= lr <= 1e-2 for lr in lrs) and lrs[0] != lrs[1]  # the search space
    result = yaml.safe_load((out / "optimization_results.yaml").read_text())
    best = min(trials, key=lambda t: t["final_val_loss"])
    assert math.isclose(result["best_value"], best["final_val_loss"], rel_tol=1e-9)
    assert math.isclose(result["best_params"]["optim.lr"], best["config"]["optim"]["lr"])
