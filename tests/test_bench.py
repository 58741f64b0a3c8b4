"""``normlab-bench``: structure and arithmetic of the results (never timing inequalities, which a
busy machine can flip), the step benchmark on a tiny config, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from normlab.bench import bench_norms, format_norm_table, main, norm_bytes, summarize

SHAPE = (64, 128)


@pytest.fixture(scope="module")
def result():
    return bench_norms(["layer", "rms"], ["torch", "reference"], ["fp32"], [SHAPE], repeats=2, warmup=1)


def test_bytes_model_by_hand():
    n = 64 * 128 * 4  # x in fp32
    # LayerNorm, fp32 params with bias: forward reads x, weight, bias and writes y
    assert norm_bytes(SHAPE, torch.float32, torch.float32, bias=True) == (2 * n + 2 * 512, 2 * n + 2 * 512 + 3 * n + 2 * 512)
    assert norm_bytes(SHAPE, torch.float32, torch.float32, bias=True) == (66560, 165888)
    # RMSNorm, bf16 input, fp32 weight: each tensor in its own dtype
    assert norm_bytes(SHAPE, torch.bfloat16, torch.float32, bias=False) == (2 * 16384 + 512, 2 * 16384 + 512 + 3 * 16384 + 512)


def test_every_row_is_complete_positive_and_consistent(result):
    assert {(r["kind"], r["impl"]) for r in result["rows"]} == {(k, i) for k in ("layer", "rms") for i in ("torch", "reference")}
    assert result["mode"] == "norm" and result["device"] == "cpu" and result["repeats"] == 2 and not result["skipped"]
    (copy,) = result["copy"]
    assert copy["bytes"] == 2 * 64 * 128 * 4 and copy["ms"] > 0
    assert copy["gbps"] == pytest.approx(copy["bytes"] / copy["ms"] / 1e6)
    for r in result["rows"]:
        assert r["shape"] == list(SHAPE) and r["dtype"] == "fp32" and r["param_dtype"] == "float32"
        want = norm_bytes(SHAPE, torch.float32, torch.float32, bias=r["kind"] == "layer")
        assert (r["fwd_bytes"], r["fwdbwd_bytes"]) == want
        for key in ("fwd", "fwdbwd"):
            ms = r[f"{key}_ms"]
            assert math.isfinite(ms) and ms > 0 and len(r[f"{key}_samples_ms"]) == 2
            assert 0 < r[f"{key}_min_ms"] <= ms
            assert r[f"{key}_gbps"] == pytest.approx(r[f"{key}_bytes"] / (ms / 1e3) / 1e9)
            assert r[f"{key}_copy_frac"] == pytest.approx(r[f"{key}_gbps"] / copy["gbps"])
            assert r["inner"][key] >= 1
    json.dumps(result)  # JSON-ready as is


def test_summary_compares_the_fastest_of_each_kind(result):
    (s,) = result["summary"]
    fastest = {k: min((r for r in result["rows"] if r["kind"] == k), key=lambda r: r["fwdbwd_ms"]) for k in ("rms", "layer")}
    assert (s["rms_impl"], s["layer_impl"]) == (fastest["rms"]["impl"], fastest["layer"]["impl"])
    assert s["rms_faster_pct"] == pytest.approx((s["layer_ms"] / s["rms_ms"] - 1) * 100)
    assert s["time_saved_pct"] == pytest.approx((1 - s["rms_ms"] / s["layer_ms"]) * 100)
    assert summarize([r for r in result["rows"] if r["kind"] == "rms"]) == []  # nothing to compare


def test_table_lists_every_row_and_the_summary_line(result):
    text = format_norm_table(result)
    lines = text.splitlines()
    assert "fwd GB/s" in lines[1] and "f+b %copy" in lines[1]
    assert sum(line.startswith(("layer", "rms", "copy")) for line in lines) == 5
    assert "fp32 64x128: RMSNorm fastest (" in text and "than LayerNorm fastest (" in text


def test_an_implementation_the_device_cannot_run_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = bench_norms(["rms"], ["torch", "triton"], ["fp32"], [(8, 32)], repeats=1, warmup=1)
    assert [r["impl"] for r in res["rows"]] == ["torch"]
    (skip,) = res["skipped"]
    assert skip["impl"] == "triton" and "norm.impl=triton" in skip["reason"]


def test_cli_writes_the_json_to_bench_json_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--shapes", "16x32", "--impls", "torch", "--dtypes", "fp32", "--repeats", "2", "--warmup", "1", "--model", "tiny"]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {tuple(r["shape"]) for r in data["rows"]} == {(16, 32), (16, 128)}  # + d_model of model=tiny
    out = capsys.readouterr().out
    assert "RMSNorm fastest" in out and "wrote bench.json" in out


def test_cli_refuses_an_unknown_impl(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--impls", "cuda_magic"])
    assert e.value.code == 2 and "unknown impl cuda_magic" in capsys.readouterr().err


TINY = ["model=tiny", "model.n_layer=1", "model.context_length=32", "data.batch_size=2", "device=cpu"]


def test_step_benchmark_reports_a_finite_positive_ratio(tmp_path):
    path = tmp_path / "step.json"
    assert main(["step", *TINY, "--a", "norm=layer", "--b", "norm=rms", "--pairs", "2", "--warmup", "1", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["mode"] == "step" and data["pairs"] == 2
    assert (data["a"]["norm"], data["b"]["norm"]) == ("layer/torch", "rms/torch")
    assert data["a"]["overrides"] == ["norm=layer"] and data["b"]["composed_with"] == [*TINY, "norm=rms"]
    assert data["a"]["tokens_per_step"] == 2 * 32
    for key in ("a", "b"):
        assert len(data[key]["times_ms"]) == 2 and all(t > 0 for t in data[key]["times_ms"])
    ratio = data["ratio"]
    assert math.isfinite(ratio["median"]) and ratio["median"] > 0
    assert ratio["p10"] <= ratio["p25"] <= ratio["median"] <= ratio["p75"] <= ratio["p90"]
    assert ratio["per_pair"] == pytest.approx([b / a for a, b in zip(data["a"]["times_ms"], data["b"]["times_ms"], strict=True)])


def test_step_benchmark_stops_on_a_bad_override_with_one_line(tmp_path, capsys):
    assert main(["step", *TINY, "--a", "norm.eps=-1", "--b", "norm=rms", "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normlab-bench: norm.eps=-1") and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()
