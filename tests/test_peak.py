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


def test_real_measurement_is_positive_and_finite(monkeypatch, one_thread):
    monkeypatch.setattr(peak, "SIZES", {"cpu": (128,)})
    tflops = peak.measure_tflops(CPU, "fp32", repeats=2)
    assert 0 < tflops < 100
