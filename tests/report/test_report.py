"""normlab.report: statistics against hand-computed numbers, refusal, exclusion, figures, the CLI.

Sweeps are synthetic: each test writes the run-dir files the trainer writes
(``.hydra/overrides.yaml``, ``.hydra/config.yaml``, ``metrics.jsonl``, ``summary.json``) with
known final losses and step times; their metrics use the names written before the namespaced
rename (``lr``, ``step_time_ms``), which the report still reads.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from normlab.commands.report import main
from normlab.report import (
    ReportError,
    build_report,
    describe,
    family,
    log_report_to_wandb,
    paired_difference,
    ratio_interval,
    render_markdown,
    report_tables,
    stats,
    t_interval,
)

# Student t quantiles with 2 degrees of freedom (tables): t(0.975, 2) and t(0.95, 2).
T975_2, T95_2 = 4.302653, 2.919986


def t2_cdf(t: float) -> float:
    """CDF of Student t with 2 degrees of freedom, closed form: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


BASE = {
    "model": {"name": "tiny", "n_layer": 2, "d_model": 64, "vocab_size": None},
    "norm": {},
    "precision": {"dtype": "fp32"},
    "data": {"name": "shakespeare", "batch_size": 4},
    "optim": {"lr": 0.0006, "warmup_steps": 10},
    "logger": {"kind": "none", "name": None},
    "seed": 0,
    "max_steps": 20,
}
NORMS = {
    "layer": {"kind": "layer", "impl": "torch", "eps": None, "placement": "pre", "bias": True},
    "rms": {"kind": "rms", "impl": "torch", "eps": None, "placement": "pre", "bias": False},
}


def write_run(
    root: Path,
    norm: str,
    seed: int,
    final: float | None,
    *,
    step_ms: float = 100.0,
    status: str = "completed",
    summary: bool = True,
    edits: dict | None = None,
    overrides: list[str] | None = None,
    name: str | None = None,
) -> Path:
    """One run dir as the trainer writes it; ``edits`` sets dotted config keys."""
    d = root / (name or f"{norm}-seed{seed}")
    (d / ".hydra").mkdir(parents=True)
    cfg = copy.deepcopy(BASE)
    cfg["norm"], cfg["seed"] = dict(NORMS[norm]), seed
    for key, value in (edits or {}).items():
        *parents, leaf = key.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        node[leaf] = value
    ovr = overrides if overrides is not None else [f"norm={norm}", f"seed={seed}", "model=tiny"]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(ovr))
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    end = final if final is not None else 3.5
    rows = []
    for step in range(1, 21):
        row = {
            "step": step,
            "train/loss": end + (20 - step) * 0.1,
            "lr": 6e-4,
            "grad_norm": 0.8,
            "step_time_ms": None if step <= 2 else step_ms,
            "tokens_per_s": None if step <= 2 else 1e5 / step_ms,
        }
        if step % 10 == 0:
            row["val/loss"] = end + (20 - step) * 0.05
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        s = {
            "status": status,
            "final_val_loss": final if status == "completed" else None,
            "step_time_ms_median": step_ms,
            "step_time_ms_p90": step_ms * 1.1,
            "tokens_per_s": 1e5 / step_ms,
            "mfu": 0.01,
            "params": 1000,
            "steps_completed": 20,
            "max_steps": 20,
            "seed": seed,
            "norm": NORMS[norm],
            "precision": "fp32",
            "step_times_ms": [step_ms * (1 + 0.01 * i) for i in range(-3, 4)],
            "config": cfg,
            "versions": {},
        }
        if status == "diverged":
            s.update(diverged_at_step=7, steps_completed=7)
        if status == "failed":
            s.update(error="RuntimeError: CUDA out of memory")
        (d / "summary.json").write_text(json.dumps(s))
    return d


# layer vs rms, seeds 0-2: rms - layer final val loss = [0.01, 0.02, 0.03];
# step-time ratios [1.1, 1.2, 1.0].
LAYER = {0: 3.00, 1: 3.10, 2: 3.05}
RMS = {0: 3.01, 1: 3.12, 2: 3.08}
RMS_MS = {0: 110.0, 1: 120.0, 2: 100.0}


def make_sweep(root: Path, layer=LAYER, rms=RMS) -> Path:
    (root / "multirun.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    for seed, loss in layer.items():
        write_run(root, "layer", seed, loss, step_ms=100.0)
    for seed, loss in rms.items():
        write_run(root, "rms", seed, loss, step_ms=RMS_MS.get(seed, 100.0))
    return root


# --- statistics against hand-computed values ------------------------------------------------


def test_describe_uses_sample_std_ddof1():
    d = describe([3.0, 3.1, 3.2])
    assert d["n"] == 3 and d["mean"] == pytest.approx(3.1) and d["std"] == pytest.approx(0.1)
    assert (d["min"], d["max"]) == (3.0, 3.2)
    assert math.isnan(describe([3.0])["std"]) and describe([])["n"] == 0


def test_t_interval_matches_student_t_by_hand():
    # [0.01, 0.02, 0.03]: mean 0.02, s 0.01, se 0.01/sqrt(3) = 0.0057735
    # -> 0.02 +- 4.302653 * se = 0.02 +- 0.024841
    lo, hi = t_interval([0.01, 0.02, 0.03], 0.95)
    assert (lo, hi) == (
        pytest.approx(0.02 - 0.024841, abs=1e-6),
        pytest.approx(0.02 + 0.024841, abs=1e-6),
    )
    lo90, hi90 = t_interval([0.01, 0.02, 0.03], 0.90)  # 2.919986 * se = 0.016859
    assert (lo90, hi90) == (pytest.approx(0.003141, abs=1e-6), pytest.approx(0.036859, abs=1e-6))
    assert all(math.isnan(x) for x in t_interval([0.01], 0.95))


def test_paired_difference_mean_std_ci_and_tost_p_values_by_hand():
    r = paired_difference([0.01, 0.02, 0.03], margin=0.05, alpha=0.05)
    se = 0.01 / math.sqrt(3)
    assert r["n"] == 3 and r["mean"] == pytest.approx(0.02) and r["std"] == pytest.approx(0.01)
    assert r["ci"] == (
        pytest.approx(0.02 - T975_2 * se, abs=1e-6),
        pytest.approx(0.02 + T975_2 * se, abs=1e-6),
    )
    assert r["ci_tost"] == (
        pytest.approx(0.02 - T95_2 * se, abs=1e-6),
        pytest.approx(0.02 + T95_2 * se, abs=1e-6),
    )
    # H0: mu <= -0.05: t = 0.07/se = 12.124, p = 1 - F(t) = 0.003367;
    # H0: mu >= 0.05: t = -0.03/se, p = F(t) = 0.017549
    assert (
        r["p_lower"]
        == pytest.approx(1 - t2_cdf(0.07 / se), rel=1e-9)
        == pytest.approx(0.003367, abs=1e-6)
    )
    assert (
        r["p_upper"]
        == pytest.approx(t2_cdf(-0.03 / se), rel=1e-9)
        == pytest.approx(0.017549, abs=1e-6)
    )
    assert r["verdict"] == "equivalent within 0.05 nats"


@pytest.mark.parametrize(
    ("margin", "verdict"),
    [
        (0.05, "equivalent within 0.05 nats"),
        (0.0375, "equivalent within 0.0375 nats"),  # 90% CI upper bound 0.036859 < 0.0375
        (
            0.036,
            "not shown equivalent",
        ),  # 0.036859 > 0.036, and the 95% CI [-0.0048, 0.0448] holds 0
        (0.01, "not shown equivalent"),
    ],
)
def test_tost_verdict_on_both_sides_of_the_margin(margin, verdict):
    r = paired_difference([0.01, 0.02, 0.03], margin=margin)
    assert r["verdict"] == verdict
    assert (max(r["p_lower"], r["p_upper"]) < 0.05) == verdict.startswith("equivalent")


def test_clearly_different_when_95ci_excludes_zero_and_tost_fails():
    r = paired_difference([0.10, 0.11, 0.12], margin=0.02)  # 95% CI 0.11 +- 0.024841, all > 0
    assert r["verdict"] == (
        "different: 95% CI [+0.0852, +0.1348] excludes 0; not shown equivalent within 0.02 nats"
    )
    assert r["detectable"] and not r["equivalent"] and r["ci"][0] > 0
    assert r["p_upper"] == pytest.approx(t2_cdf(0.09 / (0.01 / math.sqrt(3))), rel=1e-9)  # near 1


def test_fewer_than_two_pairs_is_not_shown_equivalent():
    assert paired_difference([0.001], margin=0.05)["verdict"] == "not shown equivalent (n < 2)"
    assert paired_difference([], margin=0.05)["verdict"] == "not shown equivalent (n < 2)"


def test_step_time_ratio_ci_is_computed_on_log_ratios():
    # logs of [1.1, 1.2, 1.0]: mean 0.0925439, s 0.0911923; exp(mean) = 1.32**(1/3) = 1.096961;
    # exp(0.0925439 +- 4.302653 * 0.0911923 / sqrt(3)) = [0.874599, 1.375859]
    r = ratio_interval([1.1, 1.2, 1.0])
    assert r["n"] == 3 and r["gmean"] == pytest.approx(1.32 ** (1 / 3))
    assert r["ci"] == (pytest.approx(0.874599, abs=1e-5), pytest.approx(1.375859, abs=1e-5))


# --- loading, labels, baseline ----------------------------------------------------------------


def test_labels_drop_seed_and_shared_overrides_and_baseline_defaults_to_layernorm(tmp_path):
    rep = build_report(make_sweep(tmp_path), margin=0.05)
    assert rep.baseline == "norm=layer" and rep.common_overrides == ["model=tiny"]
    assert [v["label"] for v in rep.variants] == ["norm=layer", "norm=rms"]
    layer = rep.variants[0]
    assert (
        layer["n"] == 3
        and layer["mean"] == pytest.approx(3.05)
        and layer["std"] == pytest.approx(0.05)
    )
    assert (
        layer["step_time_ms"] == 100.0 and rep.variants[1]["step_time_ms"] == 110.0
    )  # median of 110, 120, 100
    c = rep.comparisons[0]
    assert c["seeds"] == [0, 1, 2] and c["diffs"] == pytest.approx([0.01, 0.02, 0.03])
    assert c["verdict"] == "equivalent within 0.05 nats"
    assert c["ratio"]["gmean"] == pytest.approx(1.32 ** (1 / 3))


def test_explicit_baseline_flips_the_sign_of_the_difference(tmp_path):
    c = build_report(make_sweep(tmp_path), margin=0.05, baseline="norm=rms").comparisons[0]
    assert c["label"] == "norm=layer" and c["mean"] == pytest.approx(-0.02)
    with pytest.raises(ReportError, match="not a variant"):
        build_report(tmp_path, baseline="norm=fused")


def test_pairs_only_seeds_present_in_both_variants(tmp_path):
    c = build_report(make_sweep(tmp_path, rms={1: 3.12, 2: 3.08, 7: 2.0}), margin=0.05).comparisons[
        0
    ]
    assert c["seeds"] == [1, 2] and c["n"] == 2 and c["mean"] == pytest.approx(0.025)


def test_seed_only_sweep_is_labelled_by_norm_kind_and_impl(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "rms", seed, 3.0 + seed / 10, overrides=[f"seed={seed}"])
    rep = build_report(tmp_path)
    assert rep.baseline == "rms/torch" and rep.variants[0]["n"] == 2 and rep.comparisons == []


# --- refusal ----------------------------------------------------------------------------------


def test_refuses_runs_that_differ_in_a_key_not_swept(tmp_path):
    make_sweep(tmp_path)
    write_run(tmp_path, "rms", 5, 3.0, edits={"optim.lr": 0.001})
    with pytest.raises(
        ReportError, match=r"runs differ in keys not swept: optim\.lr \(0\.0006 vs 0\.001\)"
    ):
        build_report(tmp_path)


def test_a_swept_design_explains_the_keys_its_file_sets_and_labels_the_variants(tmp_path):
    # design=<name> (conf/design/, package _global_) may set norm.* and model.* alike
    for seed in (0, 1):
        write_run(tmp_path, "rms", seed, 3.0, overrides=["design=rms", f"seed={seed}"])
        write_run(
            tmp_path,
            "rms",
            seed,
            3.01,
            overrides=["design=deepnorm", f"seed={seed}"],
            edits={"norm.placement": "deepnorm", "model.n_layer": 4},
            name=f"deepnorm-seed{seed}",
        )
    rep = build_report(tmp_path, baseline="design=rms")
    assert rep.baseline == "design=rms"
    assert [c["label"] for c in rep.comparisons] == ["design=deepnorm"]


def test_the_global_groups_are_the_conf_groups_whose_files_are_global():
    from normlab.config.base import find_conf_dir
    from normlab.report.variants import GLOBAL_GROUPS

    conf = find_conf_dir()
    found = {
        f.parent.name
        for f in conf.glob("*/*.yaml")
        if f.read_text().lstrip().startswith("# @package _global_")
    }
    assert found == set(GLOBAL_GROUPS)


def test_refuses_a_difference_inside_a_variant_even_under_its_group(tmp_path):
    make_sweep(tmp_path)
    write_run(
        tmp_path, "rms", 5, 3.0, edits={"norm.eps": 1e-6}
    )  # same override norm=rms, different eps
    with pytest.raises(ReportError, match=r"norm\.eps"):
        build_report(tmp_path)


def test_swept_groups_seed_and_logger_keys_are_not_refused(tmp_path):
    make_sweep(tmp_path)
    write_run(tmp_path, "rms", 5, 3.0, edits={"logger.name": "other"})
    write_run(
        tmp_path,
        "rms",
        6,
        3.0,
        edits={"optim.lr": 0.001},
        overrides=["norm=rms", "seed=6", "model=tiny", "optim.lr=0.001"],
    )
    labels = [v["label"] for v in build_report(tmp_path).variants]
    assert labels == ["norm=layer", "norm=rms", "norm=rms,optim.lr=0.001"]


def test_cli_refusal_exits_1_with_one_line_naming_the_key(tmp_path, capsys):
    make_sweep(tmp_path)
    write_run(tmp_path, "layer", 5, 3.0, edits={"data.batch_size": 8})
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "data.batch_size (4 vs 8)" in err
    assert not (tmp_path / "report" / "report.md").exists()


def test_python_dash_m_runs_the_cli(tmp_path):
    make_sweep(tmp_path)
    write_run(tmp_path, "layer", 5, 3.0, edits={"max_steps": 40})
    src = Path(__file__).resolve().parents[2] / "src"
    p = subprocess.run(
        [sys.executable, "-m", "normlab.commands.report", str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(src)),
        timeout=120,
    )
    assert p.returncode == 1 and "max_steps (20 vs 40)" in p.stderr


# --- exclusion ----------------------------------------------------------------------------------


def test_excludes_diverged_failed_and_unfinished_runs_and_lists_them(tmp_path):
    make_sweep(tmp_path)
    write_run(tmp_path, "rms", 3, None, status="diverged")
    write_run(tmp_path, "layer", 3, None, summary=False)
    write_run(tmp_path, "layer", 4, None, status="failed")
    write_run(tmp_path, "rms", 4, float("nan"))
    rep = build_report(tmp_path, margin=0.05)
    assert [v["n"] for v in rep.variants] == [3, 3] and [v["excluded"] for v in rep.variants] == [
        2,
        2,
    ]
    assert rep.comparisons[0]["n"] == 3 and rep.comparisons[0]["seeds"] == [0, 1, 2]
    assert main([str(tmp_path), "--margin", "0.05"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    excluded = md.split("## Excluded runs")[1].split("##")[0]
    assert "| `rms-seed3` | `norm=rms` | 3 | diverged at step 7 |" in excluded
    assert "| `layer-seed3` | `norm=layer` | 3 | did not finish (no summary.json) |" in excluded
    assert "failed: RuntimeError: CUDA out of memory" in excluded
    assert "non-finite final validation loss (nan)" in excluded
    assert "4 excluded" in md


# --- CLI end to end -----------------------------------------------------------------------------


def test_cli_writes_report_with_tables_verdict_and_nonempty_figures(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep")
    assert main([str(sweep), "--margin", "0.05"]) == 0
    out = sweep / "report"
    md = (out / "report.md").read_text()
    assert (
        f"Runs from: `{sweep}`" in md
        and "Baseline: `norm=layer`" in md
        and "±0.05 nats/token; alpha = 0.05" in md
    )
    assert "| `norm=layer` | 3 | 0 | 3.0500 | 0.0500 | 3.0000 | 3.1000 | 100.0 | 1,000 |" in md
    assert (
        "| `norm=rms` | 3 | +0.0200 | 0.0100 | [-0.0048, +0.0448] | [+0.0031, +0.0369] | 0.00337 "
        "| 0.0175 | equivalent within 0.05 nats |"
    ) in md
    assert "over n = 3 seeds" in md and "Verdict: **equivalent within 0.05 nats**" in md
    ratio = md.split("## Step-time ratio")[1].split("\n## ")[0]  # its method named, not retold
    assert "Method: `docs/reports.md#sequential-step-times`." in ratio
    assert "| `norm=rms` | 3 | 1.097 | [0.875, 1.376] |" in ratio
    assert "EMA" in md
    for name in ("val_loss.png", "train_loss.png", "step_time.png"):
        png = out / name
        assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in md
    assert "equivalent within 0.05 nats" in capsys.readouterr().out


def test_cli_narrow_margin_and_custom_out_dir(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    assert main([str(sweep), "--margin", "0.01", "--out", str(tmp_path / "r")]) == 0
    assert "Verdict: **not shown equivalent**" in (tmp_path / "r" / "report.md").read_text()


def test_cli_clearly_different_sweep(tmp_path):
    sweep = make_sweep(
        tmp_path / "sweep", rms={0: 3.10, 1: 3.21, 2: 3.17}
    )  # diffs [0.10, 0.11, 0.12]
    assert main([str(sweep)]) == 0
    md = (sweep / "report" / "report.md").read_text()
    assert "Verdict: **different: 95% CI [+0.0852, +0.1348] excludes 0; not shown equivalent" in md


def test_cli_bad_arguments_and_empty_dir(tmp_path):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--alpha", "0.7"])
    assert e.value.code == 2
    assert main([str(tmp_path)]) == 1  # no run dirs
    assert main([str(tmp_path / "missing")]) == 1


def test_all_runs_excluded_still_writes_report_but_exits_1(tmp_path):
    write_run(tmp_path, "layer", 0, None, status="diverged")
    write_run(tmp_path, "rms", 0, None, summary=False)
    assert main([str(tmp_path)]) == 1
    md = (tmp_path / "report" / "report.md").read_text()
    assert "diverged at step 7" in md and "- Validation loss vs step: no data" in md


def test_wandb_logging_is_a_no_op_without_a_run(tmp_path):
    assert log_report_to_wandb(build_report(make_sweep(tmp_path)), None) is False


def test_a_family_of_variants_gets_holm_adjusted_p_values_and_verdicts(tmp_path, capsys):
    """Two variants against one baseline (seeds 0-2): ``norm=rms`` differs by [0.02, 0.03, 0.04]
    (t = 0.03 / (0.01 / sqrt 3) = 3 sqrt 3, two-sided p = 0.0351: different alone), the other by
    [0, 0.05, 0.1] (t = sqrt 3, p = 0.225). Holm: 2 x 0.0351 = 0.0702, then max(0.0702, 0.225):
    the family shows no difference; the plain per-pair verdicts stay as they were."""
    for seed, loss in LAYER.items():
        write_run(tmp_path, "layer", seed, loss)
        write_run(tmp_path, "rms", seed, loss + (0.02, 0.03, 0.04)[seed])
        write_run(
            tmp_path,
            "rms",
            seed,
            loss + (0.0, 0.05, 0.1)[seed],
            name=f"rmsb-seed{seed}",
            edits={"norm.eps": 1e-3},
            overrides=["norm=rms", "norm.eps=1e-3", f"seed={seed}", "model=tiny"],
        )
    rep = build_report(tmp_path)
    other, rms = rep.comparisons
    assert (other["label"], rms["label"]) == ("norm.eps=1e-3,norm=rms", "norm=rms")
    p_rms = 2 * (1 - t2_cdf(3 * math.sqrt(3)))
    p_other = 2 * (1 - t2_cdf(math.sqrt(3)))
    assert p_rms == pytest.approx(0.0351, abs=1e-4) and p_other == pytest.approx(0.2254, abs=1e-4)
    assert rms["holm"]["p_diff"] == pytest.approx(p_rms)
    assert rms["holm"]["p_diff_holm"] == pytest.approx(2 * p_rms)
    assert other["holm"]["p_diff_holm"] == pytest.approx(p_other)
    tost = [max(c["p_lower"], c["p_upper"]) for c in (other, rms)]
    assert other["holm"]["p_tost_holm"] == pytest.approx(max(min(1.0, 2 * min(tost)), tost[0]))
    assert rms["detectable"] and rms["verdict"].startswith("different: 95% CI")
    assert not rms["holm"]["detectable"] and rms["holm"]["verdict"] == "not shown equivalent"
    table = report_tables(rep)["family_holm"]
    assert table[0][:4] == ["variant", "n", "p_tost", "p_tost_holm"]
    assert table[1][1][:2] == ["norm=rms", 3] and table[1][1][5] == pytest.approx(2 * p_rms)
    assert main([str(tmp_path)]) == 0
    assert (
        "norm=rms vs norm=layer: n=3, different: 95% CI [+0.0052, +0.0548] excludes 0; not "
        "shown equivalent within 0.02 nats; over the family (Holm): not shown equivalent (±0.02 "
        in (capsys.readouterr().out)
    )
    md = (tmp_path / "report" / "report.md").read_text()
    family = md.split("## Family of comparisons (Holm): 2 variants against `norm=layer`")[1]
    assert "| `norm=rms` | 3 | " in family and "| **not shown equivalent** |" in family
    assert "Over the family of 2 comparisons with `norm=layer` (Holm-adjusted p = " in md


def test_one_comparison_is_no_family_and_the_default_margin_is_named_a_screen(tmp_path):
    rep = build_report(make_sweep(tmp_path))
    assert "holm" not in rep.comparisons[0]
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Family of comparisons" not in md and "Over the family" not in md
    margin = next(ln for ln in md.splitlines() if ln.startswith("- Equivalence margin"))
    assert "±0.02 nats/token; alpha = 0.05 (the default margin: a gross-difference screen" in margin
    assert main([str(tmp_path), "--margin", "0.005"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "- Equivalence margin: ±0.005 nats/token; alpha = 0.05\n" in md


def three_variants(root: Path, rms: tuple, rmsb: tuple) -> Path:
    """``norm=layer`` (LAYER) and two RMSNorm variants, each LAYER plus its per-seed offsets."""
    for seed, loss in LAYER.items():
        write_run(root, "layer", seed, loss)
        write_run(root, "rms", seed, loss + rms[seed])
        write_run(
            root,
            "rms",
            seed,
            loss + rmsb[seed],
            name=f"rmsb-seed{seed}",
            edits={"norm.eps": 1e-3},
            overrides=["norm=rms", "norm.eps=1e-3", f"seed={seed}", "model=tiny"],
        )
    return root


def test_two_tied_variants_of_three_show_no_best_design(tmp_path, capsys):
    """Both RMSNorm variants beat the baseline clearly, by the same amount up to noise: the
    leader's lead over the runner-up (runner − leader = [0.005, -0.005, 0.0], mean 0) is not
    detectable, so no variant is named best."""
    three_variants(tmp_path, (-0.10, -0.11, -0.105), (-0.105, -0.105, -0.105))
    rep = build_report(tmp_path)
    assert all(c["holm"]["detectable"] for c in rep.comparisons)  # each beats the baseline
    b = family.best_design(rep)
    assert {b["leader"], b["runner_up"]} == {"norm=rms", "norm.eps=1e-3,norm=rms"}
    assert not b["shown"] and b["p"] > 0.5 and b["family"] == 3
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**No variant is shown best:** the lowest mean final loss" in md
    assert "Best design" not in md
    assert "No variant is shown best: the lowest mean" in capsys.readouterr().out


def test_a_leader_tested_ahead_of_the_runner_up_is_named_best(tmp_path):
    """``norm=rms`` beats the other RMSNorm variant by [0.09, 0.08, 0.1] (t = 0.09 / (0.01 /
    sqrt 3), two-sided p = 0.0041 with 2 degrees of freedom); Holm over the 3 tests (the two
    against the baseline, p = 0.0027 and 0.074, and this one): max(3 x 0.0027, 2 x 0.0041) =
    0.0082 < 0.05: shown best."""
    three_variants(tmp_path, (-0.10, -0.11, -0.12), (-0.01, -0.03, -0.02))
    rep = build_report(tmp_path)
    b = family.best_design(rep)
    assert (b["leader"], b["runner_up"]) == ("norm=rms", "norm.eps=1e-3,norm=rms")
    t = 0.09 / (0.01 / math.sqrt(3))
    assert b["mean"] == pytest.approx(0.09) and b["p"] == pytest.approx(2 * (1 - t2_cdf(t)))
    others = [c["holm"]["p_diff"] for c in rep.comparisons]
    assert b["p_holm"] == pytest.approx(stats.holm([*others, b["p"]])[-1])
    assert b["shown"]
    md = render_markdown(rep)
    assert "**Best design: `norm=rms`**, ahead of the runner-up (`norm.eps=1e-3,norm=rms` − " in md


def test_one_comparison_names_no_best_design(tmp_path):
    rep = build_report(make_sweep(tmp_path))
    assert family.best_design(rep) is None and "shown best" not in render_markdown(rep)


def test_the_context_names_the_schedule_the_runs_trained_with(tmp_path):
    cosine = build_report(make_sweep(tmp_path / "cosine"))
    line = next(ln for ln in render_markdown(cosine).splitlines() if ln.startswith("- Schedule"))
    assert "schedule `cosine`, decay " in line and "wsd" not in line
    wsd = tmp_path / "wsd"
    edits = {
        "optim.schedule": "wsd",
        "optim.decay_fraction": 0.2,
        "optim.decay_shape": "sqrt",
        "optim.anneal_at": [0.25, 0.5],
    }
    for seed in (0, 1):
        write_run(wsd, "layer", seed, 3.0 + seed / 100, edits=edits)
        write_run(wsd, "rms", seed, 3.01 + seed / 100, edits=edits)
    line = next(
        ln for ln in render_markdown(build_report(wsd)).splitlines() if ln.startswith("- Sched")
    )
    assert (
        "schedule `wsd` (decay over the last `0.2` of each budget, shape `sqrt`; cool-down "
        "branches at `[0.25, 0.5]` of the run), decay "
    ) in line
    assert "cosine" not in line
