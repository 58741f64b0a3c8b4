"""scripts/gpu_check.sh: the CPU dry run of the one-shot GPU check (the same steps at tiny sizes),
its aggregation of each step's JSON on canned outputs, failed / timed-out steps, and the
``normlab-bench peak`` mode it calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from normlab.commands import bench, gpu_check
from normlab.config.norm_table import KINDS
from normlab.norms import available_impls
from normlab.training import peak

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["contract", "bench", "peak", "train", "step_torch", "step_compiled"]


def check_dry_run(out: Path, monkeypatch) -> None:
    """What ``scripts/gpu_check.sh --dry-run --out out`` must have written: every step ok, each with
    its log and figures, ``gpu_check.json`` and ``gpu_check.md`` (``tests/cli/test_gpu_kit.py``
    runs the dry run once, through the kit, and checks it with this)."""
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] and report["ok"] and report["device"] == "cpu"
    assert [s["name"] for s in report["steps"]] == STEPS
    for s in report["steps"]:
        assert s["status"] == "ok" and s["seconds"] > 0, s
        assert (out / s["log"]).stat().st_size > 0
    fig = {s["name"]: s["figures"] for s in report["steps"]}
    o = fig["contract"]
    assert o["passed"] == o["cases"] > 0 and o["failed"] == []
    cases = [json.loads(line)["case"] for line in (out / "contract.jsonl").read_text().splitlines()]
    assert any("model_widths" in c and "triton" in c for c in cases)  # interpreted here
    rows = fig["bench"]["rows"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the bench step runs without it
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
    widths = "test_matches_the_float64_oracle_at_model_widths"
    contract = [
        {"case": f"{widths}[rms-triton-fp32-8192x768]", "outcome": "passed", "seconds": 2.0},
        {"case": f"{widths}[rms-triton-bf16-8192x768]", "outcome": "passed", "seconds": 0.5},
        {"case": f"{widths}[rms-triton-bf16-4096x4097]", "outcome": "failed", "seconds": 0.4},
    ]
    contract[2]["error"] = "AssertionError: grad input: normwise relative error 0.5 > 2e-02"
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
    raws = [contract, bench_raw, peak_raw, train, step, step]
    return [
        {"name": n, "status": "ok", "seconds": 1.0, "command": n, "raw": r}
        for n, r in zip(STEPS, raws, strict=True)
    ]


def test_summarize_recomputes_mfu_against_the_measured_peak_and_fails_bad_contract_cases():
    raw = canned()
    raw[3]["graph_breaks"] = {"count": 2, "where": ["/m/model.py:68"]}
    steps = {s["name"]: s for s in gpu_check.summarize(raw)}
    assert all("raw" not in s for s in steps.values())
    t = steps["train"]["figures"]
    assert t["mfu_measured"] == pytest.approx(0.5 * 312 / 600)
    assert t["mfu_configured"] == 0.5 and t["tokens_per_s"] == 4e5
    o = steps["contract"]
    failed = "test_matches_the_float64_oracle_at_model_widths[rms-triton-bf16-4096x4097]"
    assert o["status"] == "failed" and o["figures"]["failed"] == [failed]
    assert o["figures"]["passed"] == 2 and o["figures"]["slowest"]["seconds"] == 2.0
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
    assert "SOME STEPS FAILED" in md and "| contract | failed |" in md
    assert "normwise relative error 0.5" in md
    assert "Graph breaks in the compiled run: 2\n- /m/model.py:68" in md
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
    env = gpu_check.step_env("bench", gpu_check.DRY, tmp_path, dry=True)
    failed = gpu_check.run_step(
        "bench", [*py, "print('x'); raise SystemExit(3)"], tmp_path, 30, env
    )
    assert failed["status"] == "failed" and failed["returncode"] == 3 and failed["raw"] is None
    assert (tmp_path / "logs" / "bench.log").read_text() == "x\n"
    slow = gpu_check.run_step("peak", [*py, "import time; time.sleep(20)"], tmp_path, 1, env)
    assert slow["status"] == "timeout" and 1 <= slow["seconds"] < 10
    silent = gpu_check.run_step("bench", [*py, "pass"], tmp_path, 30, env)
    assert silent["status"] == "failed" and "was not written" in silent["error"]
    ok = gpu_check.run_step("peak", dump_env(tmp_path / "peak.json"), tmp_path, 30, env)
    assert ok["status"] == "ok" and ok["raw"]["OMP_NUM_THREADS"] == "1"  # dry run only


def test_a_contract_stopped_by_its_limit_keeps_every_case_that_finished(tmp_path):
    """Each case is written as it finishes: a timeout loses only the case that was running."""
    (tmp_path / "logs").mkdir()
    env = gpu_check.step_env("contract", gpu_check.GPU, tmp_path, dry=False)
    assert env["NORMLAB_TEST_DEVICE"] == "cuda"
    code = (
        "import json, os, time\n"
        "for i in range(2):\n"
        "    with open(os.environ['NORMLAB_CASES_JSONL'], 'a') as f:\n"
        "        row = {'case': f'c{i}', 'outcome': 'passed', 'seconds': 0.1}\n"
        "        f.write(json.dumps(row) + '\\n')\n"
        "time.sleep(30)\n"
    )
    argv = [sys.executable, "-c", code]
    step = gpu_check.run_step("contract", argv, tmp_path, 3, env)
    assert step["status"] == "timeout" and [c["case"] for c in step["raw"]] == ["c0", "c1"]
    figures = gpu_check.summarize([step])[0]["figures"]
    assert figures["passed"] == 2 and figures["failed"] == []


def test_the_contract_plugin_writes_one_line_per_case(tmp_path):
    out = tmp_path / "cases.jsonl"
    test = tmp_path / "test_two.py"
    test.write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n")
    plugin = "tests.norms.conftest"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", plugin, "-p", "no:cacheprovider", str(test)],
        env={**os.environ, "NORMLAB_CASES_JSONL": str(out)},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout
    rows = {r["case"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["test_ok"]["outcome"] == "passed" and rows["test_bad"]["outcome"] == "failed"
    assert "assert 1 == 2" in rows["test_bad"]["error"]


def test_graph_breaks_are_counted_from_the_compiled_runs_log(tmp_path):
    log = tmp_path / "train.log"
    line = "V1202 x.py:1] [0/0] [__graph_breaks] Graph break in user code at /m/model.py:{}\n"
    other = "V1202 x.py:1] [0/0] [__graph_breaks] Graph Break Reason: a call\n"
    log.write_text(line.format(68) + other + line.format(68) + line.format(72) + "step 1\n")
    assert gpu_check.graph_breaks(log) == {
        "count": 3,
        "where": ["/m/model.py:68", "/m/model.py:72"],
    }
    assert gpu_check.step_env("train", gpu_check.GPU, tmp_path, dry=False)["TORCH_LOGS"] == (
        "graph_breaks"
    )
    assert "TORCH_LOGS" not in gpu_check.step_env("train", gpu_check.DRY, tmp_path, dry=True)


def test_the_dry_run_has_no_wall_clock_failure_short_of_a_hang():
    """A loaded machine is slow, not broken: every dry step may run half an hour, and the GPU's
    overall budget does not apply (a 90 s limit failed the dry run under load)."""
    assert all(limit >= 1800 for limit in gpu_check.DRY.limits.values())
    assert set(gpu_check.DRY.limits) == set(STEPS)


@pytest.mark.parametrize("suffix", ["cpu", "gpu"])
def test_every_study_file_says_its_device(compose_cfg, suffix):
    files = sorted((ROOT / "conf" / "experiment").glob(f"*_{suffix}.yaml"))
    assert files
    want = {"cpu": "cpu", "gpu": "cuda"}[suffix]
    for f in files:
        assert compose_cfg([f"experiment={f.stem}"]).device == want, f.name


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
    assert sum(gpu_check.GPU.limits[n] for n in STEPS) <= gpu_check.BUDGET_S <= 450  # + the kit
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
    env = gpu_check.step_env("bench", gpu_check.GPU, tmp_path, dry=False)
    ran = gpu_check.run_step("bench", dump_env(tmp_path / "bench.json"), tmp_path, 30, env)
    assert "TRITON_INTERPRET" not in ran["raw"]  # on the GPU the Triton kernels are compiled
    contract = steps["contract"]
    assert contract[1:3] == ["-m", "pytest"] and "tests/norms/test_norm_contract.py" in contract
