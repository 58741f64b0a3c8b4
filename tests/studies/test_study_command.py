"""``normlab-study``: the two study commands behind one entry point (each study's own output is
tested in test_studies.py); an unknown study or a bad config is one line, exit status 2."""

from __future__ import annotations

import pytest

from normlab.commands.study import main


def test_an_unknown_study_is_one_line_naming_the_allowed_ones(capsys):
    assert main(["fp16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("normlab-study: error: 'fp16' is no study; allowed: fp16-statistics,")
    assert main([]) == 2 and "no study given" in capsys.readouterr().err


@pytest.mark.parametrize("study", ["fp16-statistics", "fp16_statistics", "norm-cost", "norm_cost"])
def test_each_study_refuses_a_bad_override_in_one_line_and_writes_nothing(study, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([study, "model=tiny", "norm.eps=-1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "norm.eps=-1" in err
    assert not out.exists()


def test_fp16_statistics_writes_its_report(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["model=tiny", "device=cpu", "--rows", "4", "--scales", "1,1000", "--model-rms", "1"]
    assert main(["fp16-statistics", *args, "--impls", "torch", "--out", str(out)]) == 0
    assert (out / "fp16_statistics.md").is_file() and (out / "fp16_statistics.png").is_file()
    assert f"wrote {out / 'fp16_statistics.md'}" in capsys.readouterr().out
