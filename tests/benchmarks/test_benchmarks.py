"""``benchmarks/`` (checks of the harness itself, outside the package): the plain loop trains the
same model on the same batches as normlab's step, and each of ``python -m benchmarks baseline``,
``profile`` and ``settings`` writes what it says; ``normlab-bench`` points at them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.__main__ import main
from benchmarks.plain_loop import build_plain
from normlab.bench import step as bench_step
from normlab.commands import bench

from ..bench.test_bench import TINY  # the step benchmark's tiny setup


def test_the_plain_loop_trains_the_same_model_on_the_same_batches_bit_for_bit():
    """The baseline's A side is the same training: same initial weights, same batch, same loss,
    and after one AdamW step the same parameters (fp32 on CPU)."""
    from normlab.training import step as training_step

    overrides = [*TINY, "norm.impl=torch"]
    normlab = bench_step.build_setup(overrides)
    plain = build_plain(overrides, normlab.run.device)
    for a, b in zip(normlab.run.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)
    lr = training_step.lr_at(0, normlab.cfg.max_steps, normlab.cfg.optim)
    loss_sum, _ = training_step.train_step(normlab.run, 0, lr)
    assert torch.equal(loss_sum, plain.train_step(0).float())
    for a, b in zip(normlab.run.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_baseline_reports_normlab_over_plain(tmp_path, capsys):
    path = tmp_path / "bl.json"
    argv = ["baseline", *TINY, "--pairs", "2", "--warmup", "1", "--json", str(path)]
    assert main(argv) == 0
    data = json.loads(path.read_text())
    assert data["baseline"] and (data["a"]["loop"], data["b"]["loop"]) == ("plain", "normlab")
    assert data["ratio"]["per_pair"] == pytest.approx(
        [b / a for a, b in zip(data["a"]["times_ms"], data["b"]["times_ms"], strict=True)]
    )
    out = capsys.readouterr().out
    assert "A plain loop:" in out and "normlab/plain step time: median" in out


def test_profile_lists_where_normlab_spends_more_than_the_plain_loop(tmp_path, capsys):
    path = tmp_path / "prof.json"
    argv = ["profile", "1", *TINY, "--pairs", "1", "--json", str(path)]
    assert main(argv) == 0
    r = json.loads(path.read_text())["threads"]["1"]
    assert r["normlab_wall_ms"] > 0 and r["plain_wall_ms"] > 0
    assert any(op == "aten::mm" or op == "aten::addmm" for op, _, _ in r["normlab_top"])
    for _op, a, b, diff in r["more"]:
        assert diff == pytest.approx(a - b) and diff > 0
    out = capsys.readouterr().out
    assert "-- 1 thread: normlab" in out and "where normlab spends more" in out
    with pytest.raises(SystemExit):
        main(["profile", "0,x", *TINY])
    assert "expected thread counts >= 1" in capsys.readouterr().err


def test_settings_table_reports_mfu_against_each_precisions_measured_peak(
    tmp_path, monkeypatch, capsys
):
    from normlab.training import peak

    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(peak, "measure_tflops", lambda d, dt: {"fp32": 0.01, "bf16": 0.04}[dt])
    path = tmp_path / "settings.json"
    argv = ["settings", *TINY, "--setting", "precision=fp32", "--setting", "precision=bf16"]
    assert main([*argv, "--rounds", "2", "--warmup", "1", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    fp32, bf16 = data["rows"]
    assert (fp32["peak_dtype"], bf16["peak_dtype"]) == ("fp32", "bf16")
    assert (fp32["peak_tflops"], bf16["peak_tflops"]) == (0.01, 0.04)
    for r in data["rows"]:
        assert r["peak_tflops_source"] == "measured" and len(r["times_ms"]) == 2
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / (r["median_ms"] / 1e3))
        want = r["flops_per_step"] / (r["median_ms"] / 1e3) / (r["peak_tflops"] * 1e12)
        assert r["mfu"] == pytest.approx(want)
    assert fp32["speedup"] == 1.0
    want = float(np.median(np.array(fp32["times_ms"]) / np.array(bf16["times_ms"])))
    assert bf16["speedup"] == pytest.approx(want)
    out = capsys.readouterr().out
    assert "settings benchmark on cpu" in out and "precision=bf16" in out and "bf16 meas" in out


def test_a_bad_override_is_one_line_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "x.json"
    assert main(["baseline", *TINY, "norm.eps=-1", "--json", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m benchmarks: norm.eps=-1") and err.count("\n") == 1
    assert not path.exists()


@pytest.mark.parametrize(
    ("argv", "new"),
    [
        (["settings", "model=tiny"], "python -m benchmarks settings"),
        (["step", "model=tiny", "--baseline"], "python -m benchmarks baseline"),
        (["step", "--profile", "1,2"], "python -m benchmarks profile"),
    ],
)
def test_normlab_bench_names_the_benchmark_a_moved_mode_became(argv, new, tmp_path, capsys):
    assert bench.main([*argv, "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and new in err and "from a checkout" in err
    assert err.startswith(f"normlab-bench: error: {new.split()[3]} moved:")  # the mode, by name
    assert not (tmp_path / "x.json").exists()
