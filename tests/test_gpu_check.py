"""scripts/gpu_check.sh: the CPU dry run of the one-shot GPU check (the same steps at tiny sizes),
its aggregation of each step's JSON on canned outputs, failed / timed-out steps, and the
``normlab-bench peak`` mode it calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from normlab.commands import bench, gpu_check, gpu_oracle
from normlab.norms import available_impls
from normlab.norms.table import KINDS
from normlab.training import peak

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["oracle", "bench", "peak", "train", "step_torch", "step_compiled"]


@pytest.mark.slow
def test_dry_run_runs_every_step_and_writes_both_files(tmp_path):
    out = tmp_path / "check"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,  # under a minute on a quiet machine; the shared one can take 2x
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] and report["ok"] and report["device"] == "cpu"
    assert [s["name"] for s in report["steps"]] == STEPS
    for s in report["steps"]:
        assert s["status"] == "ok" and s["seconds"] > 0, s
        assert (out / s["log"]).stat().st_size > 0
    fig = {s["name"]: s["figures"] for s in report["steps"]}
    o = fig["oracle"]
    assert o["passed"] == o["cases"] > 0 and o["failed"] == []
    assert 0 < o["worst_error"]["fp32"] <= 1e-4 and 0 < o["worst_error"]["bf16"] <= 2e-2
    oracle_impls = {c["impl"] for c in json.loads((out / "oracle.json").read_text())["cases"]}
    assert "triton" in oracle_impls  # under the interpreter, as on the GPU it is compiled
    rows = fig["bench"]["rows"]
    per_dtype = sum(len(available_impls("cpu", kind)) for kind in KINDS)  # each kind its own impls
    assert len(rows) == per_dtype * 2  # (kind, impl) x dtypes, one shape
    assert all(r[k] > 0 for r in rows for k in ("fwd_ms", "fwdbwd_ms", "fwdbwd_copy_frac"))
    p, t = fig["peak"], fig["train"]
    assert p["fp32_tflops"] > 0 and p["bf16_tflops"] > 0
    assert t["status"] == "completed" and t["tokens_per_s"] > 0 and t["norm_impl"] == "cpp"
    want = t["mfu_configured"] * t["peak_tflops_configured"] / p["bf16_tflops"]
    assert t["mfu_measured"] == pytest.approx(want) and t["mfu_measured"] > 0
    for name, a in (("step_torch", "rms/torch"), ("step_compiled", "rms/compiled")):
        assert fig[name]["a"] == a and fig[name]["b"] == "rms/cpp"
        assert fig[name]["a_ms"] > 0 and fig[name]["b_over_a"] > 0
    md = (out / "gpu_check.md").read_text()
    assert "dry run on CPU" in md and "all steps ok" in md
    assert all(f"| {name} | ok |" in md for name in STEPS)


def dump_env(path: Path) -> list[str]:
    """A command that writes its environment as JSON to ``path``."""
    code = f"import os, json; json.dump(dict(os.environ), open({str(path)!r}, 'w'))"
    return [sys.executable, "-c", code]


def canned() -> list[dict]:
    """Raw JSON of every step as the commands write it (only the keys the check reads)."""
    case = {"kind": "rms", "impl": "triton", "shape": [8192, 768], "ok": True}
    oracle = {
        "passed": 2,
        "cases": [
            {**case, "dtype": "fp32", "max_error": 3e-7},
            {**case, "dtype": "bf16", "max_error": 4e-3},
            {**case, "dtype": "bf16", "shape": [4096, 4097], "ok": False, "error": "boom"},
        ],
    }
    row = {"kind": "rms", "impl": "triton", "dtype": "bf16", "shape": [8192, 768]}
    row |= {"fwd_ms": 0.02, "fwdbwd_ms": 0.05, "fwd_copy_frac": 0.9, "fwdbwd_copy_frac": 0.8}
    bench_raw = {"rows": [row], "copy": [{"dtype": "bf16", "shape": [8192, 768], "gbps": 4000.0}]}
    peak_raw = {"fp32": {"tflops": 50.0}, "bf16": {"tflops": 600.0}}
    train = {"status": "completed", "steps_completed": 200, "norm_impl": "triton"}
    train |= {"precision": "bf16", "config": {"compile": True, "peak_tflops": 312.0}}
    train |= {"tokens_per_s": 4e5, "step_time_ms_median": 41.0, "final_val_loss": 1.6}
    train["mfu"] = 0.5  # against 312: 156 TFLOP/s achieved -> 156 / 600 = 0.26 of the measured
    ratio = {"median": 0.95, "p25": 0.94, "p75": 0.97}
    step = {"a": {"norm": "rms/torch", "median_ms": 50.0}, "b": {"norm": "rms/triton"}}
    step["b"]["median_ms"], step["ratio"] = 47.5, ratio
    raws = [oracle, bench_raw, peak_raw, train, step, step]
    return [
        {"name": n, "status": "ok", "seconds": 1.0, "command": n, "raw": r}
        for n, r in zip(STEPS, raws, strict=True)
    ]


def test_summarize_recomputes_mfu_against_the_measured_peak_and_fails_bad_oracle_cases():
    steps = {s["name"]: s for s in gpu_check.summarize(canned())}
    assert all("raw" not in s for s in steps.values())
    t = steps["train"]["figures"]
    assert t["mfu_measured"] == pytest.approx(0.5 * 312 / 600)
    assert t["mfu_configured"] == 0.5 and t["tokens_per_s"] == 4e5
    o = steps["oracle"]
    assert o["status"] == "failed" and o["figures"]["failed"] == ["rms/triton/bf16/4096x4097"]
    assert o["figures"]["worst_error"] == {"fp32": 3e-7, "bf16": 4e-3}
    assert steps["bench"]["figures"]["copy_gbps"] == {"bf16 8192x768": 4000.0}
    assert steps["peak"]["figures"] == {"fp32_tflops": 50.0, "bf16_tflops": 600.0}
    assert steps["step_torch"]["figures"]["b_over_a"] == 0.95
    report = {
        "dry_run": False,
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "ok": False,
        "versions": {"torch": "2.x"},
        "started": "now",
        "seconds": 300.0,
        "steps": list(steps.values()),
    }
    md = gpu_check.render(report)
    assert "SOME STEPS FAILED" in md and "| oracle | failed |" in md
    assert "MFU 26.0% of the measured peak (50.00% of the configured 312 TFLOP/s)" in md
    assert "400,000 tokens/s" in md and "B/A 0.950" in md and "bf16 600.00 TFLOP/s" in md


def test_a_missing_key_or_missing_peak_is_reported_not_raised():
    steps = canned()
    del steps[3]["raw"]["tokens_per_s"]
    steps[2]["raw"] = None  # the peak step wrote nothing
    steps[2]["status"] = "failed"
    done = {s["name"]: s for s in gpu_check.summarize(steps)}
    assert done["train"]["status"] == "failed"
    assert "unexpected output: KeyError" in done["train"]["error"]
    steps = canned()
    steps[2]["raw"] = None
    t = {s["name"]: s for s in gpu_check.summarize(steps)}["train"]
    assert t["status"] == "ok" and t["figures"]["mfu_measured"] is None


def test_a_failed_or_timed_out_step_is_recorded(tmp_path):
    (tmp_path / "logs").mkdir()
    py = [sys.executable, "-c"]
    failed = gpu_check.run_step(
        "bench", [*py, "print('x'); raise SystemExit(3)"], tmp_path, 30, True
    )
    assert failed["status"] == "failed" and failed["returncode"] == 3 and failed["raw"] is None
    assert (tmp_path / "logs" / "bench.log").read_text() == "x\n"
    slow = gpu_check.run_step("peak", [*py, "import time; time.sleep(20)"], tmp_path, 1, True)
    assert slow["status"] == "timeout" and 1 <= slow["seconds"] < 10
    silent = gpu_check.run_step("oracle", [*py, "pass"], tmp_path, 30, True)
    assert silent["status"] == "failed" and "was not written" in silent["error"]
    ok = gpu_check.run_step("oracle", dump_env(tmp_path / "oracle.json"), tmp_path, 30, True)
    assert ok["status"] == "ok" and ok["raw"]["TRITON_INTERPRET"] == "1"  # dry run only


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_only_the_dry_run_is_allowed(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err
    assert not (tmp_path / "gpu_check.json").exists()


def test_bench_peak_prints_and_writes_fp32_and_bf16(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(peak, "measure_tflops", lambda d, dtype: {"fp32": 1.5, "bf16": 3.0}[dtype])
    out = tmp_path / "bench_peak.json"
    assert bench.main(["peak", "--device", "cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["fp32"]["tflops"] == 1.5 and result["bf16"]["tflops"] == 3.0
    assert not result["bf16"]["cached"]
    text = capsys.readouterr().out
    assert "fp32: 1.500 TFLOP/s" in text and "bf16: 3.000 TFLOP/s" in text
    assert bench.main(["peak", "--device", "cpu", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["fp32"]["cached"]


def test_the_gpu_plan_is_the_seed_shape_and_fits_in_8_minutes(tmp_path, monkeypatch):
    steps = dict(gpu_check.plan(gpu_check.GPU, tmp_path))
    assert list(steps) == STEPS
    assert sum(gpu_check.GPU.limits[n] for n in STEPS) <= gpu_check.BUDGET_S == 480
    train = steps["train"]
    for override in (
        "model=gpt2_small",
        "precision=bf16",
        "compile=true",
        "norm=rms",
        "max_steps=200",
        "data.batch_size=16",
        "device=cuda",
        "logger=none",
        "progress=false",
        "peak_tflops=312",
    ):
        assert override in train, override
    assert train[2] == "normlab.commands.train" and not any(a.startswith("data=") for a in train)
    assert {"--a", "norm.impl=torch", "--b", "norm.impl=triton"} <= set(steps["step_torch"])
    assert "norm.impl=compiled" in steps["step_compiled"]
    assert steps["peak"][2:5] == ["normlab.commands.bench", "peak", "--device"]
    assert "--refresh" in steps["peak"]  # a fresh machine: measure, never a stale cache entry
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (tmp_path / "logs").mkdir()
    ran = gpu_check.run_step("oracle", dump_env(tmp_path / "oracle.json"), tmp_path, 30, dry=False)
    assert "TRITON_INTERPRET" not in ran["raw"]  # on the GPU the Triton kernels are compiled


def test_the_device_oracle_check_passes_torch_and_catches_a_wrong_kernel(monkeypatch):
    cpu = torch.device("cpu")
    good = gpu_oracle.run_checks(cpu, ["torch"], ["fp32", "bf16"], [(16, 65)])
    assert good["failed"] == 0 and good["passed"] == 6  # 3 kinds with torch (layer, rms, dyt) x 2
    dyt = next(c for c in good["cases"] if c["kind"] == "dyt")
    assert set(dyt["errors"]) == {"output", "dx", "dweight", "dbias", "dalpha"}
    layer = next(c for c in good["cases"] if c["kind"] == "layer")
    assert set(layer["errors"]) == {"output", "dx", "dweight", "dbias"}
    real = gpu_oracle.oracle
    monkeypatch.setattr(gpu_oracle, "oracle", lambda kind: lambda *a: real(kind)(*a) * 1.001)
    bad = gpu_oracle.run_checks(cpu, ["torch"], ["fp32"], [(16, 65)])
    assert bad["passed"] == 0 and bad["failed"] == 3  # 1e-3 off: above fp32's 1e-4
    assert gpu_oracle.normwise_error(torch.tensor([1.0, float("nan")]), torch.ones(2)) == float(
        "inf"
    )
