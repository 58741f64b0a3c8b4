"""The report's stability section (loss spikes, largest activations, gradient norms) and its
pairing of downstream tasks, on synthetic run dirs (``test_report.write_run``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from normlab.report import build_report, render_markdown

from .test_report import LAYER, RMS, T975_2, make_sweep


def edit_run(d: Path, summary: dict | None = None, last_row: dict | None = None) -> None:
    """Add ``summary`` keys to the run's summary.json and ``last_row`` keys to its last row."""
    if summary:
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**s, **summary}))
    if last_row:
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        rows[-1].update(last_row)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


RULE = {"window": 50, "k": 6.0}
SPIKES = {"layer": {0: 0, 1: 1, 2: 0}, "rms": {0: 2, 1: 3, 2: 1}}


def stable_sweep(root: Path, spikes=SPIKES, diag: bool = True) -> Path:
    make_sweep(root)
    for norm in ("layer", "rms"):
        for seed in LAYER:
            row = {}
            if diag:
                big = 40.0 if (norm, seed) == ("rms", 1) else 5.0 + seed
                row = {
                    "diag/block0/resid_rms": 1.0,
                    "diag/block0/attn_absmax": 3.0,
                    "diag/block1/mlp_absmax": big,
                    "diag/block1/mlp_kurtosis": 3.0 + big,
                    "diag/final/resid_kurtosis": 4.0,
                }
            summary = {"loss_spikes": spikes[norm][seed], "loss_spike_rule": RULE}
            summary["max_grad_norm"] = 2.0 + seed + (norm == "rms")
            edit_run(root / f"{norm}-seed{seed}", summary, row)
    return root


def test_spike_counts_are_paired_by_seed_with_a_student_t_interval(tmp_path):
    rep = build_report(stable_sweep(tmp_path))
    st = rep.stability
    layer, rms = st["variants"]["norm=layer"], st["variants"]["norm=rms"]
    assert (layer["spikes"]["mean"], layer["spikes"]["spiky"]) == (pytest.approx(1 / 3), 1)
    assert (rms["spikes"]["mean"], rms["spikes"]["total"], rms["spikes"]["spiky"]) == (2.0, 6, 3)
    d = st["diff"]["norm=rms"]  # rms - layer per seed: 2, 2, 1
    assert d["n"] == 3 and d["mean"] == pytest.approx(5 / 3)
    half = T975_2 * math.sqrt(1 / 3) / math.sqrt(3)  # std of (2, 2, 1) is sqrt(1/3)
    assert d["ci"] == pytest.approx((5 / 3 - half, 5 / 3 + half))
    assert not st["all_zero"] and st["rules"] == [RULE]


def test_the_largest_activation_and_kurtosis_name_their_sublayer(tmp_path):
    st = build_report(stable_sweep(tmp_path)).stability
    rms, layer = st["variants"]["norm=rms"], st["variants"]["norm=layer"]
    assert rms["absmax"] == {"value": 40.0, "where": "block1/mlp", "runs": 3}
    assert layer["absmax"]["value"] == 7.0  # seeds 0-2: 5, 6, 7
    assert rms["kurtosis"] == {"value": 43.0, "where": "block1/mlp", "runs": 3}
    assert (layer["grad_norm"], rms["grad_norm"]) == (4.0, 5.0)


def test_the_section_renders_counts_activations_and_the_paired_difference(tmp_path):
    md = render_markdown(build_report(stable_sweep(tmp_path)))
    section = md.split("## Stability")[1].split("\n## ")[0]
    assert "window 50 steps, k = 6.0" in section
    assert (
        "| `norm=rms` | 3 | 2.00 | 3 of 3 | 40 (`block1/mlp`) | 43 (`block1/mlp`) | 5 |" in section
    )
    assert "| `norm=rms` | 3 | +1.67 |" in section


def test_when_no_run_spiked_the_section_shows_counts_and_no_interval(tmp_path):
    zero = {"layer": {0: 0, 1: 0, 2: 0}, "rms": {0: 0, 1: 0, 2: 0}}
    rep = build_report(stable_sweep(tmp_path, zero, diag=False))
    assert rep.stability["all_zero"]
    assert rep.stability["variants"]["norm=rms"]["absmax"]["where"] is None
    section = render_markdown(rep).split("## Stability")[1]
    assert "No run counted a spike" in section and "Paired by seed" not in section
    assert "| `norm=layer` | 3 | 0.00 | 0 of 3 | n/a | n/a | 4 |" in section


def test_runs_without_the_data_get_no_section(tmp_path):
    rep = build_report(make_sweep(tmp_path))
    assert rep.stability is None and rep.downstream == {}
    md = render_markdown(rep)
    assert "## Stability" not in md and "## Downstream" not in md


ACC = {"layer": {0: 0.50, 1: 0.60, 2: 0.55}, "rms": {0: 0.52, 1: 0.63, 2: 0.56}}


def test_downstream_tasks_are_paired_like_any_other_metric(tmp_path):
    make_sweep(tmp_path)
    for norm in ("layer", "rms"):
        for seed, acc in ACC[norm].items():
            row = {"downstream/piqa/acc": acc, "downstream/piqa/acc_norm": 0.5}
            edit_run(tmp_path / f"{norm}-seed{seed}", last_row=row)
    rep = build_report(tmp_path)
    assert list(rep.downstream) == ["downstream/piqa/acc"]  # acc_norm is not paired twice
    comp = rep.downstream["downstream/piqa/acc"]
    assert comp["variants"]["norm=rms"]["mean"] == pytest.approx(1.71 / 3)
    c = comp["comparisons"]["norm=rms"]  # 0.02, 0.03, 0.01
    assert c["n"] == 3 and c["mean"] == pytest.approx(0.02) and c["std"] == pytest.approx(0.01)
    half = T975_2 * 0.01 / math.sqrt(3)
    assert c["ci"] == pytest.approx((0.02 - half, 0.02 + half))
    md = render_markdown(rep)
    assert "### `downstream/piqa/acc`" in md.split("## Downstream tasks")[1]
    assert "| `norm=rms` | 3 | +0.0200 |" in md
    assert RMS  # the sweep's losses stay those of test_report
