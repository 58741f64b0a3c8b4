"""scripts/gpu_check.sh: the CPU dry run of the one-shot GPU check (the same steps at tiny sizes),
its report from each step's output on canned outputs, failed / timed-out / stopped / skipped steps,
the packing into what a short rental hands back, and the ``normlab-bench peak`` mode it calls."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from normlab.commands import bench, gpu_check, gpu_report
from normlab.config.norm_table import KINDS
from normlab.norms import available_impls
from normlab.training import peak

ROOT = Path(__file__).resolve().parents[2]
STEPS = list(gpu_report.STEPS)


def _archive(out: Path) -> dict[str, bytes]:
    with tarfile.open(out / "logs.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def check_dry_run(out: Path, monkeypatch) -> None:
    """What ``scripts/gpu_check.sh --dry-run --out out`` must have written: the three packed files
    alone, every step ok with its log, output and figures (``tests/cli/test_gpu_kit.py`` runs the
    dry run once, through the kit, and checks it with this)."""
    assert sorted(f.name for f in out.rglob("*")) == sorted(gpu_report.PACKED)
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] and report["device"] == "cpu" and "rental" not in report
    assert [s["name"] for s in report["steps"]] == STEPS
    members = _archive(out)
    for s in report["steps"]:
        assert s["status"] == "ok" and s["seconds"] > 0, s
        assert members[s["log"]] and gpu_report.WRITES[s["name"]] in members
    assert not any("checkpoint" in m for m in members)
    fig = {s["name"]: s["figures"] for s in report["steps"]}
    assert fig["versions"]["torch"] == torch.__version__ and "/tmp" in fig["versions"]["normlab"]
    o = fig["contract"]
    assert o["passed"] == o["cases"] > 0 and o["failed"] == [] and o["twice"] == []
    assert o["passed_by_impl"]["triton"] > 0  # interpreted here, with xdist as on the device
    cases = [json.loads(x)["case"] for x in members["contract.jsonl"].decode().splitlines()]
    assert len(cases) == len(set(cases)) == o["cases"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the bench step runs without it
    impls = {"torch", "cpp", "compiled"}
    kinds = [k for k in KINDS if k.name in ("layer", "rms", "dyt")]
    per_dtype = sum(len(impls & set(available_impls("cpu", k))) for k in kinds)
    rows = fig["bench"]["rows"]
    assert len(rows) == per_dtype * 2 and fig["bench"]["complete"]  # x dtypes, one shape
    assert all(r[k] > 0 for r in rows for k in ("fwd_ms", "fwdbwd_ms", "fwdbwd_copy_frac"))
    p = fig["peak"]
    assert p["fp32_tflops"] > 0 and p["bf16_tflops"] > 0
    for name, impl in (("train_fused", "cpp"), ("train_compiled", "compiled")):
        t = fig[name]
        assert t["status"] == "completed" and t["tokens_per_s"] > 0 and t["norm_impl"] == impl
        assert t["mfu_measured"] == pytest.approx(t["achieved_tflops"] / p["bf16_tflops"])
        assert t["mfu_datasheet"] is None and t["kernels"]  # a CPU has no datasheet peak here
    assert fig["step"]["a"] == "rms/compiled" and fig["step"]["b"] == "rms/cpp"
    assert fig["step"]["a_ms"] > 0 and fig["step"]["b_over_a"] > 0
    md = (out / "gpu_check.md").read_text()
    assert "dry run on CPU" in md and "all steps ok" in md and "Kernels: " in md
    assert all(f"| {name} | ok |" in md for name in STEPS)


def dump_env(path: Path) -> list[str]:
    """A command that writes its environment as JSON to ``path``."""
    code = f"import os, json; json.dump(dict(os.environ), open({str(path)!r}, 'w'))"
    return [sys.executable, "-c", code]


def canned() -> list[dict]:
    """Raw output of every step as the commands write it (only the keys the check reads)."""
    widths = "test_matches_the_float64_oracle_at_model_widths"
    contract = [
        {"case": f"{widths}[rms-triton-fp32-8192x768]", "outcome": "passed", "seconds": 2.0},
        {"case": f"{widths}[rms-compiled-bf16-8192x768]", "outcome": "passed", "seconds": 0.5},
        {"case": f"{widths}[rms-triton-bf16-4096x4097]", "outcome": "failed", "seconds": 0.4},
    ]
    contract[2]["error"] = "AssertionError: grad input: normwise relative error 0.5 > 2e-02"
    row = {"kind": "rms", "impl": "triton", "dtype": "bf16", "shape": [65536, 768]}
    row |= {"fwd_ms": 0.07, "fwdbwd_ms": 0.2, "fwd_copy_frac": 0.9, "fwdbwd_copy_frac": 0.8}
    bench_raw = {"rows": [row], "copy": [{"dtype": "bf16", "shape": [65536, 768], "gbps": 4000.0}]}
    bench_raw["complete"] = False
    peak_raw = {"fp32": {"tflops": 50.0}, "bf16": {"tflops": 600.0}}
    train = {"status": "completed", "steps_completed": 200, "norm_impl": "triton"}
    train |= {"precision": "bf16", "config": {"compile": True, "peak_tflops": 312.0}}
    train |= {"tokens_per_s": 4e5, "step_time_ms_median": 41.0, "final_val_loss": 1.6}
    train["kernels"] = {"final": {"impl_class": "normlab.norms.triton_impl.TritonRMSNorm"}}
    train["kernels"]["final"]["backend"] = "triton"
    train["mfu"] = 0.5  # against 312: 156 TFLOP/s achieved -> 156 / 600 = 0.26 of the measured
    ratio = {"median": 0.95, "p25": 0.94, "p75": 0.97}
    step = {"a": {"norm": "rms/compiled", "median_ms": 50.0}, "b": {"norm": "rms/triton"}}
    step["b"]["median_ms"], step["ratio"], step["pairs"] = 47.5, ratio, 5
    versions = {"device_name": "NVIDIA H200", "torch": "2.11.0", "python": "3.12.3"}
    raws = [versions, contract, bench_raw, peak_raw, train, dict(train), step]
    return [
        {"name": n, "status": "ok", "seconds": 1.0, "command": n, "raw": r}
        for n, r in zip(STEPS, raws, strict=True)
    ]


def test_summarize_gives_mfu_against_the_datasheet_and_the_measured_peak_and_fails_bad_cases():
    raw = canned()
    raw[4]["graph_breaks"] = {"count": 2, "where": ["/m/model.py:68"]}
    steps = {s["name"]: s for s in gpu_report.summarize(raw)}
    assert all("raw" not in s for s in steps.values())
    t = steps["train_fused"]["figures"]
    assert t["achieved_tflops"] == pytest.approx(156.0) and t["datasheet_tflops"] == 989.0
    assert t["mfu_datasheet"] == pytest.approx(156 / 989)
    assert t["mfu_measured"] == pytest.approx(156 / 600)
    assert t["kernels"] == {"final": "TritonRMSNorm (triton)"}
    o = steps["contract"]
    failed = "test_matches_the_float64_oracle_at_model_widths[rms-triton-bf16-4096x4097]"
    assert o["status"] == "failed" and o["figures"]["failed"] == [failed]
    assert o["figures"]["passed_by_impl"] == {"triton": 1, "compiled": 1}
    assert o["figures"]["slowest"]["seconds"] == 2.0
    assert steps["bench"]["figures"]["copy_gbps"] == {"bf16 65536x768": 4000.0}
    assert steps["step"]["figures"]["b_over_a"] == 0.95
    report = {"dry_run": False, "device": "cuda", "started": "now", "seconds": 300.0}
    md = gpu_report.render(report | {"steps": list(steps.values())})
    assert "SOME STEPS FAILED" in md and "| contract | failed (1 case(s) failed) |" in md
    assert "Code: commit unknown, kit sources -; normlab from ?" in md
    assert "(200 steps, bf16, compile on, norm triton, completed)" in md
    assert "B/A 0.950 (IQR 0.940-0.970; below 1: B is faster)" in md
    assert "(median per optimizer step, 5 pairs): A rms/compiled 50.0 ms" in md
    assert "Device: NVIDIA H200 (cuda); python 3.12.3, torch 2.11.0" in md
    assert "normwise relative error 0.5" in md and "stopped before its last group" in md
    assert "Graph breaks: 2\n- /m/model.py:68" in md
    assert "MFU 15.8% of the datasheet's dense bf16 989 TFLOP/s, 26.0% of the measured 600" in md
    assert "Kernels: final TritonRMSNorm (triton)" in md
    assert "400,000 tokens/s" in md and "B/A 0.950" in md and "bf16 600.00 TFLOP/s" in md


def test_a_failed_training_run_without_mfu_keeps_its_status_and_figures():
    steps = canned()
    steps[4]["raw"] |= {"status": "failed", "mfu": None, "tokens_per_s": None}
    t = {s["name"]: s for s in gpu_report.summarize(steps)}["train_fused"]
    assert t["status"] == "ok" and t["figures"]["status"] == "failed"  # the step's own status
    assert t["figures"]["achieved_tflops"] is None and t["figures"]["mfu_datasheet"] is None


def test_a_case_reported_twice_fails_the_contract():
    steps = canned()
    first = steps[1]["raw"][0]
    steps[1]["raw"] = [first, first]
    o = {s["name"]: s for s in gpu_report.summarize(steps)}["contract"]
    assert o["status"] == "failed" and "1 case(s) reported twice" in o["error"]
    assert o["figures"]["twice"] == [first["case"]]


def test_a_missing_key_or_missing_peak_is_reported_not_raised():
    steps = canned()
    del steps[4]["raw"]["steps_completed"]
    steps[3]["raw"] = None  # the peak step wrote nothing
    steps[3]["status"] = "failed"
    done = {s["name"]: s for s in gpu_report.summarize(steps)}
    assert done["train_fused"]["status"] == "failed"
    assert "unexpected output: KeyError" in done["train_fused"]["error"]
    steps = canned()
    steps[3]["raw"] = None
    t = {s["name"]: s for s in gpu_report.summarize(steps)}["train_fused"]
    assert t["status"] == "ok" and t["figures"]["mfu_measured"] is None


def test_a_failed_or_timed_out_step_is_recorded_with_its_own_error(tmp_path):
    (tmp_path / "logs").mkdir()
    py = [sys.executable, "-c"]
    env = gpu_check.step_env("bench", gpu_check.DRY, tmp_path, dry=True)
    code = "print('x'); raise ValueError('hidden size 9 is not allowed')"
    failed = gpu_check.run_step("bench", [*py, code], tmp_path, 30, env)
    assert failed["status"] == "failed" and failed["returncode"] == 1 and failed["raw"] is None
    assert failed["error"] == "exit status 1: ValueError: hidden size 9 is not allowed"
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
        "with open(os.environ['NORMLAB_CASES_JSONL'], 'a') as f:\n"
        '    f.write(\'{"case": "c2", "outc\')\n'  # torn by the kill
        "time.sleep(30)\n"
    )
    step = gpu_check.run_step("contract", [sys.executable, "-c", code], tmp_path, 3, env)
    assert step["status"] == "timeout" and [c["case"] for c in step["raw"]] == ["c0", "c1"]
    figures = gpu_report.summarize([step])[0]["figures"]
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


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_contract_counts_each_case_once_with_or_without_workers(tmp_path, workers):
    """The plugin's hook runs in each xdist worker and again in the controller: only the
    controller writes, so ``-n 2`` gives the cases of ``-n 0``, in the check's order."""
    out = tmp_path / "cases.jsonl"
    select = "model_widths and (layer-triton or layer-torch or rms-triton or rms-torch)"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers]
    cmd += ["--dist", "load", "-m", "device", "tests/norms/test_norm_contract.py", "-k", select]
    proc = subprocess.run(
        cmd,
        env={**os.environ, "NORMLAB_CASES_JSONL": str(out), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    cases = [json.loads(x)["case"] for x in out.read_text().splitlines()]
    params = "-".join(["{k}", "{i}", "{d}", "{s}"])
    want = {
        "test_matches_the_float64_oracle_at_model_widths[" + params.format(k=k, i=i, d=d, s=s) + "]"
        for k in ("layer", "rms")
        for i in ("torch", "triton")
        for d in ("torch.float32", "torch.bfloat16")
        for s in ("16x128", "33x129")
    }
    assert len(cases) == len(set(cases)) == 16 and set(cases) == want
    if workers == "0":  # in the check's order: Triton first
        assert all("-triton-" in c for c in cases[:8])


def test_graph_breaks_are_counted_from_the_compiled_runs_log(tmp_path):
    log = tmp_path / "train.log"
    line = "V1202 x.py:1] [0/0] [__graph_breaks] Graph break in user code at /m/model.py:{}\n"
    other = "V1202 x.py:1] [0/0] [__graph_breaks] Graph Break Reason: a call\n"
    log.write_text(line.format(68) + other + line.format(68) + line.format(72) + "step 1\n")
    assert gpu_check.graph_breaks(log) == {
        "count": 3,
        "where": ["/m/model.py:68", "/m/model.py:72"],
    }
    for name in ("train_fused", "train_compiled"):
        env = gpu_check.step_env(name, gpu_check.GPU, tmp_path, dry=False)
        assert env["TORCH_LOGS"] == "graph_breaks"
        assert "TORCH_LOGS" not in gpu_check.step_env(name, gpu_check.DRY, tmp_path, dry=True)


def test_a_failed_commands_own_error_line_is_found_in_its_log(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("Traceback (most recent call last):\n  File x\nRuntimeError: CUDA error\n")
    assert gpu_check.own_error(log) == "RuntimeError: CUDA error"
    log.write_text("normlab-bench: unknown impl fused; allowed: torch\n\n")
    assert gpu_check.own_error(log) == "normlab-bench: unknown impl fused; allowed: torch"
    log.write_text("step 3 loss 2.1\nKilled\n")
    assert gpu_check.own_error(log) == "Killed"


def test_the_dry_run_has_no_wall_clock_failure_short_of_a_hang():
    """A loaded machine is slow, not broken: every dry step may run half an hour, and the GPU's
    overall budget does not apply (a 90 s limit failed the dry run under load)."""
    assert all(limit >= 1800 for limit in gpu_check.DRY.limits.values())
    assert set(gpu_check.DRY.limits) == set(STEPS) and gpu_check.DRY.budget_s == float("inf")


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


def test_the_gpu_plan_runs_in_order_of_value_within_the_commands_10_minutes(tmp_path, monkeypatch):
    steps = dict(gpu_check.plan(gpu_check.GPU, tmp_path))
    assert list(steps) == STEPS
    assert sum(gpu_check.GPU.limits[n] for n in STEPS) <= gpu_check.GPU.budget_s + 30
    assert gpu_check.GPU.budget_s <= 540  # + the kit's install and the packing: within 600 s
    for name, impl in (("train_fused", "triton"), ("train_compiled", "compiled")):
        train = steps[name]
        for override in (
            "model=gpt2_small",
            "precision=bf16",
            "compile=true",
            "norm=rms",
            f"norm.impl={impl}",
            "max_steps=200",
            "data.batch_size=16",
            "device=cuda",
            "logger=none",
            "progress=false",
            "peak_tflops=312",
        ):
            assert override in train, (name, override)
        assert train[2] == "normlab.commands.train" and not any(
            a.startswith("data=") for a in train
        )
        assert f"hydra.run.dir={tmp_path / name}" in train  # the scratch folder, never --out
    assert {"--a", "norm.impl=compiled", "--b", "norm.impl=triton"} <= set(steps["step"])
    bench_argv = " ".join(steps["bench"])
    assert "--impls torch,triton,compiled" in bench_argv and "--by-group" in bench_argv
    assert "65536x768" in bench_argv and "8192x4096" in bench_argv
    assert steps["peak"][2:5] == ["normlab.commands.bench", "peak", "--device"]
    assert "--refresh" in steps["peak"]  # a fresh machine: measure, never a stale cache entry
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (tmp_path / "logs").mkdir()
    env = gpu_check.step_env("bench", gpu_check.GPU, tmp_path, dry=False)
    ran = gpu_check.run_step("bench", dump_env(tmp_path / "bench.json"), tmp_path, 30, env)
    assert "TRITON_INTERPRET" not in ran["raw"]  # on the GPU the Triton kernels are compiled
    contract = steps["contract"]
    assert contract[1:3] == ["-m", "pytest"] and "tests/norms/test_norm_contract.py" in contract
    assert contract[contract.index("-n") + 1] == "4" and "-k" not in contract  # every device case


def quick_plan(monkeypatch, **argv_of) -> None:
    """Replace the check's commands: each step writes its output at once, or runs ``argv_of``."""

    def plan(sizes, work):
        def writes(name):
            text = "" if name == "contract" else "{}"
            code = f"import sys; open(sys.argv[1], 'w').write({text!r})"
            return [sys.executable, "-c", code, str(work / gpu_report.WRITES[name])]

        return [(n, argv_of.get(n) or writes(n)) for n in STEPS if not n.startswith("train")] + [
            (n, [sys.executable, "-c", "pass"]) for n in STEPS if n.startswith("train")
        ]

    monkeypatch.setattr(gpu_check, "plan", plan)


def test_a_step_the_budget_left_cannot_finish_is_skipped_with_the_reason(tmp_path, monkeypatch):
    quick_plan(monkeypatch, bench=[sys.executable, "-c", "import time; time.sleep(30)"])
    monkeypatch.setattr(gpu_check, "MIN_S", dict.fromkeys(STEPS, 1))
    sizes = replace(gpu_check.DRY, budget_s=4)
    report = {"dry_run": True, "device": "cpu", "started": "now", "seconds": 0.0, "steps": []}
    (tmp_path / "w" / "logs").mkdir(parents=True)
    (tmp_path / "o").mkdir()
    t0 = time.monotonic()
    gpu_check.run_all(sizes, tmp_path / "w", tmp_path / "o", report, dry=True)
    assert time.monotonic() - t0 < 10
    status = {s["name"]: s["status"] for s in report["steps"]}
    assert status["versions"] == "ok" and status["bench"] == "timeout"  # cut to the budget left
    assert all(status[n] == "skipped" for n in STEPS[3:])
    why = {s["name"]: s.get("error") for s in report["steps"]}["peak"]
    assert why.endswith("s of budget left, under its minimum of 1 s")
    md = (tmp_path / "o" / "gpu_check.md").read_text()
    assert "| peak | skipped (" in md and "SOME STEPS FAILED OR DID NOT RUN" in md


def test_sigterm_ends_the_running_step_and_still_writes_the_report(tmp_path):
    pid_file = tmp_path / "child.pid"
    out = tmp_path / "out"
    sleeper = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    code = (
        "import sys\n"
        "from tests.cli.test_gpu_check import quick_plan\n"
        "from normlab.commands import gpu_check\n"
        "class M:\n"
        "    def setattr(self, obj, name, value):\n"
        "        setattr(obj, name, value)\n"
        f"quick_plan(M(), contract=[sys.executable, '-c', {sleeper!r}])\n"
        f"sys.exit(gpu_check.main(['--dry-run', '--out', {str(out)!r}]))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 1 and time.monotonic() - t0 < 10
    with pytest.raises(ProcessLookupError):  # the running step was killed with the check
        os.kill(int(pid_file.read_text()), 0)
    report = json.loads((out / "gpu_check.json").read_text())
    status = {s["name"]: s["status"] for s in report["steps"]}
    assert status["versions"] == "ok" and status["contract"] == "stopped"
    assert all(status[n] == "skipped" for n in STEPS[2:])
    assert "stopped by SIGTERM" in (out / "gpu_check.md").read_text()


def test_the_rental_limits_name_every_file_that_would_not_come_back(tmp_path):
    out = tmp_path / "out"
    (out / "a" / "b").mkdir(parents=True)
    (out / "a" / "b" / "deep.txt").write_text("x")
    for i in range(8):
        (out / f"f{i}.txt").write_text("x")
    with open(out / "big.bin", "wb") as f:
        f.truncate(gpu_report.MAX_FILE_BYTES + 1)
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "peak.log").write_text("x")
    (work / "train_fused" / "checkpoints").mkdir(parents=True)
    (work / "train_fused" / "checkpoints" / "step_8.pt").write_bytes(b"0" * 10)
    (work / "train_fused" / "summary.json").write_text("{}")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        tar.add(work / "logs" / "peak.log", "logs/peak.log")
    steps = [{"name": "peak", "status": "ok"}, {"name": "bench", "status": "timeout"}]
    problems = gpu_report.rental_problems(out, {"steps": steps})
    assert problems == [
        "11 files in " + str(out) + ", over 8",
        "a/b/deep.txt is 3 levels deep, over 2",
        f"big.bin is {gpu_report.MAX_FILE_BYTES + 1} bytes, over {gpu_report.MAX_FILE_BYTES}",
        "step peak is ok but peak.json is not in logs.tar.gz",
    ]
    packed = tmp_path / "packed"
    packed.mkdir()
    report = {"dry_run": True, "device": "cpu", "started": "now", "seconds": 1.0, "steps": []}
    gpu_report.pack(packed, work, report)
    assert sorted(f.name for f in packed.iterdir()) == sorted(gpu_report.PACKED)
    assert set(_archive(packed)) == {"logs/peak.log", "train_fused/summary.json"}  # no checkpoint
    assert gpu_report.rental_problems(packed, report) == []


def test_a_bench_stopped_midway_keeps_the_groups_it_finished(tmp_path, monkeypatch):
    calls = []

    def fake(kinds, impls, dtypes, shapes, **_):
        calls.append((dtypes, shapes))
        if len(calls) == 3:
            raise KeyboardInterrupt  # the step's limit, as far as the JSON is concerned
        row = {"kind": "rms", "impl": "torch", "dtype": dtypes[0], "shape": list(shapes[0])}
        row |= {"fwdbwd_ms": 1.0, "fwd_ms": 0.5}
        return {"rows": [row], "copy": [], "skipped": [], "summary": []}

    monkeypatch.setattr(bench, "bench_norms", fake)
    out = tmp_path / "bench.json"
    argv = ["--device", "cpu", "--kinds", "rms", "--impls", "torch", "--dtypes", "bf16,fp32"]
    argv += ["--shapes", "64x128,32x256", "--by-group", "--json", str(out)]
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv)
    got = json.loads(out.read_text())
    assert not got["complete"] and [(r["dtype"], r["shape"]) for r in got["rows"]] == [
        ("bf16", [64, 128]),
        ("fp32", [64, 128]),
    ]


def test_an_out_folder_holding_an_earlier_report_is_refused_and_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere.md").write_text("mine\n")
    (out / "gpu_check.md").symlink_to(tmp_path / "elsewhere.md")  # a link counts as held
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "already holds gpu_check.md of an earlier check; allowed: a new or empty folder" in line
    assert [f.name for f in out.iterdir()] == ["gpu_check.md"]
    assert (tmp_path / "elsewhere.md").read_text() == "mine\n"


def test_the_packed_files_replace_a_link_and_never_write_through_it(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "versions.log").write_text("ok\n")
    (tmp_path / "target.json").write_text("keep\n")
    (work / "logs" / "link.log").symlink_to(tmp_path / "target.json")  # not archived either
    (out / "gpu_check.json").symlink_to(tmp_path / "target.json")
    report = {"dry_run": True, "device": "cpu", "started": "now", "seconds": 1.0, "steps": []}
    gpu_report.pack(out, work, report)
    assert (tmp_path / "target.json").read_text() == "keep\n"
    assert not (out / "gpu_check.json").is_symlink()
    assert set(_archive(out)) == {"logs/versions.log"}


def test_a_sigterm_between_steps_runs_no_further_step_and_raises_nothing(tmp_path, monkeypatch):
    quick_plan(monkeypatch)
    term = gpu_check.Terminate()
    term(signal.SIGTERM, None)  # not waiting on a step: recorded, never raised
    report = {"dry_run": True, "device": "cpu", "started": "now", "seconds": 0.0, "steps": []}
    (tmp_path / "w" / "logs").mkdir(parents=True)
    (tmp_path / "o").mkdir()
    gpu_check.run_all(gpu_check.DRY, tmp_path / "w", tmp_path / "o", report, True, term)
    assert [s["status"] for s in report["steps"]] == ["skipped"] * len(STEPS)
    assert {s["error"] for s in report["steps"]} == {"not run: SIGTERM ended the check"}
    assert (tmp_path / "o" / "gpu_check.md").is_file()


def test_the_deadline_of_the_device_command_shortens_the_budget(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("NORMLAB_CHECK_DEADLINE", str(time.time() + 100))
    assert 95 < gpu_check.budget(gpu_check.GPU) <= 100
    monkeypatch.setenv("NORMLAB_CHECK_DEADLINE", str(time.time() + 10_000))
    assert gpu_check.budget(gpu_check.GPU) == gpu_check.GPU.budget_s
    monkeypatch.setenv("NORMLAB_CHECK_DEADLINE", "soon")
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path / "o")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "NORMLAB_CHECK_DEADLINE='soon' is not a Unix time" in line
    assert not (tmp_path / "o").exists()
