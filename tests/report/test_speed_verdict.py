"""The speed verdict of the interleaved step benchmark (normlab.report.speed.bench_ratio): called
faster or slower only when the median ratio, the geometric mean's CI and the sign test agree, and
the machine's load at both ends of the bench in the report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from normlab.commands.report import main
from normlab.report import build_report
from normlab.report.speed import LOAD_SLACK, bench_load, bench_ratio
from normlab.report.stats import ratio_interval, sign_test

from .test_report_verdicts import bench, sweep

ALPHA = 0.05
# 18 pairs 3% faster, 10 pairs 3% slower: the geometric mean's CI holds 1; two outlier pairs
# 10% faster pull it below 1, while the sign test sees 20 of 30 faster (p = 0.099)
BULK = [0.97] * 18 + [1.03] * 10
OUTLIERS = [0.9, 0.9]


def ratio(per_pair: list[float], **extra) -> dict:
    """bench_ratio of norm=rms (B) against norm=layer (A) for a bench of ``per_pair`` B/A."""
    return bench_ratio(
        {**bench(["norm=layer"], ["norm=rms"], per_pair), **extra}, "norm=layer", "norm=rms", ALPHA
    )


def test_two_outlier_pairs_do_not_make_a_variant_faster():
    assert ratio_interval(BULK, ALPHA)["ci"][1] > 1  # without them the CI holds 1
    r = ratio(BULK + OUTLIERS)
    assert r["median"] < 1 and r["ci"][1] < 1  # two of the three agree
    assert (r["below"], r["above"]) == (20, 10) and r["sign_p"] == pytest.approx(0.0987, abs=1e-4)
    assert r["call"] is None
    assert r["verdict"] == (
        "not shown faster or slower: the sign test gives p = 0.0987 >= 0.05 "
        "(20 of 30 untied pairs faster)"
    )


def test_a_clean_bench_is_called_faster_with_its_three_figures():
    per = list(np.exp(np.random.default_rng(0).normal(np.log(0.95), 0.01, 30)))
    r = ratio(per)
    assert r["call"] == "faster" and r["sign_p"] < 1e-8 and r["ci"][1] < 1
    assert r["verdict"].startswith(f"faster: median ratio {r['median']:.3f}, geometric mean ")
    assert "sign test p = " in r["verdict"] and "(30 of 30 untied pairs faster)" in r["verdict"]
    # the variant as A: the same numbers are baseline / variant, so the variant is slower
    flipped = bench_ratio(bench(["norm=rms"], ["norm=layer"], per), "norm=layer", "norm=rms", ALPHA)
    assert flipped["call"] == "slower" and flipped["verdict"].startswith("slower: median ")
    assert ratio([1 / x for x in per])["call"] == "slower"


def test_a_ci_that_holds_one_is_named_with_every_other_reason():
    r = ratio([0.99, 1.01] * 15)
    assert r["call"] is None and r["median"] == pytest.approx(1.0)
    assert r["verdict"].startswith("not shown faster or slower: the median ratio is 1.000; ")
    r = ratio([0.98] * 16 + [1.02] * 14)  # median below 1, CI holds 1, sign test p = 0.86
    assert (
        "CI 0.998 [" in r["verdict"]
        and "] includes 1; the sign test gives p = 0.856" in (r["verdict"])
    )


def test_the_sign_test_leaves_ties_out():
    s = sign_test([0.9, 1.0, 1.0, 1.1, 0.8])
    assert (s["below"], s["above"]) == (2, 1) and s["p"] == pytest.approx(1.0)


def test_load_is_read_from_both_ends_and_old_benches_have_none():
    assert bench_load({"threads": 1}) is None  # written before the keys
    quiet = bench_load({"threads": 2, "loadavg_before": [2.3, 1, 1], "loadavg_after": [2.5, 1, 1]})
    assert quiet["quiet"] and quiet["limit"] == 2 + LOAD_SLACK
    busy = bench_load({"threads": 1, "loadavg_before": [0.2, 1, 1], "loadavg_after": [3.1, 1, 1]})
    assert not busy["quiet"] and (busy["before"], busy["after"]) == (0.2, 3.1)
    assert bench_load({"threads": 1, "loadavg_before": "x", "loadavg_after": [1.0]}) is None


def test_the_report_states_the_verdict_and_warns_of_a_busy_machine(tmp_path):
    sweep(tmp_path)
    data = bench(["norm=layer"], ["norm=rms"], BULK + OUTLIERS)
    data |= {"loadavg_before": [0.3, 0.2, 0.1], "loadavg_after": [4.0, 1.0, 0.5]}
    (tmp_path / "step_bench.json").write_text(json.dumps(data))
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**The machine was not quiet:** 1-minute load average 0.30 before, 4.00 after" in md
    assert "| not shown faster or slower: the sign test gives p = 0.0987" in md
    speed = md.split("## Speed verdict")[1].split("\n## ")[0]  # its method named, not retold
    assert "Method: `docs/reports.md#the-interleaved-step-benchmark`." in speed


def test_an_old_bench_says_load_not_recorded_and_a_clean_one_is_faster(tmp_path):
    sweep(tmp_path)
    per = list(np.exp(np.random.default_rng(1).normal(np.log(0.95), 0.01, 30)))
    (tmp_path / "step_bench.json").write_text(json.dumps(bench(["norm=layer"], ["norm=rms"], per)))
    rep = build_report(tmp_path)
    assert rep.bench["load"] is None and rep.bench["ratios"]["norm=rms"]["call"] == "faster"
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Load not recorded" in md and "| **faster: median ratio 0.9" in md
