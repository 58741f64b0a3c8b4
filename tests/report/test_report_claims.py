"""A report states only what is so: the best-design rule (the seeds that did not complete named in
the same sentence, no best design over a baseline with no completed run nor by a lead inside the
margin), confound warnings that leave out variants with no included run and say so, and a report
over an unfinished sweep that names its jobs that never started or did not finish and prints the
command that continues it.

Sweeps are synthetic (``write_run`` of ``test_report``); a sweep's record is a ``multirun.yaml``
holding what Hydra writes of its jobs (``hydra.sweeper.params``, ``hydra.overrides``).
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pytest
import yaml

from normlab.commands.overrides import expand, value_of
from normlab.commands.report import main
from normlab.report import ReportError, build_report, render_markdown
from normlab.report.family import best_design
from normlab.report.runs import override_key
from normlab.report.unfinished import MAX_SWEEP_JOBS, job_value, sweep_record

from .test_report import LAYER, t2_cdf, three_variants, write_run

LEADER, RUNNER = "norm=rms", "norm.eps=1e-3,norm=rms"
#: Per-seed offsets from the baseline: the leader (``norm=rms``) tested ahead of the runner-up.
AHEAD, BEHIND = {0: -0.10, 1: -0.11, 2: -0.12}, {0: -0.01, 1: -0.03, 2: -0.02}


def family(root: Path, rms: dict, rmsb: dict, layer: dict = LAYER, status: str = "completed"):
    """``norm=layer`` (``layer``: seed -> final loss; every run of status ``status``) and two
    RMSNorm variants: per seed, the baseline's loss plus an offset, or a status (``"diverged"``)."""
    for seed, loss in layer.items():
        write_run(root, "layer", seed, loss if status == "completed" else None, status=status)
    for seed, off in rms.items():
        if isinstance(off, str):
            write_run(root, "rms", seed, None, status=off)
        else:
            write_run(root, "rms", seed, layer[seed] + off)
    for seed, off in rmsb.items():
        write_run(
            root,
            "rms",
            seed,
            layer[seed] + off,
            name=f"rmsb-seed{seed}",
            edits={"norm.eps": 1e-3},
            overrides=["norm=rms", "norm.eps=1e-3", f"seed={seed}", "model=tiny"],
        )
    return root


def best_line(md: str) -> str:
    """The report's sentence on a best design."""
    starts = ("**Best design", "**No best design", "**No variant is shown best")
    return next(ln for ln in md.splitlines() if ln.startswith(starts))


# --- the best-design rule ------------------------------------------------------------------------


def test_a_best_design_names_the_seeds_the_leader_and_runner_up_did_not_complete(tmp_path):
    """The leader's lead is tested (as in test_report's named-best case) over seeds 0-2, but its
    seed 3 diverged and the runner-up has no seed 3: the sentence that names it says so."""
    family(tmp_path, {**AHEAD, 3: "diverged"}, BEHIND, layer={**LAYER, 3: 3.02})
    rep = build_report(tmp_path)
    left = [f"`{LEADER}` seed 3: diverged at step 7", f"`{RUNNER}` seed 3: no run"]
    line = best_line(render_markdown(rep))
    assert line.startswith(f"**Best design: `{LEADER}`**, ahead of the runner-up (")
    assert line.endswith(f", over the seeds that completed (left out: {'; '.join(left)}).")
    b = best_design(rep)
    assert (b["leader"], b["runner_up"], b["shown"]) == (LEADER, RUNNER, True)
    assert b["exclusions"] == left


def test_a_best_design_over_seeds_that_all_completed_names_no_exclusion(tmp_path):
    three_variants(tmp_path, (-0.10, -0.11, -0.12), (-0.01, -0.03, -0.02))
    rep = build_report(tmp_path)
    line = best_line(render_markdown(rep))
    assert line.startswith("**Best design:") and "left out" not in line
    assert best_design(rep)["exclusions"] == []


def test_no_best_design_when_every_baseline_run_failed(tmp_path, capsys):
    """Every ``norm=layer`` run failed: the two RMSNorm variants' test between them would name
    a leader, but nothing is measured against the baseline, so the report names none and says
    why in one line."""
    family(tmp_path, AHEAD, BEHIND, status="failed")
    rep = build_report(tmp_path)
    md = render_markdown(rep)
    assert "Best design: `" not in md
    assert best_line(md).startswith(
        "**No best design:** the baseline `norm=layer` has no completed run (3 excluded, see "
        "Excluded runs): no variant is measured against it ("
    )
    b = best_design(rep)
    assert b["detectable"] and not b["shown"]
    assert main([str(tmp_path)]) == 0
    assert "No best design: the baseline `norm=layer`" in capsys.readouterr().out


def test_confound_warnings_leave_out_a_variant_with_no_included_run_and_name_it(tmp_path):
    """With every baseline run failed, the baseline has no resolved precision, compile or
    implementation: it differs from nothing, and one warning names it as left out."""
    family(tmp_path, AHEAD, BEHIND, status="failed")
    rep = build_report(tmp_path)
    assert not [w for w in rep.confounds if "the variants differ in" in w], rep.confounds
    (left,) = [w for w in rep.confounds if "leave out" in w]
    assert left == (
        "the checks that the variants agree in norm implementation, compile, precision leave out "
        "`norm=layer`: no included run (see Excluded runs), so no value to compare"
    )


def test_a_lead_inside_the_margin_is_no_best_design(tmp_path):
    """The leader is ahead by [0.0003, 0.0004, 0.0005] nats: detectable (t = 0.0004 / (0.0001 /
    sqrt 3), p = 0.0202; Holm over the family leaves it the largest, 0.0202 < 0.05), but the
    report calls a difference within ±0.02 equivalent: no best design, in one line saying so. At a
    margin of 0.0002 the same lead is one."""
    three_variants(tmp_path, (-0.10, -0.11, -0.12), (-0.0997, -0.1096, -0.1195))
    rep = build_report(tmp_path)
    assert best_line(render_markdown(rep)).startswith(
        f"**No best design:** the lead of `{LEADER}` over `{RUNNER}`, +0.0004 nats/token, is "
        "inside the study's margin ±0.02 (TOST: equivalent), within which the report calls "
        "variants equivalent ("
    )
    b = best_design(rep)
    assert (b["leader"], b["mean"], b["equivalent"]) == (LEADER, pytest.approx(4e-4), True)
    p = 2 * (1 - t2_cdf(4e-4 / (1e-4 / math.sqrt(3))))
    assert b["p"] == pytest.approx(p, rel=1e-6) and b["p_holm"] == pytest.approx(p, rel=1e-6)
    assert p == pytest.approx(0.0202, abs=1e-4) and b["detectable"] and not b["shown"]
    narrow = best_design(build_report(tmp_path, margin=2e-4))
    assert narrow["shown"] and narrow["withheld"] is None


# --- an unfinished sweep -------------------------------------------------------------------------


def write_record(sweep: Path, task: list[str], params: dict | None = None) -> Path:
    """``sweep/multirun.yaml`` as Hydra writes it when the sweep starts (the parts read here)."""
    sweep.mkdir(parents=True, exist_ok=True)
    hydra = {
        "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"},
        "sweeper": {"params": params or {}},
        "overrides": {"hydra": [f"hydra.sweep.dir={sweep}"], "task": task},
    }
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra, "seed": 0}))
    return sweep


def test_an_unfinished_sweep_names_its_jobs_and_the_command_that_continues_it(tmp_path, capsys):
    """A sweep of 6 jobs (norm from the experiment's sweeper params, seeds from the command
    line) killed in job 2: jobs 0-1 completed, job 2 has no summary.json, jobs 3-5 never
    started."""
    sweep = write_record(tmp_path / "sweep", ["model=tiny", "seed=0,1,2"], {"norm": "layer,rms"})
    write_run(sweep, "layer", 0, 3.0)
    write_run(sweep, "layer", 1, 3.1)
    write_run(sweep, "layer", 2, None, summary=False)
    rep = build_report(sweep)
    (u,) = rep.unfinished
    assert u["jobs"] == 6
    assert u["unfinished"] == [(2, "norm=layer seed=2", "no summary.json")]
    assert [j[:2] for j in u["never_started"]] == [
        (3, "norm=rms seed=0"),
        (4, "norm=rms seed=1"),
        (5, "norm=rms seed=2"),
    ]
    command = f"train -m model=tiny seed=0,1,2 hydra.sweep.dir={sweep.resolve()} resume=auto"
    assert u["command"] == command
    md = render_markdown(rep)
    assert (
        f"## Unfinished sweep: `{sweep}`\n\nIts `multirun.yaml` lists 6 jobs (numbered from 0, "
        "as its job dirs), 2 ended; 1 did not finish: job 2 (`norm=layer seed=2`: no "
        "summary.json); 3 never started: job 3 (`norm=rms seed=0`), job 4 (`norm=rms seed=1`), "
        "job 5 (`norm=rms seed=2`). This report holds only the runs that ended."
    ) in md
    assert f"\n```\n{command}\n```\n" in md
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert f"warning: unfinished sweep {sweep}: its multirun.yaml lists 6 jobs" in out
    assert f"; continue it with: {command}\n" in out


def test_a_sweep_whose_jobs_all_ended_is_not_unfinished(tmp_path):
    """Every job of the record has a run dir that ended (one diverged): nothing to continue."""
    sweep = write_record(tmp_path / "sweep", ["norm=layer,rms", "seed=0,1", "model=tiny"])
    for seed in (0, 1):
        write_run(sweep, "layer", seed, 3.0 + seed / 10)
    write_run(sweep, "rms", 0, 3.01)
    write_run(sweep, "rms", 1, None, status="diverged")
    rep = build_report(sweep)
    assert rep.unfinished == [] and "Unfinished sweep" not in render_markdown(rep)


def test_the_job_list_is_hydras_basic_sweeper_order(tmp_path):
    """Params first, the command line after, a key given again keeping its slot, the last
    varying fastest: the jobs equal ``commands.overrides.expand`` (Hydra's own parser) over the same
    overrides, value for value."""
    params = {"norm": "layer,rms", "seed": "0,1"}
    task = ["model=tiny", "seed=range(0,3)", "optim.lr=choice(1e-3,3e-3)", "eval_data=[a,b]"]
    task += ["+data.tag='x,y'"]
    record = sweep_record(write_record(tmp_path / "sweep", task, params))
    oracle = expand([f"{k}={v}" for k, v in params.items()] + task)

    def canonical(jobs):
        return [[(override_key(o), job_value(o)) for o in job] for job in jobs]

    assert len(record["jobs"]) == 2 * 3 * 2 == len(oracle)
    assert canonical(record["jobs"]) == canonical(oracle)
    assert record["swept"] == ["norm", "seed", "optim.lr"]


def test_a_record_of_more_jobs_than_the_limit_is_not_expanded(tmp_path):
    sweep = write_record(tmp_path / "sweep", [f"seed=range(0,{10**12})"])
    assert sweep_record(sweep) is None
    write_record(sweep, ["seed=range(0,200)", "optim.lr=range(0,100)"])
    assert 200 * 100 > MAX_SWEEP_JOBS and sweep_record(sweep) is None


def test_a_record_with_a_yaml_alias_is_refused_in_one_line(tmp_path):
    sweep = write_record(tmp_path / "sweep", ["seed=0,1"])
    write_run(sweep, "layer", 0, 3.0)
    (sweep / "multirun.yaml").write_text("a: &a [x]\nhydra: {overrides: {task: *a}}\n")
    with pytest.raises(ReportError, match=r"multirun.yaml: a YAML anchor or alias at line 1"):
        build_report(sweep)


def test_the_continue_command_survives_the_shell_and_hydras_grammar(tmp_path):
    """A sweep dir with a space, a comma and a quote in its name: the shell gives ``train`` the
    words, and Hydra's grammar reads the dir back; overrides naming code are left out."""
    task = ["seed=0,1", "hydra.callbacks.x._target_=os.system"]
    sweep = write_record(tmp_path / "my sweep, it's", task)
    write_run(sweep, "layer", 0, 3.0)
    (u,) = build_report(sweep).unfinished
    words = shlex.split(u["command"])
    assert words[:3] == ["train", "-m", "seed=0,1"] and words[-1] == "resume=auto"
    assert value_of(words, "hydra.sweep.dir") == str(sweep.resolve())
    assert u["left_out"] == ["hydra.callbacks.x._target_=os.system"]
    assert "_target_" not in u["command"]
