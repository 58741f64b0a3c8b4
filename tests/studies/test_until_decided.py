"""``normlab-study until-decided``: pairs in seed order until the anytime-valid verdict decides;
killed mid-pair it resumes that pair and counts no seed twice (a stand-in trainer,
``fake_train.py``, makes the kill cheap; one test drives the real ``train``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from normlab.commands.study import main as study_main
from normlab.config import ConfigError
from normlab.report.sequential import sequential_verdict
from normlab.studies.until_decided import STATE_FILE, Driver, DriverError, drive, run_dir
from normlab.training.lock import own_run_dir

from ..conftest import TINY
from . import fake_train

FAKE = [sys.executable, str(Path(fake_train.__file__))]
MARGIN = 0.01


def fake_driver(out: Path, **kw) -> Driver:
    args = {"margin": MARGIN, "max_pairs": 20, "jobs": 2, "train": FAKE} | kw
    return Driver(out=out, common=["x=1"], variants=[["norm=layer"], ["norm=rms"]], **args)


def expected() -> dict:
    diffs = [fake_train.loss(s, "rms") - fake_train.loss(s, "layer") for s in range(20)]
    return sequential_verdict(diffs, MARGIN)


def test_the_driver_stops_at_the_first_decisive_look_with_every_seed_once(tmp_path):
    state = drive(fake_driver(tmp_path / "out"), say=lambda _: None)
    want = expected()
    assert state["stopped_by"] == "decision" and state["verdict"]["decision"] == want["decision"]
    assert state["verdict"]["n"] == want["n"] == len(state["seeds"])
    assert state["seeds"] == list(range(want["n"]))
    assert not run_dir(tmp_path / "out", want["n"], "a").exists()  # no pair after the decision


def test_a_driver_killed_mid_pair_resumes_that_pair_and_counts_no_seed_twice(tmp_path):
    out = tmp_path / "out"
    root = str(Path(__file__).parents[2])
    code = (
        f"import sys; from pathlib import Path; sys.path.insert(0, {root!r})\n"
        "from tests.studies.test_until_decided import fake_driver\n"
        "from normlab.studies.until_decided import drive\n"
        f"drive(fake_driver(Path({str(out)!r})))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    mid = run_dir(out, 2, "b") / "progress"
    deadline = time.monotonic() + 120
    while not (mid.exists() and len(mid.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline and proc.poll() is None, "pair 2 never started"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)  # the pair's runs get SIGTERM from the kernel when the driver dies
    assert not (run_dir(out, 2, "b") / "summary.json").exists()
    state = drive(fake_driver(out), say=lambda _: None)
    want = expected()
    assert (state["verdict"]["decision"], state["verdict"]["n"]) == (want["decision"], want["n"])
    assert state["seeds"] == list(range(want["n"]))
    starts = (run_dir(out, 2, "b") / "starts").read_text().split()
    assert len(starts) == 2 and int(starts[1]) >= 3  # resumed where it was killed, not redone
    assert all(len((run_dir(out, s, "a") / "starts").read_text().split()) == 1 for s in (0, 1))


def test_a_second_driver_on_the_same_out_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with own_run_dir(out), pytest.raises(ConfigError, match="pid"):
        drive(fake_driver(out), say=lambda _: None)


def test_an_out_that_drove_another_margin_is_refused_by_name(tmp_path):
    out = tmp_path / "out"
    drive(fake_driver(out, max_pairs=2), say=lambda _: None)
    with pytest.raises(DriverError, match="margin=0.01, not 0.02"):
        drive(fake_driver(out, margin=0.02), say=lambda _: None)
    state = drive(fake_driver(out, max_pairs=3), say=lambda _: None)  # a larger budget: allowed
    assert state["seeds"] == [0, 1, 2]


def test_no_pair_starts_past_the_budget(tmp_path):
    state = drive(fake_driver(tmp_path / "out", budget_s=1e-9), say=lambda _: None)
    assert state["stopped_by"] == "budget" and "verdict" not in state


def test_a_failed_run_stops_the_driver_naming_it(tmp_path):
    out = tmp_path / "out"
    run_dir(out, 0, "a").mkdir(parents=True)
    (run_dir(out, 0, "a") / "summary.json").write_text(json.dumps({"status": "failed"}))
    with pytest.raises(DriverError, match=r"seed0_a: failed; the pair cannot be used"):
        drive(fake_driver(out), say=lambda _: None)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["seed=3", "--margin", "0.01"], "seed=3: the driver sets"),
        (["--margin", "0.01", "--b", "norm=rms seed=5"], "seed=5: the driver sets"),
        (["--margin", "0.01", "--jobs", "3"], "--jobs=3: must be 1 or 2"),
        (["--margin", "0"], "--margin=0.0"),
        (["--margin", "0.01", "--a", "norm=rms"], "the same"),
        (["--margin", "0.01", "--budget-hours", "-1"], "--budget-hours=-1.0"),
        (["--margin", "0.01", "model.n_layr=2"], "n_layr"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2_before_anything_trains(tmp_path, capsys, args, named):
    out = tmp_path / "out"
    assert study_main(["until-decided", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and not out.exists()


@pytest.mark.slow
def test_the_real_train_fills_a_sweep_dir_that_normlab_report_reads(tmp_path, capsys):
    from normlab.commands.report import main as report_main

    out = tmp_path / "out"
    fast = [o for o in TINY if not o.startswith(("max_steps", "eval_interval"))]
    fast += ["max_steps=8", "eval_interval=4", "optim.warmup_steps=1"]  # the study's wsd, shrunk
    argv = ["until-decided", *fast, "norm.impl=torch", "logger=none", "eval_data=[]"]
    assert study_main([*argv, "--margin", "0.5", "--max-pairs", "2", "--out", str(out)]) == 0
    state = json.loads((out / STATE_FILE).read_text())
    assert state["seeds"] == [0, 1] and state["stopped_by"] == "max_pairs"
    assert report_main([str(out), "--margin", "0.5", "--sequential", "--no-series"]) == 0
    printed = capsys.readouterr().out
    assert "norm=rms vs norm=layer: n=2" in printed and "sequential, norm=rms" in printed
