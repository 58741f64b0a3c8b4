"""The verdict's qualifiers against hand-computed numbers: bits per byte, held-out corpora, time to
a target loss, the tuned comparison (each variant at its best lr), the interleaved speed verdict,
the per-seed ratio rule, the context section, and ``--wandb`` (offline).

Runs are synthetic, with the keys ``train`` writes now: ``val/bpb``, ``val/<name>/loss`` and
``/bpb``, ``perf/train_time_s`` on every row and an evaluation at step 0; ``summary.json`` with
``final_val_bpb``, ``final_eval``, ``tokens_per_step``, ``steps_done``, ``stopped_by``, ``config``.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from normlab.commands.report import main
from normlab.report import (
    ReportError,
    build_report,
    paired_difference,
    report_tables,
    wandb_settings,
)
from normlab.report.context import short_run_caveat
from normlab.report.stats import ratio_interval

LN2 = math.log(2)
CONFIG = {
    "model": {"name": "tiny", "n_layer": 4, "d_model": 128, "n_head": 4, "context_length": 8},
    "norm": {"kind": "layer", "impl": "cpp"},
    "precision": {"dtype": "fp32"},
    "data": {"name": "shakespeare", "tokenizer": "byte", "batch_size": 2},
    "optim": {"lr": 0.002, "min_lr": 0.0002, "warmup_steps": 5, "grad_accum": 1, "decay": True},
    "logger": {"kind": "wandb", "mode": "offline", "project": "normlab", "group": "g"},
    "eval_batches": 3,
    "eval_data": ["wiki_vital"],
    "max_steps": 40,
    "max_time_s": None,
    "seed": 0,
}
STEPS = (0, 10, 20, 30, 40)
TOKENS_PER_STEP = 16  # batch 2 x context 8 x grad_accum 1


def write(
    root: Path,
    norm: str,
    seed: int,
    final: float,
    *,
    s_per_step: float = 1.0,
    lr: float | None = None,
    tokenizer: str = "byte",
    bytes_per_token: float = 1.0,
    heldout: float = 1.0,
    with_new_keys: bool = True,
) -> Path:
    """A completed run: validation loss final + (40 − step) · 0.01 at steps 0, 10, ..., 40;
    ``val/bpb`` = loss / ln 2 / bytes_per_token; ``val/wiki_vital/loss`` = loss + heldout;
    training seconds = step · s_per_step."""
    name = f"{norm}-seed{seed}" + (f"-lr{lr:g}" if lr else "") + f"-{tokenizer}"
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    cfg = copy.deepcopy(CONFIG)
    cfg["norm"]["kind"], cfg["seed"], cfg["data"]["tokenizer"] = norm, seed, tokenizer
    ovr = [f"norm={norm}", f"seed={seed}"]
    if lr is not None:
        cfg["optim"]["lr"] = lr
        ovr.append(f"optim.lr={lr:g}")
    if tokenizer != "byte":
        ovr.append(f"data.tokenizer={tokenizer}")
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(ovr))
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = []
    for step in range(41):
        row = {"step": step, "train/loss": final - 0.05 + (40 - step) * 0.01}
        if with_new_keys:
            row["perf/train_time_s"] = step * s_per_step
        if step in STEPS:
            loss = final + (40 - step) * 0.01
            row["val/loss"] = loss
            if with_new_keys:
                row["val/bpb"] = loss / LN2 / bytes_per_token
                row["val/wiki_vital/loss"] = loss + heldout
                row["val/wiki_vital/bpb"] = (loss + heldout) / LN2
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "status": "completed",
        "final_val_loss": final,
        "seed": seed,
        "params": 800_000,
        "steps_completed": 40,
        "step_time_ms_median": 1000 * s_per_step,
        "step_times_ms": [1000 * s_per_step] * 8,
        "device": "cpu",
        "versions": {"device": "x86_64", "torch": "2.13.0"},
        "data": {"tokens": {"train": 320, "val": 40}},
        "run_options": {"threads": 1},
        "config": cfg,
    }
    if with_new_keys:
        summary |= {
            "final_val_bpb": final / LN2 / bytes_per_token,
            "final_eval": {"wiki_vital": {"loss": final + heldout, "bpb": (final + heldout) / LN2}},
            "tokens_per_step": TOKENS_PER_STEP,
            "steps_done": 40,
            "stopped_by": "max_steps",
        }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


LAYER = {0: 2.00, 1: 2.02, 2: 1.98}
RMS = {0: 2.01, 1: 2.02, 2: 2.00}


def sweep(root: Path, **rms_kw) -> Path:
    for seed in LAYER:
        write(root, "layer", seed, LAYER[seed])
        write(root, "rms", seed, RMS[seed], **rms_kw)
    return root


def test_bpb_per_variant_and_paired_verdict_in_bits_per_byte(tmp_path):
    rep = build_report(sweep(tmp_path), margin=0.05)
    assert rep.variants[0]["bpb"]["mean"] == pytest.approx(np.mean(list(LAYER.values())) / LN2)
    b = rep.heldout["bpb"]
    assert b["margin"] == pytest.approx(0.05 / LN2)  # byte tokens: 1 byte per token
    diffs = [(RMS[s] - LAYER[s]) / LN2 for s in LAYER]
    expect = paired_difference(diffs, 0.05 / LN2, unit="bits/byte")
    got = b["comparisons"]["norm=rms"]
    assert got["mean"] == pytest.approx(expect["mean"]) and got["ci"] == pytest.approx(expect["ci"])
    assert got["verdict"] == expect["verdict"] == "equivalent within 0.07213 bits/byte"
    assert not rep.heldout["tokenizer_differs"]
    md = (tmp_path / "out").joinpath("report.md")
    assert main([str(tmp_path), "--out", str(md.parent)]) == 0
    text = md.read_text()
    assert "## Bits per byte" in text and "| mean bpb |" in text


def test_runs_differing_in_tokenizer_are_told_to_read_bpb(tmp_path):
    for seed in LAYER:
        write(tmp_path, "layer", seed, LAYER[seed], tokenizer="bpe", bytes_per_token=3.0)
        write(tmp_path, "rms", seed, RMS[seed], tokenizer="bpe", bytes_per_token=3.0)
        write(tmp_path, "rms", seed, RMS[seed] * 3, tokenizer="byte")
    rep = build_report(tmp_path, baseline="data.tokenizer=bpe,norm=layer")
    assert rep.heldout["tokenizer_differs"]
    assert any("differ in tokenizer" in w and "bits per byte" in w for w in rep.confounds)
    # bpe baseline: 3 bytes per token, so 0.02 nats/token is 0.02 / ln 2 / 3 bits/byte
    assert rep.heldout["bpb"]["margin"] == pytest.approx(0.02 / LN2 / 3)
    byte = rep.heldout["bpb"]["comparisons"]["norm=rms"]  # byte: no tokenizer override
    expect = [RMS[s] * 3 / LN2 - LAYER[s] / LN2 / 3 for s in LAYER]
    assert byte["mean"] == pytest.approx(np.mean(expect))
    assert main([str(tmp_path), "--baseline", "norm=layer,data.tokenizer=bpe"]) == 0
    assert "this is the verdict to read" in (tmp_path / "report" / "report.md").read_text()


def test_heldout_section_per_corpus_with_paired_difference(tmp_path):
    for seed in LAYER:
        write(tmp_path, "layer", seed, LAYER[seed], heldout=1.0)
        write(tmp_path, "rms", seed, RMS[seed], heldout=1.0 + 0.01 * seed)
    rep = build_report(tmp_path)
    h = rep.heldout["heldout"]["wiki_vital"]
    diffs = [RMS[s] + 0.01 * s - LAYER[s] for s in LAYER]
    c = h["loss"]["comparisons"]["norm=rms"]
    assert c["mean"] == pytest.approx(np.mean(diffs)) and c["n"] == 3
    assert c["ci"] == pytest.approx(paired_difference(diffs, 0.02)["ci"])
    assert h["loss"]["variants"]["norm=layer"]["mean"] == pytest.approx(3.0)
    assert h["bpb"]["comparisons"]["norm=rms"]["mean"] == pytest.approx(np.mean(diffs) / LN2)
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Held-out corpus `wiki_vital`" in md
    assert "](val_wiki_vital.png)" in md  # its own figure, linked in its section
    assert (tmp_path / "report" / "val_wiki_vital.png").stat().st_size > 5000
    assert "heldout_wiki_vital_loss" in report_tables(rep)


def test_time_to_target_in_seconds_steps_and_tokens(tmp_path):
    rep = build_report(sweep(tmp_path, s_per_step=0.5), target=2.15)
    t = rep.target
    # layer seed 1 (final 2.02): 2.02 + (40 - s)·0.01 <= 2.15 first at s = 30 (2.12; 2.22 at 20)
    # rms seed 2 (final 2.00): 2.20 at 20, 2.10 at 30 -> 30; every run reaches 2.15 first at 30
    assert t["variants"]["norm=layer"]["step"]["mean"] == 30
    assert t["variants"]["norm=layer"]["seconds"]["mean"] == pytest.approx(30.0)
    assert t["variants"]["norm=rms"]["seconds"]["mean"] == pytest.approx(15.0)
    assert t["variants"]["norm=rms"]["tokens"]["mean"] == 30 * TOKENS_PER_STEP
    c = t["comparisons"]["norm=rms"]
    assert c["seconds"]["gmean"] == pytest.approx(0.5) and c["seconds"]["n"] == 3
    assert c["step"]["gmean"] == pytest.approx(1.0)
    default = build_report(tmp_path).target
    assert default["default"] and default["target"] == pytest.approx(2.02)  # the worst final
    assert default["variants"]["norm=rms"]["reached"] == 3
    # every run ends 2.00 + (40 - s)·0.01 at steps 10, 20, 30, 40: 2.02 is reached at 40 only,
    # so the section says the times are the runs' lengths instead of a ratio table
    assert default["only_last"] and not t["only_last"]
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "reaches the target only at its last evaluation" in md and "steps ratio" not in md
    assert main([str(tmp_path), "--target", "2.15"]) == 0
    out = tmp_path / "report"
    md = (out / "report.md").read_text()
    assert "## Time to target loss (2.1500 nats/token)" in md and "steps ratio" in md
    assert (out / "val_time.png").stat().st_size > 5000
    assert (out / "val_tokens.png").stat().st_size > 5000


def test_old_runs_without_the_new_keys_still_report(tmp_path):
    for seed in LAYER:
        write(tmp_path, "layer", seed, LAYER[seed], with_new_keys=False)
        write(tmp_path, "rms", seed, RMS[seed], with_new_keys=False)
    rep = build_report(tmp_path)
    assert rep.heldout["bpb"] is None and rep.heldout["heldout"] == {}
    assert math.isnan(rep.target["variants"]["norm=rms"]["seconds"]["mean"])
    assert rep.target["variants"]["norm=rms"]["step"]["n"] == 3  # steps without seconds
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Bits per byte" not in md and "Validation loss vs training seconds: no data" in md


def test_tuned_comparison_pairs_each_variant_at_its_own_best_lr(tmp_path):
    # final loss = base + penalty(lr): layer best at 2e-3, rms best at 4e-3 (the grid's edge)
    penalty = {
        "layer": {1e-3: 0.05, 2e-3: 0.0, 4e-3: 0.03},
        "rms": {1e-3: 0.08, 2e-3: 0.02, 4e-3: 0.0},
    }
    for norm, base in (("layer", LAYER), ("rms", RMS)):
        for lr, pen in penalty[norm].items():
            for seed in base:
                write(tmp_path, norm, seed, base[seed] + pen, lr=lr)
    rep = build_report(tmp_path)
    assert rep.labels == ["norm=layer", "norm=rms"]  # lr is not a variant
    assert rep.tuned["best"] == {"norm=layer": 2e-3, "norm=rms": 4e-3}
    assert rep.tuned["edge"] == ["norm=rms"]
    c = rep.comparisons[0]
    assert c["diffs"] == pytest.approx([RMS[s] - LAYER[s] for s in LAYER])
    assert sum(r.set_aside is not None for r in rep.runs) == 12
    at = rep.tuned["at_lr"]["norm=rms"][1e-3]
    assert at["mean"] == pytest.approx(np.mean([RMS[s] + 0.08 - LAYER[s] - 0.05 for s in LAYER]))
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Tuned comparison" in md and "at the edge of the grid" in md
    assert (tmp_path / "report" / "lr_curve.png").stat().st_size > 5000


def test_with_4_seeds_the_tuned_study_chooses_on_half_and_tests_on_the_others(tmp_path, capsys):
    # layer at lr 1e-3 is best on seeds 0, 1 (the choosing half) but worst over all four seeds
    base = {0: 2.00, 1: 2.02, 2: 1.98, 3: 2.01}
    penalty = {
        "layer": {1e-3: {0: 0.0, 1: 0.0, 2: 0.1, 3: 0.1}, 2e-3: dict.fromkeys(base, 0.03)},
        "rms": {1e-3: dict.fromkeys(base, 0.05), 2e-3: dict.fromkeys(base, 0.0)},
    }
    for norm, by_lr in penalty.items():
        for lr, pen in by_lr.items():
            for seed in base:
                write(tmp_path, norm, seed, base[seed] + pen[seed] + 0.01 * (norm == "rms"), lr=lr)
    rep = build_report(tmp_path)
    t = rep.tuned
    assert t["selection"] == "split" and t["choose_seeds"] == [0, 1] and t["test_seeds"] == [2, 3]
    assert t["best"] == {"norm=layer": 1e-3, "norm=rms": 2e-3}  # all four seeds would pick 2e-3
    c = rep.comparisons[0]
    assert c["seeds"] == [2, 3]
    assert c["diffs"] == pytest.approx([0.01 - 0.1, 0.01 - 0.1])
    assert sum(r.set_aside is not None for r in rep.runs) == 8 + 4  # other lrs + choosing seeds
    assert not any("selection-biased" in w for w in rep.confounds)
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "chosen on seeds 0, 1 and the verdict tests the other seeds only (2, 3)" in md


def test_with_3_seeds_the_tuned_interval_is_said_to_be_selection_biased(tmp_path, capsys):
    for norm, base in (("layer", LAYER), ("rms", RMS)):
        for lr, pen in ((1e-3, 0.02), (2e-3, 0.0)):
            for seed in base:
                write(tmp_path, norm, seed, base[seed] + pen, lr=lr)
    rep = build_report(tmp_path)
    assert rep.tuned["selection"] == "biased" and rep.comparisons[0]["seeds"] == [0, 1, 2]
    assert main([str(tmp_path)]) == 0
    assert "selection-biased (winner's curse)" in capsys.readouterr().out
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**Selection-biased:** the learning rates were chosen on the same seeds" in md


def test_a_pure_lr_sweep_keeps_lr_as_the_variant(tmp_path):
    for lr in (1e-3, 2e-3):
        for seed in LAYER:
            write(tmp_path, "layer", seed, LAYER[seed] + lr, lr=lr)
    rep = build_report(tmp_path)
    assert rep.tuned is None and rep.labels == ["optim.lr=0.001", "optim.lr=0.002"]


def bench(a: list[str], b: list[str], per_pair: list[float]) -> dict:
    side = {"median_ms": 100.0, "times_ms": [100.0], "norm": "x", "model": "tiny"}
    return {
        "mode": "step",
        "device": "cpu",
        "threads": 1,
        "pairs": len(per_pair),
        "warmup": 3,
        "common": ["experiment=loss_parity_cpu"],
        "a": {**side, "overrides": a},
        "b": {**side, "overrides": b},
        "ratio": {"median": float(np.median(per_pair)), "per_pair": per_pair},
    }


def test_speed_verdict_is_the_interleaved_benchmark(tmp_path):
    sweep(tmp_path)
    per = [0.9, 0.95, 0.92, 0.97]
    (tmp_path / "step_bench.json").write_text(json.dumps(bench(["norm=layer"], ["norm=rms"], per)))
    r = build_report(tmp_path).bench["ratios"]["norm=rms"]
    assert r["median"] == pytest.approx(np.median(per)) and r["pairs"] == 4
    assert r["ci"] == pytest.approx(ratio_interval(per)["ci"])
    # the benchmark's A is the variant: its B/A is inverted
    (tmp_path / "step_bench.json").write_text(json.dumps(bench(["norm=rms"], ["norm=layer"], per)))
    r = build_report(tmp_path).bench["ratios"]["norm=rms"]
    assert r["median"] == pytest.approx(np.median([1 / x for x in per]))
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**This is the speed verdict**" in md and "secondary, see the speed verdict" in md


def test_a_step_bench_that_is_not_one_is_refused(tmp_path):
    sweep(tmp_path)
    (tmp_path / "step_bench.json").write_text(json.dumps({"mode": "norms"}))
    with pytest.raises(ReportError, match="not a `normlab-bench step` result"):
        build_report(tmp_path)


def test_per_seed_step_time_ratios_that_spread_are_not_comparable(tmp_path):
    for seed in LAYER:
        # within each variant the run medians span 1.4x (< 1.5); the per-seed ratios 1/1.4,
        # 1 and 1.4/1 span 1.96x
        write(tmp_path, "layer", seed, LAYER[seed], s_per_step=(1.4, 1.2, 1.0)[seed])
        write(tmp_path, "rms", seed, RMS[seed], s_per_step=(1.0, 1.2, 1.4)[seed])
    r = build_report(tmp_path).comparisons[0]["ratio"]
    assert not r["comparable"]
    assert r["problems"] == ["per-seed ratios span 1.96x > 1.5x"]


#: The baseline's mean validation curve of ``sweep``: 2.00 + (40 − step) · 0.01 at STEPS.
BASE_STEPS, BASE_MEAN = np.array(STEPS[1:], float), np.array([2.3, 2.2, 2.1, 2.0])
#: Its end slope by hand: least squares of loss on ln(step) over the last 4 evaluations, sign
#: flipped (0.2105 nats per e-fold of steps).
BASE_SLOPE = float(-np.polyfit(np.log(BASE_STEPS), BASE_MEAN, 1)[0])


def test_the_far_from_convergence_rule_reads_the_slope_over_the_last_tenth_of_the_steps():
    """At a slope s (nats per e-fold of steps) the loss falls by s · ln(1 / 0.9) over the last
    10% of the steps: a margin under that gets the caveat, one over it does not, and the caveat
    gives the margin's worth in compute, the header's one figure, expm1(margin / s)."""
    slope = 0.3
    fall = slope * math.log(1 / 0.9)  # 0.0316 nats
    assert short_run_caveat(0.99 * fall, slope, "annealed") is not None
    assert short_run_caveat(1.01 * fall, slope, "annealed") is None
    assert short_run_caveat(0.001, math.nan, "within-run") is None  # no slope: no reading
    text = short_run_caveat(0.01, slope, "annealed")
    assert f"(±0.01 nats, worth {math.expm1(0.01 / slope):.2%} of effective compute)" in text
    assert "at the baseline's annealed slope (0.3 nats per e-fold of steps)" in text
    assert "10% more steps would lower its loss by about 0.0316 nats, 3.16 times the margin" in text
    assert "at the baseline's end slope (0.3 nats" in short_run_caveat(0.01, slope, "within-run")


def test_context_section_states_tokens_epochs_eval_size_and_gap(tmp_path):
    rep = build_report(sweep(tmp_path))
    c = rep.context
    assert c["tokens_seen"] == 40 * TOKENS_PER_STEP and c["epochs"] == pytest.approx(2.0)
    assert c["eval_tokens"] == 3 * 2 * 8
    # val final − mean of the last 10 train losses: final − (final − 0.05 + mean(9..0)·0.01)
    assert c["gap"]["norm=layer"] == pytest.approx(0.05 - 0.045)
    assert "worth" not in c  # what the margin is worth is the header's one figure, in compute
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Context" in md and "48 validation tokens scored per evaluation" in md
    worth = f"±0.02 nats/token is worth {math.expm1(0.02 / BASE_SLOPE):.2%} of effective compute"
    assert worth in md.split("## Compute-equivalent")[0] and "2 epochs" in md
    assert "last training steps" not in md
    assert "max_time_s none (no time budget)" in md  # unset is said as unset, not "not recorded"
    assert "800,000 parameters" in md  # one count for every variant: said once
    assert "estimated from 3 pairs, 2 degree(s) of freedom: a rough figure" in md  # small n
    for d in tmp_path.glob("*rms*"):  # RMSNorm has no bias: fewer parameters than LayerNorm
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**s, "params": 799_000}))
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "parameters: 800,000 (`norm=layer`), 799,000 (`norm=rms`)" in md  # no median of two


@pytest.mark.slow
def test_wandb_offline_logs_the_report(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    sweep(tmp_path / "s")
    out = tmp_path / "out"
    assert main([str(tmp_path / "s"), "--out", str(out), "--wandb"]) == 0
    (run,) = out.glob("wandb/offline-run-*")  # offline, in the report's dir
    tables = {p.name.split("_0_")[0]: p for p in run.glob("files/media/table/report/*.table.json")}
    assert {"variants", "comparisons", "bpb", "time_to_target", "heldout_wiki_vital_loss"} <= set(
        tables
    )
    variants = json.loads(tables["variants"].read_text())
    assert [row[0] for row in variants["data"]] == ["norm=layer", "norm=rms"]
    images = {p.name.split("_0_")[0] for p in run.glob("files/media/images/report/*.png")}
    assert {"val_loss", "val_diff", "val_time", "val_tokens"} <= images


def test_runs_stopped_by_the_time_budget_and_by_steps_are_a_confound(tmp_path):
    sweep(tmp_path)
    for d in tmp_path.glob("rms-seed*"):
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**s, "stopped_by": "max_time_s"}))
    rep = build_report(tmp_path)
    assert any("neither equal steps nor equal training time" in w for w in rep.confounds)
    assert rep.context["stopped_by"] == {"norm=layer": ["max_steps"], "norm=rms": ["max_time_s"]}


def test_wandb_settings_come_from_the_runs_logger_config_or_the_flags(tmp_path):
    rep = build_report(sweep(tmp_path / "my_sweep"))
    got = wandb_settings(rep)
    assert got == {
        "mode": "offline",  # the runs' logger.mode
        "project": "normlab",
        "group": "g",  # the runs' logger.group
        "job_type": "report",
        "name": "report-g",
    }
    assert wandb_settings(rep, "online", "p")["mode"] == "online"
    for r in rep.runs:
        r.config["logger.group"] = None if r.seed else "other"  # no shared group
        r.config["logger.kind"] = "none"
    got = wandb_settings(rep)
    assert got["group"] == "my_sweep" and got["mode"] == "offline"  # the sweep dir's name


def test_an_evaluation_row_without_training_seconds_takes_its_steps_time(tmp_path):
    d = write(tmp_path, "layer", 0, 2.0, s_per_step=0.5)
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # evaluations written as rows of their own, without perf/train_time_s
        if "val/loss" in row and row["step"] == 30:
            row.pop("perf/train_time_s")
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from normlab.report.runs import load_run
    from normlab.report.target import first_reach

    run = load_run(d)
    assert first_reach(run, 2.10) == {
        "step": 30.0,
        "seconds": 14.5,
        "tokens": 30.0 * 16,
        "last": False,
    }
    assert first_reach(run, 2.0)["last"]  # its final loss: reached at its last evaluation
    assert first_reach(run, 2.20)["seconds"] == 10.0  # its own row's seconds at step 20
    assert first_reach(run, 1.5) is None


def figure_texts(monkeypatch) -> dict[str, list[str]]:
    """Record every text drawn on each figure the report saves (file name -> texts)."""
    from matplotlib.text import Text

    from normlab.report import plots

    seen: dict[str, list[str]] = {}
    save = plots.save  # every figure file is written through it

    def spy(fig, path):
        seen[Path(path).name] = [t.get_text() for t in fig.findobj(Text)]
        return save(fig, path)

    monkeypatch.setattr(plots, "save", spy)
    return seen


@pytest.mark.parametrize("spread", [True, False])
def test_figures_of_sequential_times_carry_the_not_comparable_mark(tmp_path, monkeypatch, spread):
    """When the sequential step times do not compare, step_time.png and val_time.png say so on
    the figure, and the text under each says so too; when they compare, neither does."""
    for seed in LAYER:  # per-seed ratios spanning 1.96x: not comparable (test above)
        slow = (1.4, 1.2, 1.0)[seed] if spread else 1.0
        write(tmp_path, "layer", seed, LAYER[seed], s_per_step=slow)
        write(tmp_path, "rms", seed, RMS[seed], s_per_step=(1.0, 1.2, 1.4)[seed] if spread else 1.0)
    texts = figure_texts(monkeypatch)
    assert main([str(tmp_path)]) == 0
    mark = "NOT COMPARABLE: step times fail the report's checks"
    for name in ("step_time.png", "val_time.png"):
        assert (mark in texts[name]) is spread, name
    assert not any(
        mark in t for name, t in texts.items() if name not in ("step_time.png", "val_time.png")
    )
    figures = (tmp_path / "report" / "report.md").read_text().split("## Figures")[1]
    notes = [ln for ln in figures.splitlines() if ln.startswith("> **Not comparable:**")]
    assert len(notes) == (2 if spread else 0)
    lines = [ln for ln in figures.splitlines() if ln.strip()] + [""]
    for fig in ("val_time.png", "step_time.png"):  # each note right under its figure
        after = lines[next(i for i, ln in enumerate(lines) if f"({fig})" in ln) + 1]
        note = "> **Not comparable:** the sequential step times of `norm=rms` vs `norm=layer`"
        assert after.startswith(note) is spread


def set_summaries(root: Path, **fields) -> None:
    for f in root.glob("*/summary.json"):
        f.write_text(json.dumps(json.loads(f.read_text()) | fields))


def test_a_verdict_on_runs_far_from_convergence_gets_a_caveat(tmp_path):
    """The baseline's end slope (``BASE_SLOPE``, 0.2105 nats per e-fold of steps) makes its loss
    fall by 0.0222 nats over its last 10% of steps: more than a margin of 0.004 (worth 1.92% of
    compute), less than one of 0.1. Epochs alone give no caveat: a curve flat at its end has
    converged for this margin however little of its corpus it saw."""
    sweep(tmp_path)
    caveat = "the verdict is for this budget"
    steep = build_report(tmp_path, margin=0.004).confounds
    fall = BASE_SLOPE * math.log(1 / 0.9)
    assert [w for w in steep if caveat in w] == [
        f"{caveat}: at the baseline's end slope ({BASE_SLOPE:.3g} nats per e-fold of steps) 10% "
        f"more steps would lower its loss by about {fall:.3g} nats, {fall / 0.004:.3g} times the "
        f"margin (±0.004 nats, worth {math.expm1(0.004 / BASE_SLOPE):.2%} of effective compute). "
        "A difference, or an equivalence, this small against the curve's fall need not hold at a "
        "longer budget, whatever the power: read it at these steps, or train longer (max_steps)"
    ]
    assert not any(caveat in w for w in build_report(tmp_path, margin=0.1).confounds)
    # 40 steps x 16 tokens = 640 tokens of a 64,000-token split (0.01 epochs), 640 / 800,000
    # parameters = 0.0008 tokens per parameter: a short run by epochs, no caveat at this margin
    set_summaries(tmp_path, data={"tokens": {"train": 64_000}})
    assert not any(caveat in w for w in build_report(tmp_path, margin=0.1).confounds)
    assert main([str(tmp_path), "--margin", "0.004"]) == 0
    verdict = (tmp_path / "report" / "report.md").read_text().split("## Verdict")[1]
    (warning,) = [w for w in steep if caveat in w]
    assert f"> **Warning:** {warning}." in verdict.split("**`norm=rms` − `norm=layer`**")[0]


def test_a_headline_whose_speed_part_is_not_comparable_gives_the_steps_part_alone(tmp_path, capsys):
    for seed in LAYER:  # per-seed step-time ratios spanning 1.96x: not comparable
        write(tmp_path, "layer", seed, LAYER[seed], s_per_step=(1.4, 1.2, 1.0)[seed])
        write(tmp_path, "rms", seed, RMS[seed], s_per_step=(1.0, 1.2, 1.4)[seed])
    rep = build_report(tmp_path)
    k = rep.comparisons[0]["compute"]
    steps = k["steps_only"]
    assert steps["k"] == pytest.approx(k["step_mult"]) and steps["speed"] == 1.0
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head = next(ln for ln in out.splitlines() if "the effective compute of" in ln)
    assert head.endswith(
        f"; its speed part is NOT COMPARABLE (sequential step times that fail the report's "
        f"checks): the steps part alone is {steps['k']:.3f}x [{steps['ci'][0]:.3f}, "
        f"{steps['ci'][1]:.3f}] (n = 3)"
    )
    assert head.strip() in (tmp_path / "report" / "report.md").read_text().replace("**", "")


def test_the_verdict_line_says_what_the_margin_is_worth_and_that_the_default_is_a_screen(
    tmp_path, capsys
):
    for seed in LAYER:
        write(tmp_path, "layer", seed, LAYER[seed])
        write(tmp_path, "rms", seed, RMS[seed])
    assert main([str(tmp_path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if " vs norm=layer: n=" in ln)
    assert "nats is worth " in line and "% of effective compute here" in line
    assert line.endswith(
        "; the default margin: a gross-difference screen, not a parity claim: set --margin)"
    )
    assert main([str(tmp_path), "--margin", "0.01"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if " vs norm=layer: n=" in ln)
    assert "(±0.01 nats is worth " in line and "screen" not in line
