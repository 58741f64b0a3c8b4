"""The compute-equivalent verdict (normlab.report.stats) on synthetic curves of known shift, and
the conversion of margins between nats and compute with the end slope, and the planner (seeds
and hours from a pilot; a pilot too short to time says why and what max_steps would time it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from normlab.commands.report import main
from normlab.report import build_report, report_tables
from normlab.report.plan import steps_to_time
from normlab.report.series import series
from normlab.report.stats import (
    compute_for_nats,
    compute_multiplier,
    end_slope,
    nats_for_compute,
    ratio_interval,
    seeds_needed,
    std_upper,
    step_multiplier,
    steps_to_reach,
)

from .test_report import write_run

STEPS = np.arange(0, 601, 10, dtype=float)


def curve(steps, shift=1.0, noise=0.0, rng=None):
    """A power-law learning curve L(s) = 1.6 + 4 (1 + s/shift/40)^-0.5, stretched in steps by
    ``shift`` (a variant that needs ``shift`` times the steps), plus evaluation noise."""
    loss = 1.6 + 4.0 * (1 + steps / shift / 40.0) ** -0.5
    if noise:
        loss = loss + rng.normal(0, noise, size=loss.shape)
    return list(steps), list(loss)


def test_steps_to_reach_interpolates_between_evaluations():
    assert steps_to_reach([0, 10, 20], [3.0, 2.0, 1.0], 1.5) == pytest.approx(15.0)
    assert math.isnan(steps_to_reach([0, 10, 20], [3.0, 2.0, 1.0], 0.5))
    # a noisy uptick after the crossing does not move it: the curve is its running minimum
    assert steps_to_reach([0, 10, 20, 30], [3.0, 1.0, 2.5, 0.9], 1.5) == pytest.approx(7.5)


def test_a_variant_delayed_by_5pc_and_2pc_faster_per_step_is_recovered_within_its_ci():
    rng = np.random.default_rng(0)
    mults = []
    for _ in range(6):
        base = curve(STEPS, 1.0, 0.002, rng)
        var = curve(STEPS, 1.05, 0.002, rng)
        mults.append(step_multiplier(base, var))
    r = compute_multiplier(mults, speed=1.02)
    truth = 1.02 / 1.05
    assert r["ci"][0] < truth < r["ci"][1]
    assert r["k"] == pytest.approx(truth, rel=0.01)
    assert r["ci"][1] < 1.0  # the 3% loss of effective compute is detected at this noise


def test_identical_variants_give_a_ci_containing_one():
    rng = np.random.default_rng(1)
    mults = [
        step_multiplier(curve(STEPS, 1, 0.003, rng), curve(STEPS, 1, 0.003, rng)) for _ in range(5)
    ]
    r = compute_multiplier(mults, speed=[1.0] * 5)
    assert r["ci"][0] < 1.0 < r["ci"][1]


def test_a_better_variant_gets_a_multiplier_above_one_without_extrapolating():
    m = step_multiplier(curve(STEPS, 1.0), curve(STEPS, 0.9))
    assert m == pytest.approx(1 / 0.9, rel=2e-3)


def test_a_speed_interval_widens_the_compute_interval():
    mults = [0.99, 1.0, 1.01, 1.0]
    narrow = compute_multiplier(mults, speed=1.02)
    wide = compute_multiplier(mults, speed=1.02, speed_se=(0.02, 29))
    assert wide["ci"][0] < narrow["ci"][0] and wide["ci"][1] > narrow["ci"][1]
    assert wide["k"] == pytest.approx(narrow["k"])


def test_margins_convert_between_nats_and_compute_with_the_end_slope():
    steps, loss = curve(STEPS)
    slope = end_slope(steps, loss)
    # L = 1.6 + 4 (1 + s/40)^-0.5 has -dL/dln s = 2 (s/40)(1 + s/40)^-1.5 ~ 0.48 at s ~ 575
    s = 575.0
    assert slope == pytest.approx(2 * (s / 40) * (1 + s / 40) ** -1.5, rel=0.05)
    assert nats_for_compute(0.01, slope) == pytest.approx(slope * math.log(1.01))
    assert compute_for_nats(nats_for_compute(0.03, slope), slope) == pytest.approx(0.03)


# --- the verdict in a report built from run dirs -------------------------------------------------


def curve_run(root, norm, seed, shift, noise, rng, step_ms=100.0, **summary):
    """A run dir (:func:`write_run`) whose validation curve is :func:`curve` at STEPS (stretched
    by ``shift``, plus ``noise``), with ``summary`` fields set on top."""
    d = write_run(root, norm, seed, 0.0, step_ms=step_ms)
    steps, loss = curve(STEPS, shift, noise, rng)
    rows = [
        {"step": int(s), "val/loss": v, "train/loss": v} for s, v in zip(steps, loss, strict=True)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = json.loads((d / "summary.json").read_text())
    s |= {"final_val_loss": loss[-1], "steps_done": int(STEPS[-1]), **summary}
    (d / "summary.json").write_text(json.dumps(s))
    return d


def bench_json(per_pair: list[float]) -> str:
    """A ``normlab-bench step`` result: A = norm=layer, B = norm=rms, B/A step time per pair."""
    side = {"median_ms": 100.0, "times_ms": [100.0], "norm": "x", "model": "tiny"}
    return json.dumps(
        {
            "mode": "step",
            "device": "cpu",
            "threads": 1,
            "pairs": len(per_pair),
            "warmup": 3,
            "common": [],
            "a": {**side, "overrides": ["norm=layer"]},
            "b": {**side, "overrides": ["norm=rms"]},
            "ratio": {"median": float(np.median(per_pair)), "per_pair": per_pair},
        }
    )


def delayed_sweep(root, seeds=4, noise=0.002):
    """rms = layer delayed by 5% of steps, paired seeds, evaluation noise ``noise``."""
    rng = np.random.default_rng(7)
    for seed in range(seeds):
        curve_run(root, "layer", seed, 1.0, noise, rng)
        curve_run(root, "rms", seed, 1.05, noise, rng)
    return root


def test_the_report_recovers_a_delayed_variant_2pc_faster_in_the_interleaved_bench(
    tmp_path, capsys
):
    delayed_sweep(tmp_path)
    per = [1 / 1.02 * x for x in (0.99, 1.01, 1.0, 0.995, 1.005, 1.0)]
    (tmp_path / "step_bench.json").write_text(bench_json(per))
    rep = build_report(tmp_path)
    k = rep.comparisons[0]["compute"]
    truth = 1.02 / 1.05
    assert k["source"] == "interleaved" and k["n"] == 4
    assert k["ci"][0] < truth < k["ci"][1] and k["k"] == pytest.approx(truth, rel=0.01)
    assert k["speed"] == pytest.approx(1 / ratio_interval(per)["gmean"])
    head, rows = report_tables(rep)["compute_equivalent"]
    assert dict(zip(head, rows[0], strict=True))["k"] == k["k"]
    assert main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    head = f"norm=rms: {k['k']:.3f}x the effective compute of norm=layer [{k['ci'][0]:.3f}, "
    at = next(i for i, line in enumerate(printed) if line.startswith(f"  {head}"))
    assert printed[at + 1].startswith("  norm=rms vs norm=layer: n=4, ")  # its parts after it
    assert f"(n = 4; steps x speed: {k['step_mult']:.3f} x {k['speed']:.3f})" in printed[at]
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.index("## Compute-equivalent verdict") < md.index("## Context")
    assert md.index("## Compute-equivalent verdict") < md.index("## Verdict")
    assert f"**{head}" in md and "speed from the interleaved step benchmark" in md


def test_without_a_bench_the_speed_part_is_the_per_seed_sequential_ratio(tmp_path):
    rng = np.random.default_rng(3)
    ms = {0: 100.0, 1: 104.0, 2: 98.0}
    for seed in ms:
        curve_run(tmp_path, "layer", seed, 1.0, 0.002, rng)
        curve_run(tmp_path, "rms", seed, 0.97, 0.002, rng, step_ms=ms[seed])
    rep = build_report(tmp_path)
    k = rep.comparisons[0]["compute"]
    assert k["source"] == "sequential" and k["comparable"]
    runs = {(r.label, r.seed): r for r in rep.runs}
    by_hand = []
    for seed in ms:
        b, v = (runs[(lab, seed)] for lab in ("norm=layer", "norm=rms"))
        curves = [[list(x) for x in series(r.metrics, "val/loss")] for r in (b, v)]
        by_hand.append(step_multiplier(*curves) * 100.0 / ms[seed])
    assert k["k"] == pytest.approx(math.exp(np.mean(np.log(by_hand))))
    assert k["step_mult"] > 1  # the variant's curve is ahead: no extrapolation, m = S / steps_var


def test_sequential_times_that_fail_the_checks_flag_the_headline(tmp_path):
    rng = np.random.default_rng(4)
    for seed, ms in ((0, 100.0), (1, 200.0)):  # per-seed ratios span 2x > 1.5x
        curve_run(tmp_path, "layer", seed, 1.0, 0.002, rng)
        curve_run(tmp_path, "rms", seed, 1.0, 0.002, rng, step_ms=ms)
    rep = build_report(tmp_path)
    assert not rep.comparisons[0]["compute"]["comparable"]
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    section = md.split("## Compute-equivalent verdict")[1].split("## Context")[0]
    assert "sequential step times, **NOT COMPARABLE**" in section


# --- margins in compute --------------------------------------------------------------------------


def test_margin_compute_converts_with_the_baselines_end_slope_and_runs_the_tost_there(
    tmp_path, capsys
):
    delayed_sweep(tmp_path, seeds=3)
    rep = build_report(tmp_path, margin_compute=0.01)
    runs = [r for r in rep.runs if r.label == "norm=layer"]
    curves = [series(r.metrics, "val/loss") for r in runs]
    mean = np.mean([c[1] for c in curves], axis=0)
    slope = end_slope(list(curves[0][0]), list(mean))
    assert rep.slope == pytest.approx(slope)
    assert rep.margin == pytest.approx(slope * math.log(1.01))
    assert rep.comparisons[0]["verdict"].endswith(f"{rep.margin:.4g} nats")
    assert main([str(tmp_path), "--margin-compute", "0.01"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"- Equivalence margin: ±{rep.margin:.4g} nats/token; alpha = 0.05\n" in md
    assert f"±0.01 of effective compute (`--margin-compute`), converted to ±{rep.margin:.4g}" in md
    assert "gross-difference screen" not in md.split("## Compute-equivalent")[0]
    assert (
        f"margin: 0.01 of effective compute = {rep.margin:.4g} nats/token"
        in capsys.readouterr().out
    )
    # the default stays the 0.02 screen, with what it is worth in compute
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    worth = math.expm1(0.02 / slope)
    assert f"±0.02 nats/token is worth {worth:.2%} of effective compute" in md
    assert "gross-difference screen" in md


def test_margin_compute_refusals(tmp_path, capsys):
    rng = np.random.default_rng(5)
    for seed in (0, 1):  # a flat baseline curve: no end slope to convert with
        curve_run(tmp_path, "rms", seed, 1.0, 0.0, rng)
        d = curve_run(tmp_path, "layer", seed, 1.0, 0.0, rng)
        rows = [{"step": int(s), "val/loss": 3.0} for s in STEPS]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--margin", "0.01", "--margin-compute", "0.01"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--margin-compute", "-0.01"])
    assert e.value.code == 2 and "--margin-compute -0.01: need a finite number > 0" in (
        capsys.readouterr().err
    )
    assert main([str(tmp_path), "--margin-compute", "0.01"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot convert to nats" in err[0]
    assert not (tmp_path / "report").exists()


# --- the planner ---------------------------------------------------------------------------------


def test_plan_prints_seeds_and_hours_from_a_pilot_and_writes_nothing(tmp_path, capsys):
    rng = np.random.default_rng(6)
    for seed in range(3):
        t = {"train_time_s": 70.0, "wall_time_s": 100.0}
        curve_run(tmp_path, "layer", seed, 1.0, 0.003, rng, step_ms=100.0, **t)
        curve_run(tmp_path, "rms", seed, 1.0, 0.003, rng, step_ms=120.0, **t)
    assert main([str(tmp_path), "--plan", "0.01"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "report").exists()
    rep = build_report(tmp_path, margin=0.01)
    c = rep.comparisons[0]
    need, upper = seeds_needed(c["std"], 0.01), seeds_needed(std_upper(c["std"], 3), 0.01)
    # one run: 600 steps x the median of the runs' median step times (110 ms) + 30 s outside
    run_s = 600 * 0.110 + 30.0
    assert f"= {run_s:.1f} s" in out
    assert f": {need} seeds, {need * 2 * run_s / 3600:.2f} h;" in out
    assert f": {upper} seeds, {upper * 2 * run_s / 3600:.2f} h" in out
    assert upper > need


def test_plan_on_a_pilot_too_short_to_time_says_why_and_the_max_steps_that_times_it(
    tmp_path, capsys
):
    rng = np.random.default_rng(6)
    for seed in range(3):
        for norm in ("layer", "rms"):  # 4 steps, all inside the 5-step timing warm-up
            d = curve_run(tmp_path, norm, seed, 1.0, 0.003, rng, steps_done=4)
            s = json.loads((d / "summary.json").read_text())
            s |= {"step_time_ms_median": None, "step_times_ms": [], "max_steps": 4}
            s["config"] |= {"max_steps": 4, "timing_warmup_steps": 5}
            (d / "summary.json").write_text(json.dumps(s))
    assert main([str(tmp_path), "--plan", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "n/a" not in out
    assert (
        "one run here: not timed: the pilot is too short to time: its runs did 4 steps and the "
        "first 5 (the timing warm-up, `timing_warmup_steps`) are not timed, so no run has a step "
        "time and no hours follow; rerun it with max_steps=9 (so that 4 steps are timed after "
        "the warm-up) to time it\n"
    ) in out
    need = seeds_needed(build_report(tmp_path, margin=0.01).comparisons[0]["std"], 0.01)
    assert f": {need} seeds; at the std's 95% upper bound " in out
    assert out.rstrip().endswith("seeds (hours: not timed)")


def test_plan_on_a_pilot_long_enough_but_without_step_times_says_they_are_not_recorded(
    tmp_path, capsys
):
    rng = np.random.default_rng(6)
    for seed in range(3):
        for norm in ("layer", "rms"):  # 600 steps: well past the warm-up, yet no step time
            d = curve_run(tmp_path, norm, seed, 1.0, 0.003, rng, step_time_ms_median=None)
            s = json.loads((d / "summary.json").read_text())
            s["config"] |= {"timing_warmup_steps": 5}
            (d / "summary.json").write_text(json.dumps(s))
    assert main([str(tmp_path), "--plan", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "one run here: not timed: its runs did 600 steps, enough to time, but record no " in out
    assert "too short" not in out and "max_steps=" not in out and "nan" not in out


def test_the_max_steps_that_times_a_run_counts_its_warm_up_and_its_diagnosed_steps():
    assert steps_to_time(5, None) == 9  # 5 warm-up steps, then 4 timed
    assert steps_to_time(0, None) == 4
    assert steps_to_time(5, 3) == 13  # steps 3, 6, 9, 12 have diagnostics: not timed
    assert steps_to_time(5, 1) is None  # every step has diagnostics: none is ever timed


def test_plan_refusals(tmp_path, capsys):
    delayed_sweep(tmp_path, seeds=2)
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--plan", "0"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--plan", "0.01", "--margin", "0.02"])
    assert e.value.code == 2


def test_identical_variants_render_with_a_zero_std(tmp_path):
    rng = np.random.default_rng(8)
    for seed in (0, 1, 2):
        for norm in ("layer", "rms"):
            curve_run(tmp_path, norm, seed, 1.0, 0.0, rng)
    assert main([str(tmp_path)]) == 0  # was a ZeroDivisionError in the std's upper bound clause
    md = (tmp_path / "report" / "report.md").read_text()
    assert "norm=rms: 1.000x the effective compute of norm=layer [1.000, 1.000] (n = 3" in md
    assert "(0.0000, a zero std)" in md
