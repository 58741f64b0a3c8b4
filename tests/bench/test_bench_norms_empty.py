"""``normlab-bench``: a bench in which every case was skipped measured nothing and fails."""

from __future__ import annotations

import pytest

from normlab.bench.norms import BenchError, bench_norms
from normlab.commands.bench import main


def test_a_bench_whose_every_case_is_skipped_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # triton cannot run on this CPU
    with pytest.raises(
        BenchError, match=r"no norm case ran on cpu: all 2 were skipped \(rms/triton"
    ):
        bench_norms(["rms", "layer"], ["triton"], ["fp32"], [(8, 32)], repeats=1, warmup=1)


def test_the_command_exits_1_on_an_empty_bench(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "bench.json"
    argv = ["--kinds", "rms", "--impls", "triton", "--shapes", "8x32", "--repeats", "1"]
    assert main([*argv, "--json", str(out)]) == 1
    assert "no norm case ran" in capsys.readouterr().err
    assert not out.exists()
