"""The series file (``normlab-report ... --series``): what the report reads of every run, stored
beside ``report.md``; ``normlab-report <series file>`` rebuilds the same report from it alone, and
``load_runs`` gives the same runs from it as from their dirs. Then the reader's gauntlet: a link,
a gzip bomb, a file too big, not gzip, not JSON, too deep, another format, run names that are not
relative paths, held-out corpus names that would name a figure file elsewhere.

Sweeps are synthetic (``test_report_verdicts.write``: bpb, a held-out corpus, training seconds),
with diagnostics, downstream accuracy, loss spikes, annealed budgets, keys the report does not
read, a diverged run and a run dir that never trained added here.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from normlab.commands.report import main
from normlab.report import ReportError, build_ladder, load_runs, render_ladder, render_markdown
from normlab.report import runs as runs_module
from normlab.report.runs import (
    ANNEALED_FILE,
    SERIES_FILE,
    SERIES_MAX_DEPTH,
    read_series,
    series_row,
    series_step_bench,
    write_series,
)

from .test_report import make_sweep
from .test_report_compute import bench_json
from .test_report_ladder import ladder_sweep
from .test_report_verdicts import LAYER, RMS, write

RULE = {"window": 50, "k": 6.0}


def enrich(d: Path, seed: int, norm: str) -> None:
    """Add to run dir ``d``: diag rows every 20 steps, a downstream accuracy on the last row, keys
    the report never reads (``train/lr``, a sample text), loss spikes; for LayerNorm runs an
    ``annealed.jsonl`` (with a truncated last line, as a killed writer leaves)."""
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r["train/lr"] = 0.002
        if r["step"] % 20 == 0:
            big = 5.0 + seed + 10 * (norm == "rms")
            r |= {"sample/text": "to be or not", "diag/block0/resid_rms": 1.0 + r["step"] / 40}
            r |= {"diag/block1/resid_rms": 1.5, "diag/final/resid_rms": 2.0}
            r |= {"diag/block1/mlp_absmax": big, "diag/block1/mlp_kurtosis": 3.0 + big}
    rows[-1]["downstream/piqa/acc"] = 0.5 + 0.01 * seed + 0.02 * (norm == "rms")
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = json.loads((d / "summary.json").read_text())
    s |= {"loss_spikes": seed + (norm == "rms"), "loss_spike_rule": RULE, "max_grad_norm": 2.0}
    (d / "summary.json").write_text(json.dumps(s))
    if norm == "layer":
        budgets = [
            {"budget_steps": b, "branch_from": b - 10, "val/loss": 2.5 - b / 100} for b in (20, 40)
        ]
        lines = "".join(json.dumps(r) + "\n" for r in budgets)
        (d / ANNEALED_FILE).write_text(lines + '{"budget_steps": 6')


def rich_sweep(root: Path) -> Path:
    """LayerNorm and RMSNorm x seeds 0-2 (:func:`enrich`), a diverged RMSNorm run (seed 3) and a
    run dir ``train`` refused (no metrics, ``status: refused``)."""
    for seed in LAYER:
        enrich(write(root, "layer", seed, LAYER[seed]), seed, "layer")
        enrich(write(root, "rms", seed, RMS[seed]), seed, "rms")
    bad = write(root, "rms", 3, 2.5)
    s = json.loads((bad / "summary.json").read_text())
    s |= {"status": "diverged", "diverged_at_step": 17, "final_val_loss": None}
    (bad / "summary.json").write_text(json.dumps(s))
    refused = root / "rms-seed9-refused"
    (refused / ".hydra").mkdir(parents=True)
    (refused / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["norm=rms", "seed=9"]))
    (refused / "summary.json").write_text(json.dumps({"status": "refused", "error": "no cpp"}))
    return root


def without_sources(md: str) -> list[str]:
    """``md``'s lines, the one naming where the runs were read from left out, and the path of a
    step benchmark (a ``step_bench.json``, or the series file that stored it) made ``<source>``."""
    lines = [ln for ln in md.splitlines() if not ln.startswith(("- Runs from:", "- Sources:"))]
    return [re.sub(r"`[^`]*(step_bench\.json|series\.json\.gz)`", "<source>", ln) for ln in lines]


@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> Path:
    """A rich sweep reported once (``--margin 0.05``), its series in ``report/series.json.gz``."""
    sweep = rich_sweep(tmp_path_factory.mktemp("series") / "sweep")
    assert main([str(sweep), "--margin", "0.05"]) == 0
    return sweep


# --- the round trip ------------------------------------------------------------------------------


def test_a_report_rebuilt_from_its_series_file_is_the_same_report(reported, tmp_path, capsys):
    series = reported / "report" / SERIES_FILE
    assert main([str(series), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"options stored in {series}: --margin 0.05 --alpha 0.05 --baseline norm=layer" in out
    first, again = (
        (reported / "report" / "report.md").read_text(),
        (tmp_path / "report.md").read_text(),
    )
    for section in (
        "## Bits per byte",
        "wiki_vital",
        "## Stability",
        "## Downstream tasks",
        "## Diagnostics",
        "## Excluded runs",
        "- Skipped (never trained, in no table): `rms-seed9-refused`",
        "diverged at step 17",
    ):
        assert section in first, section
    assert f"- Runs from: `{series}`" in again
    assert without_sources(again) == without_sources(first)
    figures = sorted(p.name for p in (reported / "report").glob("*.png"))
    assert (
        sorted(p.name for p in tmp_path.glob("*.png")) == figures and "resid_depth.png" in figures
    )
    # the series the rebuild wrote is the same file, byte for byte (no time stamp in it)
    assert (tmp_path / SERIES_FILE).read_bytes() == series.read_bytes()


def test_runs_read_from_a_series_file_are_the_runs_read_from_their_dirs(reported):
    series = reported / "report" / SERIES_FILE
    from_dirs, from_series = load_runs([reported]), load_runs([series])
    assert [r.name for r in from_series] == [r.name for r in from_dirs]
    for i, (a, b) in enumerate(zip(from_dirs, from_series, strict=True)):
        for f in dataclasses.fields(a):
            if f.name not in ("path", "metrics"):
                assert getattr(b, f.name) == getattr(a, f.name), (a.name, f.name)
        assert b.path == series / str(i)
        assert b.metrics == [series_row(r) for r in a.metrics]
    layer = next(r for r in from_series if r.name == "layer-seed0-byte")
    assert [r["budget_steps"] for r in layer.annealed] == [20, 40]  # the truncated line skipped
    kept = {k for r in from_series for row in r.metrics for k in row}
    assert {"val/wiki_vital/bpb", "perf/train_time_s", "diag/block1/mlp_absmax"} <= kept
    assert {"downstream/piqa/acc", "val/bpb", "train/loss", "step"} <= kept
    assert not kept & {"train/lr", "sample/text"}  # keys the report never reads


def test_the_series_file_stores_every_run_with_why_it_is_left_out(reported):
    doc = read_series(reported / "report" / SERIES_FILE)
    why = {r["name"]: (r["excluded"], r["never_trained"]) for r in doc["runs"]}
    assert why["rms-seed3-byte"] == ("diverged at step 17", None)
    assert why["rms-seed9-refused"][1] == "refused before training: no cpp"
    assert why["layer-seed0-byte"] == (None, None) and len(why) == 8
    assert doc["options"] == {
        "margin": 0.05,
        "margin_compute": None,
        "alpha": 0.05,
        "baseline": "norm=layer",
        "target": None,
        "sequential": None,
    }


def test_the_anytime_valid_section_is_stored_and_rebuilt_from_the_series(tmp_path, capsys):
    sweep = rich_sweep(tmp_path / "sweep")
    assert main([str(sweep), "--margin", "0.05", "--sequential"]) == 0
    series = sweep / "report" / SERIES_FILE
    assert read_series(series)["options"]["sequential"] is True
    first = (sweep / "report" / "report.md").read_text()
    section = first.split("## Anytime-valid verdict")[1].split("\n## ")[0]
    assert "`norm=rms` vs `norm=layer`: **" in section and "always-valid 95% CI" in section
    assert "| pairs | always-valid lo | hi | decision |" in section
    capsys.readouterr()
    assert main([str(series), "--out", str(tmp_path / "again")]) == 0
    assert "--baseline norm=layer --sequential" in capsys.readouterr().out
    again = (tmp_path / "again" / "report.md").read_text()
    assert without_sources(again) == without_sources(first)
    assert main([str(sweep), "--margin", "0.05", "--out", str(tmp_path / "plain")]) == 0
    assert "## Anytime-valid verdict" not in (tmp_path / "plain" / "report.md").read_text()


def test_options_given_on_the_command_line_win_over_the_stored_ones(reported, tmp_path, capsys):
    series = reported / "report" / SERIES_FILE
    assert main([str(series), "--out", str(tmp_path), "--margin", "0.001", "--no-series"]) == 0
    assert "options stored in" in capsys.readouterr().out
    md = (tmp_path / "report.md").read_text()
    assert "±0.001 nats/token" in md and not (tmp_path / SERIES_FILE).exists()


def test_one_run_of_a_series_file_is_named_as_its_run_dir_would_be(tmp_path):
    for group in ("g1", "g2"):
        make_sweep(tmp_path / "sweep" / group)
    dirs = load_runs([tmp_path / "sweep"])
    assert dirs[0].name == "g1/layer-seed0"
    series = write_series(tmp_path / SERIES_FILE, dirs)
    assert [r.name for r in load_runs([series])] == [r.name for r in dirs]
    pick = [0, 1, 3]  # all in g1: named below g1, as their dirs would be
    want = [r.name for r in load_runs([dirs[i].path for i in pick])]
    assert [r.name for r in load_runs([series / str(i) for i in pick])] == want
    assert want == ["layer-seed0", "layer-seed1", "rms-seed0"]
    (one,) = load_runs([series / "4"])
    assert one.name == "rms-seed1" and one.path == series / "4"
    assert len(load_runs([series, series / "4"])) == len(dirs)  # the whole file covers run 4
    with pytest.raises(ReportError, match=r"no run 99 in .*series.json.gz: it holds 12"):
        load_runs([series / "99"])


def test_a_ladder_rebuilds_from_its_series_file(tmp_path):
    sweep = ladder_sweep(tmp_path / "sweep", [1.0, 1.05, 1.1, 1.2], seeds=2)
    series = write_series(tmp_path / SERIES_FILE, load_runs([sweep]))
    a, b = build_ladder([sweep]), build_ladder([series])
    assert without_sources(render_ladder(b)) == without_sources(render_ladder(a))
    for sa, sb in zip(a.sizes, b.sizes, strict=True):
        assert sa["shape"] == sb["shape"]
        md_a, md_b = render_markdown(sa["report"]), render_markdown(sb["report"])
        assert without_sources(md_b) == without_sources(md_a)


# --- the interleaved step benchmark --------------------------------------------------------------


def bench_sweep(root: Path) -> Path:
    make_sweep(root)
    (root / "step_bench.json").write_text(bench_json([0.98, 1.0, 0.99, 1.01, 0.97, 0.99]))
    return root


def test_the_series_file_stores_the_interleaved_step_benchmark(tmp_path):
    sweep = bench_sweep(tmp_path / "sweep")
    assert main([str(sweep), "--margin", "0.05"]) == 0
    series = sweep / "report" / SERIES_FILE
    found = series_step_bench(series)
    assert found == (series, json.loads((sweep / "step_bench.json").read_text()))
    assert series_step_bench(series / "0") is None and series_step_bench(sweep) is None
    # a series rebuilt from a series keeps it
    assert main([str(series), "--out", str(tmp_path / "again")]) == 0
    assert series_step_bench(tmp_path / "again" / SERIES_FILE)[1] == found[1]


def test_a_rebuilt_report_keeps_the_speed_verdict(tmp_path):
    sweep = bench_sweep(tmp_path / "sweep")
    assert main([str(sweep), "--margin", "0.05"]) == 0
    assert main([str(sweep / "report" / SERIES_FILE), "--out", str(tmp_path / "r")]) == 0
    first, again = (sweep / "report" / "report.md").read_text(), (tmp_path / "r" / "report.md")
    assert "**This is the speed verdict**" in first  # the interleaved bench's section
    assert without_sources(again.read_text()) == without_sources(first)


# --- the command's flags -------------------------------------------------------------------------


def test_series_goes_where_asked_and_nowhere_with_no_series(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep")
    assert main([str(sweep), "--series", str(tmp_path / "s" / "mine.json.gz")]) == 0
    assert (tmp_path / "s" / "mine.json.gz").is_file()
    assert not (sweep / "report" / SERIES_FILE).exists()
    assert "`normlab-report " in capsys.readouterr().out
    assert main([str(sweep), "--out", str(tmp_path / "n"), "--no-series"]) == 0
    assert not (tmp_path / "n" / SERIES_FILE).exists()
    # a series source's report goes beside it, in report/
    assert main([str(tmp_path / "s" / "mine.json.gz"), "--no-series"]) == 0
    assert (tmp_path / "s" / "report" / "report.md").is_file()


@pytest.mark.parametrize(
    "flags",
    [["--series", "x.json.gz", "--no-series"], ["--plan", "0.01", "--series", "x.json.gz"]],
)
def test_series_flags_that_contradict_are_refused(tmp_path, flags, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), *flags])
    assert e.value.code == 2 and "--series" in capsys.readouterr().err


def test_the_series_file_replaces_a_link_and_never_writes_through_it(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (tmp_path / "link.json.gz").symlink_to(target)
    assert main([str(sweep), "--series", str(tmp_path / "link.json.gz")]) == 0
    assert target.read_text() == "keep me" and not (tmp_path / "link.json.gz").is_symlink()
    assert read_series(tmp_path / "link.json.gz")["runs"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_run_dir_without_annealed_budgets_has_none(tmp_path):
    (run,) = load_runs([make_sweep(tmp_path) / "layer-seed0"])
    assert run.annealed == []


# --- the reader's gauntlet: each refused in one line naming the file ----------------------------


def good_doc(tmp_path: Path) -> dict:
    """A valid series document (a small sweep's), as JSON."""
    path = write_series(tmp_path / "good.json.gz", load_runs([make_sweep(tmp_path / "sweep")]))
    return json.loads(gzip.decompress(path.read_bytes()))


def refused(path: Path, match: str, capsys) -> None:
    """``load_runs`` and ``normlab-report`` refuse ``path``, in one line matching ``match``."""
    with pytest.raises(ReportError, match=match):
        load_runs([path])
    assert main([str(path), "--out", str(path.parent / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(path) in err
    assert not (path.parent / "out").exists()


def test_a_series_file_that_is_a_link_is_refused(tmp_path, capsys):
    real = write_series(tmp_path / "real.json.gz", load_runs([make_sweep(tmp_path / "s")]))
    (tmp_path / "link.json.gz").symlink_to(real)
    refused(tmp_path / "link.json.gz", "must not be a link", capsys)


def test_a_gzip_bomb_is_refused_before_it_is_decompressed_past_the_limit(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(runs_module, "SERIES_MAX_BYTES", 100_000)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"format": "' + b"a" * 10_000_000 + b'"}'))
    assert bomb.stat().st_size < 100_000
    refused(bomb, "over 0.0953674 MiB once decompressed", capsys)


def test_a_series_file_too_big_on_disk_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runs_module, "SERIES_MAX_BYTES", 1000)
    big = tmp_path / "big.json.gz"
    big.write_bytes(os.urandom(2000))
    refused(big, "not a regular file of at most", capsys)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"format": "normlab-series"}', r"not a series file \(gzip: "),
        (gzip.compress(b"[1, 2")[:-4], r"not a series file \(gzip: "),
        (gzip.compress(b'{"format": '), r"Expecting value \(line 1\)"),
        (gzip.compress(b"\x80\x81"), "not UTF-8 JSON text"),
        (gzip.compress(b"[" * 100_000 + b"]" * 100_000), f"nested deeper than {SERIES_MAX_DEPTH}"),
        (gzip.compress(b'{"format": "other"}'), "not a series file .*format 'normlab-series'"),
        (gzip.compress(b'{"format": "normlab-series", "version": 2}'), "series version 2: this"),
    ],
    ids=["not-gzip", "truncated", "bad-json", "not-utf8", "deep-parse", "format", "version"],
)
def test_a_malformed_series_file_is_refused(tmp_path, data, match, capsys):
    (tmp_path / "bad.json.gz").write_bytes(data)
    refused(tmp_path / "bad.json.gz", match, capsys)


def deep(n: int) -> dict:
    node: dict = {"leaf": 1}
    for _ in range(n):
        node = {"k": node}
    return node


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d["runs"][0].update(config=deep(40)), f"nested deeper than {SERIES_MAX_DEPTH}"),
        (lambda d: d["runs"][0].update(name="../../evil"), r"run 0: name '../../evil' is not a"),
        (lambda d: d["runs"][1].update(name="/etc/x"), r"run 1: name '/etc/x' is not a relative"),
        (lambda d: d["runs"][0].update(name="a\\b"), r"name 'a\\\\b' is not a relative path"),
        (lambda d: d["runs"][0].update(name="a\x00b"), r"name 'a\\x00b' is not a relative path"),
        (lambda d: d["runs"][0].pop("metrics"), "run 0: 'metrics' missing or of the wrong type"),
        (lambda d: d["runs"][0].update(overrides=[1]), "run 0: an override that is not a string"),
        (lambda d: d["runs"][0]["metrics"].append(3), "a metrics or annealed row that is not"),
        (lambda d: d.update(runs={}), "'runs' must be a list"),
        (
            lambda d: d["runs"][0]["summary"].update(final_eval={"../x": {"loss": 1.0}}),
            r"run 0: held-out corpus name '../x' is not a plain name",
        ),
        (
            lambda d: d["runs"][0]["metrics"][0].update({"val/a b/loss": 1.0}),
            r"held-out corpus name 'a b' is not a plain name",
        ),
    ],
    ids=[
        "deep-config",
        "dotdot-name",
        "absolute-name",
        "backslash-name",
        "nul-name",
        "no-metrics",
        "override",
        "row",
        "runs",
        "corpus-final-eval",
        "corpus-metric",
    ],
)
def test_a_series_file_with_a_bad_run_is_refused(tmp_path, edit, match, capsys):
    doc = good_doc(tmp_path)
    edit(doc)
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    refused(path, match, capsys)


def test_run_names_with_a_slash_stay_names_and_never_become_paths(tmp_path):
    doc = good_doc(tmp_path)
    for i, r in enumerate(doc["runs"]):
        r["name"] = f"deep/er/{i}_{r['name']}"
    path = tmp_path / "slash.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert [r.name for r in load_runs([path])][0] == "0_layer-seed0"  # below the common folder
    doc["runs"][0]["name"] = "other/0_layer-seed0"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert load_runs([path])[0].name == "other/0_layer-seed0"
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out), "--margin", "0.05"]) == 0
    assert all(p.is_file() for p in out.iterdir())  # figures and report.md only: no folder
    assert not (tmp_path / "other").exists() and not (tmp_path / "deep").exists()


def test_a_run_dir_whose_corpus_name_would_name_a_file_elsewhere_is_refused(tmp_path):
    make_sweep(tmp_path)
    s = json.loads((tmp_path / "rms-seed0" / "summary.json").read_text())
    s["final_eval"] = {"../../x": {"loss": 3.0}}
    (tmp_path / "rms-seed0" / "summary.json").write_text(json.dumps(s))
    with pytest.raises(ReportError, match=r"rms-seed0: held-out corpus name '../../x' is not a"):
        load_runs([tmp_path])


def test_a_fifo_or_a_missing_path_is_neither_a_dir_nor_a_series_file(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo")
    for p in (tmp_path / "fifo", tmp_path / "missing.json.gz"):
        with pytest.raises(ReportError, match="not a directory nor a series file"):
            load_runs([p])


@pytest.mark.parametrize(
    ("option", "value"), [("sequential", "yes"), ("sequential", 1), ("margin", "0.01")]
)
def test_a_stored_option_of_the_wrong_type_is_refused(tmp_path, option, value, capsys):
    doc = good_doc(tmp_path)
    doc["options"] = {option: value}
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"its option {option} is {value!r}" in err
    assert not (tmp_path / "out").exists()
