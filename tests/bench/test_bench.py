"""``normlab-bench``: structure and arithmetic of the results (never timing inequalities, which a
busy machine can flip), the step benchmark on a tiny config, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

import normlab.bench.norms as bench
from normlab.bench import step as bench_step
from normlab.bench.norms import (
    bench_norms,
    format_norm_table,
    norm_bytes,
    settle,
    summarize,
)
from normlab.commands.bench import main

SHAPE = (64, 128)


@pytest.fixture(scope="module")
def result():
    return bench_norms(
        ["layer", "rms"], ["torch", "reference"], ["fp32"], [SHAPE], repeats=2, warmup=1
    )


def test_bytes_model_by_hand():
    n = 64 * 128 * 4  # x in fp32
    # LayerNorm, fp32 params with bias: forward reads x, weight, bias and writes y
    assert norm_bytes(SHAPE, torch.float32, torch.float32, bias=True) == (
        2 * n + 2 * 512,
        2 * n + 2 * 512 + 3 * n + 2 * 512,
    )
    assert norm_bytes(SHAPE, torch.float32, torch.float32, bias=True) == (66560, 165888)
    # RMSNorm, bf16 input, fp32 weight: each tensor in its own dtype
    assert norm_bytes(SHAPE, torch.bfloat16, torch.float32, bias=False) == (
        2 * 16384 + 512,
        2 * 16384 + 512 + 3 * 16384 + 512,
    )


def test_every_row_is_complete_positive_and_consistent(result):
    assert {(r["kind"], r["impl"]) for r in result["rows"]} == {
        (k, i) for k in ("layer", "rms") for i in ("torch", "reference")
    }
    assert (
        result["mode"] == "norm"
        and result["device"] == "cpu"
        and result["repeats"] == 2
        and not result["skipped"]
    )
    assert (result["cache"], result["settle_calls"], result["flush_mb"]) == (
        "warm",
        4,
        None,
    )  # the default regime
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
            assert r["inner"][key] >= 1 and len(r[f"{key}_untimed_calls"]) == 2
            assert all(
                4 <= n <= 8 for n in r[f"{key}_untimed_calls"]
            )  # >= settle_calls, <= twice that
    json.dumps(result)  # JSON-ready as is


def test_summary_compares_the_fastest_of_each_kind(result):
    (s,) = result["summary"]
    fastest = {
        k: min((r for r in result["rows"] if r["kind"] == k), key=lambda r: r["fwdbwd_ms"])
        for k in ("rms", "layer")
    }
    assert (s["rms_impl"], s["layer_impl"]) == (fastest["rms"]["impl"], fastest["layer"]["impl"])
    assert s["rms_faster_pct"] == pytest.approx((s["layer_ms"] / s["rms_ms"] - 1) * 100)
    assert s["time_saved_pct"] == pytest.approx((1 - s["rms_ms"] / s["layer_ms"]) * 100)
    assert summarize([r for r in result["rows"] if r["kind"] == "rms"]) == []  # nothing to compare


def test_table_lists_every_row_and_the_summary_line(result):
    text = format_norm_table(result)
    lines = text.splitlines()
    assert "fwd GB/s" in lines[1] and "f+b %copy" in lines[1]
    assert lines[0].endswith(
        "interleaved rounds, cache warm (>= 4 untimed calls of the case before each sample)"
    )
    assert sum(line.startswith(("layer", "rms", "copy")) for line in lines) == 5
    assert "fp32 64x128: RMSNorm fastest (" in text and "than LayerNorm fastest (" in text


def _by_hand(
    rms_ms: float, layer_ms: float, *, threads: int = 2, repeats: int = 20, settle_calls: int = 4
) -> dict:
    """A norm result with one RMSNorm and one LayerNorm row of the given fwd+bwd times: no
    timing."""
    rows = []
    for kind, impl, ms in (("rms", "cpp", rms_ms), ("layer", "cpp", layer_ms)):
        row = {"kind": kind, "impl": impl, "dtype": "fp32", "shape": [8192, 768]}
        for key in ("fwd", "fwdbwd"):
            row.update({f"{key}_ms": ms, f"{key}_gbps": 1.0, f"{key}_copy_frac": 0.5})
        rows.append(row)
    copy = {"dtype": "fp32", "shape": [8192, 768], "ms": 1.0, "gbps": 2.0}
    return {
        "device": "cpu",
        "host": "x86_64",
        "threads": threads,
        "torch": "2.x",
        "repeats": repeats,
        "cache": "warm",
        "settle_calls": settle_calls,
        "copy": [copy],
        "rows": rows,
        "summary": summarize(rows),
        "skipped": [],
    }


def test_summary_line_when_rms_is_faster():
    res = _by_hand(8.742, 11.961)
    (s,) = res["summary"]
    assert round(s["rms_faster_pct"]) == 37 and round(s["time_saved_pct"]) == 27
    line = format_norm_table(res).splitlines()[-1]
    assert line == (
        "fp32 8192x768: RMSNorm fastest (cpp, 8.742 ms) is 37% faster than LayerNorm fastest "
        "(cpp, 11.961 ms) fwd+bwd (27% less time)"
    )


def test_summary_line_when_rms_is_slower():
    res = _by_hand(11.961, 8.742)
    (s,) = res["summary"]
    assert (
        round(s["rms_faster_pct"]) == -27 and round(s["time_saved_pct"]) == -37
    )  # the JSON keeps its signs
    line = format_norm_table(res).splitlines()[-1]
    assert line == (
        "fp32 8192x768: RMSNorm fastest (cpp, 11.961 ms) is 37% slower than LayerNorm fastest "
        "(cpp, 8.742 ms) fwd+bwd"
    )
    assert (
        "-" not in line.split(": ", 1)[1].replace("fwd+bwd", "")
        and "faster" not in line
        and "less time" not in line
    )


def test_summary_line_when_equal_says_zero_faster():
    line = format_norm_table(_by_hand(5.0, 5.0)).splitlines()[-1]
    assert "is 0% faster than" in line and "(0% less time)" in line


def test_norm_header_counts_are_singular_for_one():
    one = format_norm_table(_by_hand(1.0, 2.0, threads=1, repeats=1, settle_calls=1)).splitlines()[
        0
    ]
    assert (
        "(x86_64, 1 thread, torch" in one
        and "median of 1 interleaved round," in one
        and "(>= 1 untimed call of the case" in one
    )
    two = format_norm_table(_by_hand(1.0, 2.0, threads=2, repeats=2, settle_calls=2)).splitlines()[
        0
    ]
    assert "2 threads" in two and "2 interleaved rounds" in two and "2 untimed calls" in two


def _step_result(threads: int, pairs: int, warmup: int) -> dict:
    setup = {
        "overrides": [],
        "model": "tiny",
        "norm": "rms/torch",
        "precision": "fp32",
        "tokens_per_step": 64,
        "median_ms": 1.0,
    }
    ratio = dict.fromkeys(("median", "p10", "p25", "p75", "p90"), 1.0)
    return {
        "device": "cpu",
        "threads": threads,
        "pairs": pairs,
        "warmup": warmup,
        "common": [],
        "a": setup,
        "b": setup,
        "ratio": ratio,
    }


def test_step_header_counts_are_singular_for_one():
    one = bench_step.format_step(_step_result(1, 1, 1)).splitlines()[0]
    assert "(1 thread)" in one and "1 interleaved pair after 1 warm-up step each" in one
    two = bench_step.format_step(_step_result(2, 2, 2)).splitlines()[0]
    assert "(2 threads)" in two and "2 interleaved pairs after 2 warm-up steps each" in two


def test_help_is_plain_text_and_names_both_modes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert (
        "``" not in out and ":func:" not in out and "normlab-bench step" in out.splitlines()[1]
    )  # usage
    description = out.split("\n\n")[1]
    assert description.startswith("Three modes:") and "normlab-bench step" in description
    assert "normlab-bench peak" in description and "settings" not in description
    flat = " ".join(out.split())  # argparse wraps the option help
    assert "auto is not accepted" in flat and "(default: ./bench.json)" in flat
    assert (
        "noisier, so use --repeats 10 or more" in flat and "noisier: use 10 or more" in flat
    )  # --cache, --repeats
    with pytest.raises(SystemExit):
        main(["step", "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "(default: ./bench_step.json)" in out and "bench.json" not in out


class _Counted:
    """A case function that counts its calls; ``log`` interleaves them with the flushes."""

    def __init__(self, log=None):
        self.calls, self.log = 0, log

    def __call__(self):
        self.calls += 1
        if self.log is not None:
            self.log.append("call")


def test_settle_makes_at_least_the_asked_calls_and_at_most_twice_that():
    fn = _Counted()
    assert settle(fn, torch.device("cpu"), 4)[0] >= 4 and 4 <= fn.calls <= 8
    fn = _Counted()
    n, best = settle(
        fn, torch.device("cpu"), 3, ref_ms=0.0
    )  # never within 1.1x of 0 ms: up to the cap
    assert n == fn.calls == 6 and best >= 0


def _count_norm_calls(monkeypatch):
    """Every norm module built by the benchmark counts its forward calls in the returned list."""
    counts = []
    real = bench.build_norm

    def build(*args, **kwargs):
        norm = real(*args, **kwargs)
        counts.append(0)
        i = len(counts) - 1

        def hook(module, inputs):
            counts[i] += 1

        norm.register_forward_pre_hook(hook)
        return norm

    monkeypatch.setattr(bench, "build_norm", build)
    return counts


def test_warm_settles_each_case_before_every_sample(monkeypatch):
    counts = _count_norm_calls(monkeypatch)
    settled = []
    real_settle = bench.settle

    def spy(fn, device, calls, ref_ms=float("inf")):
        before = counts[0]
        n, best = real_settle(fn, device, calls, ref_ms)
        settled.append((calls, n, counts[0] - before))
        return n, best

    monkeypatch.setattr(bench, "settle", spy)
    res = bench_norms(["rms"], ["torch"], ["fp32"], [(64, 32)], repeats=2, warmup=1, settle_calls=3)
    assert (res["cache"], res["settle_calls"], res["flush_mb"]) == ("warm", 3, None)
    # one settle per (case, key) per round: copy, fwd, fwdbwd x 2 rounds; the norm is called only in
    # fwd, fwdbwd
    assert len(settled) == 3 * 2 and all(c == 3 and 3 <= n <= 6 for c, n, _ in settled)
    # each settle call is a call of the case's own function: the norm for fwd / fwdbwd, never for
    # the copy
    assert [calls for _, _, calls in settled] == [
        0 if i % 3 == 0 else n for i, (_, n, _) in enumerate(settled)
    ]
    (row,) = res["rows"]
    assert [n for _, n, _ in settled[1::3] + settled[2::3]] == row["fwd_untimed_calls"] + row[
        "fwdbwd_untimed_calls"
    ]
    # forward calls in all: warm-up (1 + settle_calls) and, per sample, the settle calls then inner
    # timed calls
    total = sum(
        1 + 3 + sum(row[f"{k}_untimed_calls"]) + 2 * row["inner"][k] for k in ("fwd", "fwdbwd")
    )
    assert counts == [total]


def test_cold_flushes_before_every_one_call_sample(monkeypatch):
    log = []
    counts = _count_norm_calls(monkeypatch)
    monkeypatch.setattr(
        bench, "make_flush", lambda *a: pytest.fail("a flush was given: none is made")
    )
    res = bench_norms(
        ["layer", "rms"],
        ["torch"],
        ["fp32"],
        [(64, 32)],
        repeats=2,
        warmup=1,
        cache="cold",
        flush=lambda: log.append("flush"),
    )
    assert (res["cache"], res["settle_calls"], res["flush_mb"]) == ("cold", None, 512)
    samples = 2 * (1 + 2 * 2)  # rounds x (copy + 2 norms x fwd, fwdbwd)
    assert log.count("flush") == samples
    for r in res["rows"]:
        assert r["inner"] == {"fwd": 1, "fwdbwd": 1}
        assert r["fwd_untimed_calls"] == r["fwdbwd_untimed_calls"] == [1, 1]
    (copy,) = res["copy"]
    assert copy["inner"] == 1 and copy["untimed_calls"] == [1, 1] and len(copy["samples_ms"]) == 2
    # per norm: warm-up 1 call per key, then per sample one untimed call (allocator) and the timed
    # one
    assert counts == [2 * (1 + 2 * 2)] * 2
    assert (
        format_norm_table(res)
        .splitlines()[0]
        .endswith("cache cold (512 MiB flush before each one-call sample)")
    )


def test_cold_calls_the_case_then_flushes_then_times_one_call(monkeypatch):
    log = []
    fn = _Counted(log)
    clock = iter(range(100))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: log.append("clock") or next(clock))
    assert bench.cold_sample_ms(fn, torch.device("cpu"), lambda: log.append("flush")) == 1e3
    assert log == ["call", "flush", "clock", "call", "clock"]  # the flush is outside the clock


def test_make_flush_writes_its_whole_buffer():
    flush = bench.make_flush(torch.device("cpu"), 1)
    buf = flush()
    assert (
        buf.numel() == 2**20 and buf.dtype == torch.uint8 and int(buf.min()) == int(buf.max()) == 1
    )
    assert int(flush().max()) == 2


def test_an_implementation_the_device_cannot_run_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = bench_norms(["rms"], ["torch", "triton"], ["fp32"], [(8, 32)], repeats=1, warmup=1)
    assert [r["impl"] for r in res["rows"]] == ["torch"]
    (skip,) = res["skipped"]
    assert skip["impl"] == "triton" and "norm.impl=triton" in skip["reason"]


def test_cli_writes_the_json_to_bench_json_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "--shapes",
                "16x32",
                "--impls",
                "torch",
                "--dtypes",
                "fp32",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--model",
                "tiny",
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {tuple(r["shape"]) for r in data["rows"]} == {
        (16, 32),
        (16, 128),
    }  # + d_model of model=tiny
    out = capsys.readouterr().out
    assert "RMSNorm fastest" in out and "wrote bench.json" in out


#: The smallest CLI bench: one shape, torch RMSNorm, fp32, 2 repeats after 1 warm-up.
ONE_RMS_SHAPE = [
    "--shapes", "64x32", "--impls", "torch", "--kinds", "rms", "--dtypes", "fp32",
    "--repeats", "2", "--warmup", "1",
]  # fmt: skip


def test_cli_cold_regime_lands_in_the_json(tmp_path, capsys):
    path = tmp_path / "cold.json"
    assert (
        main(
            [
                *ONE_RMS_SHAPE,
                "--cache",
                "cold",
                "--flush-mb",
                "1",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    data = json.loads(path.read_text())
    assert (data["cache"], data["flush_mb"], data["settle_calls"]) == ("cold", 1, None)
    assert data["rows"][0]["inner"] == {"fwd": 1, "fwdbwd": 1}
    assert "cache cold (1 MiB flush" in capsys.readouterr().out


def test_cli_settle_lands_in_the_json(tmp_path):
    path = tmp_path / "warm.json"
    assert (
        main(
            [
                *ONE_RMS_SHAPE,
                "--settle",
                "2",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    data = json.loads(path.read_text())
    assert (data["cache"], data["settle_calls"], data["flush_mb"]) == ("warm", 2, None)
    assert all(2 <= n <= 4 for n in data["rows"][0]["fwd_untimed_calls"])


@pytest.mark.parametrize("argv", [["--cache", "lukewarm"], ["--settle", "-1"], ["--flush-mb", "0"]])
def test_cli_refuses_a_bad_cache_option(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and argv[0] in err
    if argv[0] == "--cache":
        assert "invalid choice: 'lukewarm'" in err


def test_bench_norms_refuses_an_unknown_regime():
    with pytest.raises(ValueError, match="cache='hot'"):
        bench_norms(["rms"], ["torch"], ["fp32"], [(8, 32)], repeats=1, cache="hot")


def test_cli_refuses_an_unknown_impl(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--impls", "cuda_magic"])
    assert e.value.code == 2 and "unknown impl cuda_magic" in capsys.readouterr().err


TINY = [
    "model=tiny",
    "model.n_layer=1",
    "model.context_length=32",
    "data.batch_size=2",
    "device=cpu",
]


def test_step_benchmark_reports_a_finite_positive_ratio(tmp_path):
    path = tmp_path / "step.json"
    assert (
        main(
            [
                "step",
                *TINY,
                "--a",
                "norm=layer",
                "--b",
                "norm=rms",
                "--pairs",
                "2",
                "--warmup",
                "1",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    data = json.loads(path.read_text())
    assert data["mode"] == "step" and data["pairs"] == 2 and data["complete"]
    assert (data["a"]["norm"], data["b"]["norm"]) == (
        "layer/cpp",
        "rms/cpp",
    )  # the fair default: both auto
    assert data["a"]["overrides"] == ["norm=layer"] and data["b"]["composed_with"] == [
        *TINY,
        "norm=rms",
    ]
    assert data["a"]["tokens_per_step"] == 2 * 32
    for key in ("a", "b"):
        assert len(data[key]["times_ms"]) == 2 and all(t > 0 for t in data[key]["times_ms"])
    ratio = data["ratio"]
    assert math.isfinite(ratio["median"]) and ratio["median"] > 0
    assert ratio["p10"] <= ratio["p25"] <= ratio["median"] <= ratio["p75"] <= ratio["p90"]
    assert ratio["per_pair"] == pytest.approx(
        [b / a for a, b in zip(data["a"]["times_ms"], data["b"]["times_ms"], strict=True)]
    )


def test_a_step_benchmark_stopped_midway_keeps_the_pairs_it_timed(tmp_path, monkeypatch):
    from normlab.bench import step as step_bench

    real, calls = step_bench.StepSetup.run_step, []

    def counted(self):
        calls.append(self)
        if len(calls) == 2 + 2 * 2 + 1:  # 1 warm-up step each, 2 pairs, then a time limit
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(step_bench.StepSetup, "run_step", counted)
    path = tmp_path / "step.json"
    argv = ["step", *TINY, "--a", "norm=layer", "--b", "norm=rms", "--pairs", "4"]
    with pytest.raises(KeyboardInterrupt):
        main([*argv, "--warmup", "1", "--json", str(path)])
    data = json.loads(path.read_text())
    assert data["pairs"] == 2 and not data["complete"]
    assert len(data["a"]["times_ms"]) == len(data["b"]["times_ms"]) == 2


def test_step_benchmark_writes_bench_step_json_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            ["step", *TINY, "--a", "norm=layer", "--b", "norm=rms", "--pairs", "1", "--warmup", "1"]
        )
        == 0
    )
    assert json.loads((tmp_path / "bench_step.json").read_text())["mode"] == "step"
    assert not (tmp_path / "bench.json").exists()
    out = capsys.readouterr().out
    assert "1 interleaved pair after 1 warm-up step each" in out and "wrote bench_step.json" in out


def test_step_benchmark_stops_on_a_bad_override_with_one_line(tmp_path, capsys):
    assert (
        main(
            [
                "step",
                *TINY,
                "--a",
                "norm.eps=-1",
                "--b",
                "norm=rms",
                "--json",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("normlab-bench: norm.eps=-1") and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


def test_bench_step_and_train_run_the_same_step_function(tmp_path, monkeypatch, compose_cfg):
    from normlab.compose import to_train_config
    from normlab.training import step as training_step
    from normlab.training.loop import train

    calls: list[int] = []
    real = training_step.train_step

    def counted(run, step, lr, *args, **kwargs):
        calls.append(step)
        return real(run, step, lr, *args, **kwargs)

    monkeypatch.setattr(training_step, "train_step", counted)
    args = ["--a", "norm=layer", "--b", "norm=rms", "--pairs", "2", "--warmup", "1"]
    assert main(["step", *TINY, *args, "--json", str(tmp_path / "s.json")]) == 0
    assert calls == [0, 0, 1, 1, 2, 2]  # (1 warm-up + 2 timed) steps x 2 setups, steps 0, 1, 2
    calls.clear()
    cfg = to_train_config(compose_cfg([*TINY, "max_steps=3", "progress=false"]))
    assert train(cfg, tmp_path / "run")["status"] == "completed"
    assert calls == [0, 1, 2]


def test_every_mode_states_its_threads_and_puts_the_count_back(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    argv = ["step", *TINY, "threads=1", "--pairs", "1", "--warmup", "0"]
    assert main([*argv, "--a", "norm=layer", "--b", "norm=rms", "--json", str(tmp_path / "s")]) == 0
    assert "threads: 1 (from threads=)" in capsys.readouterr().out
    assert torch.get_num_threads() == before
    assert main(["--impls", "torch", "--kinds", "rms", "--dtypes", "fp32", "--shapes", "16x32",
                 "--repeats", "1", "--warmup", "1", "--threads", "1",
                 "--json", str(tmp_path / "n")]) == 0  # fmt: skip
    assert "threads: 1 (from --threads)" in capsys.readouterr().out
    from normlab.commands.bench import set_threads
    from normlab.commands.train import auto_threads

    try:
        assert set_threads(None, None) == f"threads: {auto_threads()} (from half the cores)"
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert set_threads(None, None) == "threads: 1 (from $OMP_NUM_THREADS)"
    finally:
        torch.set_num_threads(before)
