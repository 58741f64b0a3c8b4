"""normlab.report reading and labelling runs: old and new metric names, unreadable run dirs, labels
from keys that change numbers, run dirs from anywhere, confound warnings, step-time checks, the
paired difference per step and robust figure limits."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from normlab.commands.report import main
from normlab.report import METRIC_RENAMES, ReportError, build_report, load_runs
from normlab.report.runs import normalise_row
from normlab.report.series import loss_limits, paired_curve, robust_limits
from normlab.report.speed import between_runs_problem, timing_check

from .test_report import make_sweep, write_run


def rename_metrics(run_dir: Path, mapping: dict[str, str]) -> None:
    """Rewrite a run's metrics.jsonl with keys renamed by ``mapping``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [{mapping.get(k, k): v for k, v in r.items()} for r in rows]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def set_summary(run_dir: Path, **fields) -> None:
    s = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps(s | fields))


# --- metric names before and after the rename ----------------------------------------------------


def test_old_and_new_metric_names_load_to_the_same_rows(tmp_path):
    old = write_run(
        tmp_path, "layer", 0, 3.0, name="old"
    )  # writes lr, grad_norm, step_time_ms, ...
    new = write_run(tmp_path, "layer", 0, 3.0, name="new")
    rename_metrics(new, METRIC_RENAMES)
    a, b = load_runs([old, new])
    assert a.metrics == b.metrics
    assert a.metrics[5]["perf/step_time_ms"] == 100.0 and a.metrics[5]["train/lr"] == 6e-4
    assert not any(k in row for row in a.metrics for k in METRIC_RENAMES)
    # a row with both names (a run resumed across the rename) keeps the new one
    assert normalise_row({"step": 1, "lr": 1.0, "train/lr": 2.0}) == {"step": 1, "train/lr": 2.0}


def test_a_metrics_file_with_neither_set_of_names_is_refused_in_one_line(tmp_path, capsys):
    make_sweep(tmp_path)
    bad = write_run(tmp_path, "rms", 9, 3.0)
    (bad / "metrics.jsonl").write_text('{"iter": 1, "loss": 3.2}\n{"iter": 2, "loss": 3.1}\n')
    with pytest.raises(ReportError, match=r"cannot read .*rms-seed9/metrics.jsonl: no row has"):
        build_report(tmp_path)
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "train/loss" in err and "step_time_ms" in err  # both sets named


def test_unreadable_config_yaml_is_refused_naming_the_file(tmp_path):
    run = write_run(tmp_path, "rms", 0, 3.0)
    (run / ".hydra" / "config.yaml").write_text("norm: [unclosed\n")
    with pytest.raises(ReportError, match=r"cannot read .*config.yaml"):
        build_report(tmp_path)


#: Billion laughs (9 levels of 9 aliases: 9**9 strings once expanded), under a config key.
ALIAS_BOMB = "lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
)
#: Runs ``normlab-report`` and prints its own run time (s) on stdout.
TIMED_REPORT = (
    "import sys, time; from normlab.commands.report import main; t = time.perf_counter(); "
    "code = main(sys.argv[1:]); print(f'{time.perf_counter() - t:.3f}'); sys.exit(code)"
)


def _at_most_4_gib():  # a regression must not take the machine's memory with it
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_yaml_alias_bomb_in_a_run_dir_is_refused_in_one_line_within_seconds(tmp_path):
    make_sweep(tmp_path)
    config = tmp_path / "rms-seed1" / ".hydra" / "config.yaml"
    config.write_text(config.read_text() + ALIAS_BOMB)
    r = subprocess.run(
        [sys.executable, "-c", TIMED_REPORT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_at_most_4_gib,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src")),
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and f"cannot read {config}: a YAML anchor or alias" in r.stderr
    assert float(r.stdout.split()[-1]) < 5.0
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("name", ["config.yaml", "overrides.yaml"])
def test_run_dir_yaml_and_json_are_read_within_limits(tmp_path, name):
    run = write_run(tmp_path, "rms", 0, 3.0)
    (run / ".hydra" / name).write_text("[" * 40 + "]" * 40)
    with pytest.raises(ReportError, match=rf"cannot read .*{name}: nested deeper than 32"):
        build_report(tmp_path)
    (run / ".hydra" / name).write_text("x: '" + "y" * (1 << 20) + "'\n")
    with pytest.raises(ReportError, match=rf"cannot read .*{name}: larger than 1 MiB"):
        build_report(tmp_path)
    (run / ".hydra" / name).unlink()
    os.mkfifo(run / ".hydra" / name)  # would block a reader that waits for a writer
    with pytest.raises(ReportError, match=rf"cannot read .*{name}: not a regular file"):
        build_report(tmp_path)
    (run / ".hydra" / name).unlink()
    (run / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ReportError, match=r"cannot read .*summary.json: nested deeper than 32"):
        build_report(tmp_path)


# --- labels from the keys that change numbers -----------------------------------------------------


def test_inert_keys_never_label_nor_refuse(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "layer", seed, 3.0, overrides=["norm=layer", f"seed={seed}"])
        write_run(
            tmp_path,
            "rms",
            seed,
            3.0,
            overrides=["norm=rms", f"seed={seed}", "progress=False", "hydra/launcher=basic"],
            edits={"logger.kind": "wandb"},
        )
    write_run(
        tmp_path,
        "rms",
        2,
        3.0,
        overrides=["norm=rms", "seed=2", "progress=false", "debug=true", "ckpt_interval=5"],
    )
    cfg_only = tmp_path / "rms-seed2"
    cfg = (cfg_only / ".hydra" / "config.yaml").read_text()
    cfg += "progress: false\ndebug: true\nckpt_interval: 5\npeak_tflops: 1.0\n"
    (cfg_only / ".hydra" / "config.yaml").write_text(cfg)
    rep = build_report(tmp_path)
    assert rep.labels == ["norm=layer", "norm=rms"]


def test_an_override_that_changes_nothing_is_left_out_of_the_label(tmp_path):
    # norm.eps=1e-05 set explicitly on one run: every run resolves eps to 1e-05 in its config
    for seed in (0, 1):
        write_run(tmp_path, "layer", seed, 3.0, edits={"norm.eps": 1e-5})
        ovr = ["norm=rms", f"seed={seed}", "model=tiny"] + (["norm.eps=1e-05"] if seed else [])
        write_run(tmp_path, "rms", seed, 3.0, overrides=ovr, edits={"norm.eps": 1e-5})
    rep = build_report(tmp_path)
    assert rep.labels == ["norm=layer", "norm=rms"]
    assert rep.common_overrides == ["model=tiny", "norm.eps=1e-05"]


def test_tokens_per_step_from_the_resolved_config(tmp_path):
    run = write_run(tmp_path, "layer", 0, 3.0, edits={"model.context_length": 16})
    set_summary(run, config={"data": {"batch_size": 4}, "optim": {"grad_accum": 2}})
    assert load_runs([run])[0].tokens_per_step == 4 * 2 * 16
    other = write_run(tmp_path, "rms", 0, 3.0)  # no grad_accum, no context_length: unknown
    assert load_runs([other])[0].tokens_per_step is None


def test_run_dirs_from_anywhere_are_compared(tmp_path):
    a = write_run(tmp_path / "monday" / "outputs", "layer", 0, 3.00, overrides=["norm=layer"])
    b = write_run(tmp_path / "tuesday", "rms", 0, 3.02, overrides=["norm=rms"])
    out = tmp_path / "cmp"
    assert main([str(a), str(b), "--out", str(out), "--margin", "0.05"]) == 0
    md = (out / "report.md").read_text()
    assert f"Runs from: `{a}`, `{b}`" in md and "| `norm=rms` | 1 |" in md
    assert "difference +0.0200 nats/token" in md
    names = [r.name for r in build_report([a, b]).runs]
    assert names == ["monday/outputs/layer-seed0", "tuesday/rms-seed0"]


# --- confounds -----------------------------------------------------------------------------------


def verdict_section(tmp_path: Path) -> str:
    assert main([str(tmp_path), "--margin", "0.05"]) == 0
    return (tmp_path / "report" / "report.md").read_text().split("## Verdict")[1].split("\n## ")[0]


def test_warns_when_variants_differ_in_resolved_implementation(tmp_path):
    make_sweep(tmp_path)
    for d in tmp_path.glob("rms-*"):
        set_summary(d, norm_impl="cpp")  # auto resolved to cpp for rms only
    for d in tmp_path.glob("layer-*"):
        set_summary(d, norm_impl="cpp")
    assert "norm.impl" not in verdict_section(tmp_path)  # same family on both sides
    for d in tmp_path.glob("layer-*"):
        set_summary(d, norm_impl="torch")
    text = verdict_section(tmp_path)
    assert "differ in norm implementation (norm.impl: `norm=layer`: torch; `norm=rms`: cpp)" in text
    assert "norm.impl=torch does not compute every kind with the same code" in text


def test_warns_for_torch_on_both_sides_and_for_precision_and_compile(tmp_path):
    make_sweep(tmp_path)  # both norm.impl=torch
    text = verdict_section(tmp_path)
    assert "norm.impl=torch does not compute every kind with the same code" in text
    assert "differ in norm implementation" not in text
    for d in tmp_path.glob("rms-*"):
        set_summary(d, precision="bf16", config={"compile": True})
    text = verdict_section(tmp_path)
    assert "differ in precision (precision.dtype: `norm=layer`: fp32; `norm=rms`: bf16)" in text
    assert "differ in compile (compile: `norm=layer`: None; `norm=rms`: True)" in text


# --- step-time checks ----------------------------------------------------------------------------


def test_timing_rules_spread_drift_and_between_runs():
    steady = timing_check([100.0, 101.0, 99.0, 100.0, 100.0, 101.0])
    assert steady["checked"] and steady["problems"] == []
    # p90 of [100]*8 + [400, 400] is 400: spread 4.0
    spread = timing_check([100.0] * 8 + [400.0] * 2)
    assert spread["spread"] == pytest.approx(4.0) and "p90/median 4.00 > 1.5" in spread["problems"]
    drift = timing_check([100.0] * 4 + [130.0] * 4)  # second-half median / first-half - 1 = +30%
    assert drift["drift"] == pytest.approx(0.3)
    assert drift["problems"] == ["median shift +30% between halves (limit ±20%)"]
    assert timing_check([100.0, 900.0])["checked"] is False
    assert between_runs_problem([100.0, 160.0]) == "run medians span 1.60x > 1.5x"
    assert between_runs_problem([100.0, 140.0]) is None


def test_sequential_step_times_from_a_changing_machine_are_flagged(tmp_path):
    make_sweep(tmp_path)
    set_summary(tmp_path / "layer-seed1", step_times_ms=[100.0] * 4 + [150.0] * 4)
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| `norm=rms` | 3 | 1.097 | [0.875, 1.376] | **no** |" in md
    assert "- layer-seed1: median shift +50% between halves (limit ±20%)" in md


# --- paired difference per step, figures ---------------------------------------------------------


def test_paired_curve_by_hand(tmp_path):
    # val/loss = final + (20 - step) * 0.05 at steps 10, 20: the difference is the final one
    rep = build_report(make_sweep(tmp_path))
    cur = rep.comparisons[0]["curve"]
    assert cur["step"].tolist() == [10.0, 20.0] and cur["n"].tolist() == [3, 3]
    assert cur["mean"] == pytest.approx([0.02, 0.02])
    assert cur["lo"] == pytest.approx([0.02 - 0.024841] * 2, abs=1e-6)  # as t_interval's test
    # the inner band is the 90% interval TOST reads: t(0.95, 2) / t(0.975, 2) of the 95% width
    assert cur["lo_tost"] == pytest.approx([0.02 - 0.024841 * 2.919986 / 4.302653] * 2, abs=1e-6)
    assert cur["hi_tost"] == pytest.approx([0.02 + 0.024841 * 2.919986 / 4.302653] * 2, abs=1e-6)
    base = {0: [{"step": 1, "val/loss": 2.0}, {"step": 2, "val/loss": 1.0}]}
    var = {0: [{"step": 2, "val/loss": 1.5}], 1: [{"step": 2, "val/loss": 9.0}]}  # seed 1 unpaired
    one = paired_curve(base, var)
    assert one["step"].tolist() == [2.0] and one["mean"].tolist() == [0.5]
    assert np.isnan(one["lo"][0])


def test_val_diff_and_robust_step_time_figures_are_written(tmp_path):
    make_sweep(tmp_path)
    set_summary(tmp_path / "rms-seed0", step_times_ms=[110.0] * 50 + [22000.0])
    assert main([str(tmp_path)]) == 0
    out = tmp_path / "report"
    for name in ("val_diff.png", "step_time.png"):
        assert (out / name).stat().st_size > 5000
        assert f"]({name})" in (out / "report.md").read_text()


def test_robust_limits_by_hand():
    # 0..100: 1st and 99th percentiles 1 and 99, padded by 10% of 98 on each side
    assert robust_limits([float(x) for x in range(101)]) == pytest.approx((-8.8, 108.8))
    # two 22 s steps among 200 at 100 ms do not set the scale: percentiles 100 and 100, pad 5%
    assert robust_limits([100.0] * 200 + [22000.0] * 2) == pytest.approx((95.0, 105.0))
    # 5% outliers pass the 99th percentile (22000), not Q3 + 3 IQR: 100..109 (x10) and five
    # 22000s have Q1 102, Q3 107, fence 107 + 15 = 122; 1st percentile 100; pad 10% of 22
    assert robust_limits([100.0 + i % 10 for i in range(100)] + [22000.0] * 5) == pytest.approx(
        (97.8, 124.2)
    )


def test_the_initial_models_loss_does_not_set_the_loss_axis():
    steps = np.array([0.0, 50, 100, 150])
    a, b = np.array([5.6, 2.6, 2.2, 2.0]), np.array([5.5, 2.5, 2.1, 1.9])
    # top: 2.6 (step 0 left out), bottom: 1.9; padded by 5% of 0.7
    assert loss_limits([(steps, a), (steps, b)]) == pytest.approx((1.865, 2.635))
    # a curve of 2 points keeps both: nothing to zoom to without the first
    assert loss_limits([(steps[:2], a[:2])]) == pytest.approx((2.6 - 0.15, 5.6 + 0.15))
    # no finite value: no limits
    lo, hi = loss_limits([(steps, np.full(4, np.nan))])
    assert math.isnan(lo) and math.isnan(hi)


# --- run dirs that never trained -----------------------------------------------------------------


def test_run_dirs_that_never_trained_are_skipped_with_a_note(tmp_path, capsys):
    """What a refused ``train`` leaves in ``outputs/runs`` (``.hydra/`` and a ``summary.json`` with
    ``status: refused``; an older version left no summary) is no variant: one note names it."""
    make_sweep(tmp_path)
    refused = write_run(
        tmp_path,
        "layer",
        0,
        None,
        name="refused",
        edits={"norm.eps": 0.0},
        overrides=["norm=layer", "norm.eps=0", "seed=0", "model=tiny"],
    )
    (refused / "metrics.jsonl").unlink()
    error = "norm.eps=0.0 is not allowed: must be a finite number > 0"
    (refused / "summary.json").write_text(json.dumps({"status": "refused", "error": error}))
    old = write_run(tmp_path, "rms", 0, None, name="old-refused", summary=False)
    (old / "metrics.jsonl").unlink()
    (old / "train.log").write_text("refused\n")
    rep = build_report(tmp_path)
    assert rep.labels == ["norm=layer", "norm=rms"] and len(rep.runs) == 6
    assert [(r.name, why) for r, why in rep.skipped] == [
        ("old-refused", "never trained (no metrics.jsonl row, no summary.json)"),
        ("refused", f"refused before training: {error}"),
    ]
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"  note: skipped {refused}: refused before training: {error}\n" in out
    assert f"  note: skipped {old}: never trained" in out
    md = (tmp_path / "report" / "report.md").read_text()
    assert "- Skipped (never trained, in no table): `old-refused` (never trained" in md
    assert "## Excluded runs\n\nNone" in md


def test_only_run_dirs_that_never_trained_is_one_line_exit_1(tmp_path, capsys):
    d = write_run(tmp_path, "layer", 0, None, name="refused", summary=False)
    (d / "metrics.jsonl").unlink()
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"normlab-report: error: no run in {tmp_path} trained (refused or never started: refused)\n"
    )
