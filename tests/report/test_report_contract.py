"""Contract: run dirs that ``train`` really writes (a 2 x 2 sweep through the CLI) are read by
``normlab-report``, whose numbers equal those of the runs' summary.json; the same run dirs with
their metrics under the other set of names (old <-> namespaced) give the same report."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from normlab.commands.report import main
from normlab.report import METRIC_RENAMES, build_report, paired_difference

from .test_report_runs import rename_metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SWEEP = [
    "-m",
    "norm=layer,rms",
    "seed=0,1",
    "model=tiny",
    "model.n_layer=1",
    "model.context_length=16",
    "data.batch_size=2",
    "max_steps=4",
    "eval_interval=2",
    "eval_batches=1",
    "timing_warmup_steps=1",
    "progress=false",
    "logger=none",
    "device=cpu",
    "norm.impl=torch",  # PyTorch's kernels: separate for each kind, which the report warns of
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("contract") / "sweep"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "normlab.commands.train", *SWEEP, f"hydra.sweep.dir={out}"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def summaries(sweep: Path) -> dict[tuple[str, int], dict]:
    out = {}
    for d in sweep.iterdir():
        if (d / "summary.json").exists():
            s = json.loads((d / "summary.json").read_text())
            out[(s["norm"]["kind"], s["seed"])] = s
    return out


def test_report_numbers_equal_the_run_dirs_summaries(sweep, tmp_path):
    s = summaries(sweep)
    assert len(s) == 4 and all(v["status"] == "completed" for v in s.values())
    rep = build_report(sweep, margin=0.02)
    assert rep.labels == ["norm=layer", "norm=rms"]  # progress/logger/... never label
    for v, kind in zip(rep.variants, ("layer", "rms"), strict=True):
        finals = [s[(kind, seed)]["final_val_loss"] for seed in (0, 1)]
        medians = [s[(kind, seed)]["step_time_ms_median"] for seed in (0, 1)]
        assert v["n"] == 2 and v["mean"] == pytest.approx(np.mean(finals), rel=1e-12)
        assert v["std"] == pytest.approx(np.std(finals, ddof=1), rel=1e-9)
        assert v["step_time_ms"] == pytest.approx(np.median(medians), rel=1e-12)
    c = rep.comparisons[0]
    diffs = [s[("rms", k)]["final_val_loss"] - s[("layer", k)]["final_val_loss"] for k in (0, 1)]
    expect = paired_difference(diffs, 0.02)
    assert c["seeds"] == [0, 1] and c["diffs"] == pytest.approx(diffs, rel=1e-12)
    assert c["ci"] == pytest.approx(expect["ci"]) and c["verdict"] == expect["verdict"]
    ratios = [
        s[("rms", k)]["step_time_ms_median"] / s[("layer", k)]["step_time_ms_median"]
        for k in (0, 1)
    ]
    assert c["ratio"]["gmean"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]), rel=1e-12)
    # the last validation point of each curve is the summary's final loss
    last = [r for r in rep.runs if r.label == "norm=layer"][0]
    assert [m["val/loss"] for m in last.metrics if "val/loss" in m][-1] == pytest.approx(
        last.final_val_loss
    )
    # data.batch_size 2 x optim.grad_accum 1 x model.context_length 16: val_diff.png's tokens axis
    assert {r.tokens_per_step for r in rep.runs} == {32}
    assert any("norm.impl=torch" in w for w in rep.confounds)  # both kinds on PyTorch's kernels
    assert main([str(sweep), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    layer_mean = np.mean([s[("layer", k)]["final_val_loss"] for k in (0, 1)])
    assert f"| `norm=layer` | 2 | 0 | {layer_mean:.4f} |" in md
    for name in ("val_loss.png", "val_diff.png", "train_loss.png", "step_time.png"):
        assert (tmp_path / "r" / name).stat().st_size > 5000


def test_the_other_set_of_metric_names_gives_the_same_report(sweep, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(sweep, other, ignore=shutil.ignore_patterns("checkpoints", "report"))
    first = json.loads(next(other.glob("*/metrics.jsonl")).read_text().splitlines()[1])
    old_names = any(k in first for k in METRIC_RENAMES)
    mapping = METRIC_RENAMES if old_names else {v: k for k, v in METRIC_RENAMES.items()}
    for d in other.iterdir():
        if d.is_dir():
            rename_metrics(d, mapping)
    a, b = build_report(sweep), build_report(other)
    assert [r.metrics for r in a.runs] == [r.metrics for r in b.runs]
    assert [c["verdict"] for c in a.comparisons] == [c["verdict"] for c in b.comparisons]
    assert [v["mean"] for v in a.variants] == [v["mean"] for v in b.variants]
