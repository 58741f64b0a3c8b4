"""training.peak: the measured matmul peak behind ``peak_tflops: auto``, cached per machine."""

from __future__ import annotations

import json

import pytest
import torch

from normlab.training import peak

CPU = torch.device("cpu")


def test_measured_peak_is_2n3_flop_over_the_best_time(monkeypatch, one_thread):
    monkeypatch.setattr(peak, "SIZES", {"cpu": (64,)})
    clock = iter([0.0, 0.5, 1.0, 1.25, 2.0, 3.0])  # call times 0.5 s, 0.25 s, 1.0 s
    monkeypatch.setattr(peak.time, "perf_counter", lambda: next(clock))
    assert peak.measure_tflops(CPU, "fp32", repeats=3) == pytest.approx(2 * 64**3 / 0.25 / 1e12)


def test_a_size_that_would_be_slow_at_the_measured_rate_is_not_timed(monkeypatch, one_thread):
    """fp16 on a CPU without fp16 matmuls ran minutes at n=2048 (a test took 600 s): sizes whose
    call the rate so far predicts above MAX_CALL_S are skipped."""
    monkeypatch.setattr(peak, "SIZES", {"cpu": (64, 4096)})
    clock = iter([0.0, 0.5, 1.0, 1.5])  # n=64: 0.5 s a call -> n=4096 predicted far above 0.5 s
    monkeypatch.setattr(peak.time, "perf_counter", lambda: next(clock))
    sizes = []
    real_randn = torch.randn
    monkeypatch.setattr(
        peak.torch, "randn", lambda n, *a, **k: sizes.append(n) or real_randn(n, *a, **k)
    )
    assert peak.measure_tflops(CPU, "fp32", repeats=2) == pytest.approx(2 * 64**3 / 0.5 / 1e12)
    assert sizes == [64, 64]  # a and b at n=64 only


def test_peak_is_cached_per_device_dtype_and_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(peak, "measure_tflops", lambda d, dt: calls.append(dt) or 1.5)
    first = peak.device_peak_tflops(CPU, "bf16")
    again = peak.device_peak_tflops(CPU, "bf16")
    assert (first["cached"], again["cached"], again["tflops"]) == (False, True, 1.5)
    assert calls == ["bf16"]
    peak.device_peak_tflops(CPU, "fp32")
    peak.device_peak_tflops(CPU, "bf16", refresh=True)
    assert calls == ["bf16", "fp32", "bf16"]
    table = json.loads((tmp_path / "peak.json").read_text())
    assert len(table) == 2 and all(f"threads={torch.get_num_threads()}" in k for k in table)


def test_unknown_peak_dtype_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="'int8' is not allowed: one of fp32, bf16, fp16"):
        peak.measure_tflops(CPU, "int8")


def test_a_real_measurement_is_2n3_over_the_fastest_of_the_timed_matmuls_in_the_asked_dtype(
    monkeypatch, one_thread
):
    """Real matmuls and the real clock, observed: one untimed and ``repeats`` timed ``n x n``
    products in bf16, and the rate is 2 n^3 FLOP over the shortest clock interval around one."""
    monkeypatch.setattr(peak, "SIZES", {"cpu": (128,)})
    calls, stamps = [], []
    real_mm, real_clock = torch.mm, peak.time.perf_counter
    monkeypatch.setattr(
        peak.torch,
        "mm",
        lambda a, b: calls.append((tuple(a.shape), a.dtype, b.dtype)) or real_mm(a, b),
    )
    monkeypatch.setattr(
        peak.time, "perf_counter", lambda: stamps.append(real_clock()) or stamps[-1]
    )
    tflops = peak.measure_tflops(CPU, "bf16", repeats=3)
    assert calls == [((128, 128), torch.bfloat16, torch.bfloat16)] * 4
    intervals = [end - start for start, end in zip(stamps[::2], stamps[1::2], strict=True)]
    assert len(intervals) == 3
    assert tflops == 2 * 128**3 / min(intervals) / 1e12


def test_resolve_peak_measures_in_the_runs_matmul_dtype_or_takes_the_configured_number(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(peak, "measure_tflops", lambda d, dt: {"fp32": 1.5, "bf16": 3.0}[dt])
    assert peak.resolve_peak("auto", CPU, "bf16") == {
        "peak_tflops": 3.0,
        "peak_tflops_source": "measured",
        "peak_dtype": "bf16",
    }
    assert peak.resolve_peak("auto", CPU, "fp32")["peak_tflops"] == 1.5
    assert peak.resolve_peak(312, CPU, "fp32") == {
        "peak_tflops": 312.0,
        "peak_tflops_source": "configured",
        "peak_dtype": "fp32",
    }
    with pytest.raises(ValueError, match="precision 'int4' is not allowed"):
        peak.resolve_peak("auto", CPU, "int4")


def test_peak_tflops_defaults_to_auto_and_refuses_what_is_neither_auto_nor_positive(cfg_tiny):
    from normlab.config import ConfigError, TrainConfig

    assert TrainConfig().peak_tflops == "auto" and cfg_tiny().peak_tflops == "auto"
    assert cfg_tiny("peak_tflops=312").peak_tflops == 312
    for bad in ("fast", 0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="peak_tflops=.* must be auto .* or a number"):
            TrainConfig(peak_tflops=bad)


def test_summary_records_the_measured_peak_and_reports_mfu_against_it(
    cfg_tiny, tmp_path, monkeypatch
):
    from normlab.training.loop import train
    from normlab.training.setup import build_run

    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))  # tokens re-made: tiny corpus
    monkeypatch.setattr(peak, "measure_tflops", lambda d, dt: {"fp32": 0.02, "bf16": 0.05}[dt])
    cfg = cfg_tiny("norm.impl=torch")
    s = train(cfg, tmp_path / "run")
    assert (s["peak_tflops"], s["peak_tflops_source"], s["peak_dtype"]) == (
        0.02,
        "measured",
        "fp32",
    )
    flops_per_token = build_run(cfg).model.flops_per_token()
    want = flops_per_token * s["tokens_per_s"] / 0.02e12  # achieved FLOP/s over the peak
    assert s["mfu"] == pytest.approx(want)
    s = train(cfg_tiny("norm.impl=torch", "peak_tflops=0.5"), tmp_path / "run2")
    assert (s["peak_tflops"], s["peak_tflops_source"]) == (0.5, "configured")
    assert s["mfu"] == pytest.approx(flops_per_token * s["tokens_per_s"] / 0.5e12)
