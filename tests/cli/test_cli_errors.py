"""A new user's first hour through the real ``train`` CLI: a misspelled key or option is one line
naming the fix (exit 2) before torch is imported; ``--help`` says what every key means; resuming a
finished run changes nothing; ``threads`` sets torch's threads without touching the config hash;
``experiment=quickstart`` is a sweep base that gives curves at 200 steps."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from normlab.commands import train as cli
from normlab.commands.keys import help_text, schema_keys
from normlab.compose import compose_cli

from ..conftest import CONF_DIR, ONE_THREAD, TINY, run_cli

#: The real CLI; at exit it says on stderr whether torch was ever imported.
TORCH_PROBE = """
import atexit, sys
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
from normlab.commands.train import main
main()
"""


def cli_with(code: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_cli(args, cwd, code=code, env=ONE_THREAD)


RSM = (
    "norm=rsm: no option 'rsm' in group norm; did you mean norm=rms? "
    "(options: derf, dyt, gated, layer, rms)"
)
MISSPELLED = [
    (
        ["max_step=10"],
        "max_step=10: there is no key 'max_step' in the config; did you mean max_steps?",
    ),
    (
        ["+max_step=10"],
        "max_step=10: there is no key 'max_step' in the config; did you mean max_steps?",
    ),
    (["lr=1e-3"], "lr=1e-3: there is no key 'lr' in the config; did you mean optim.lr?"),
    (
        ["optim.lrr=1e-3"],
        "optim.lrr=1e-3: there is no key 'optim.lrr' in the config; did you mean optim.lr?",
    ),
    (
        ["norm=rsm"],
        RSM,
    ),
    (
        ["-m", "norm=layer,rsm", "seed=0,1"],
        RSM,
    ),
    (
        ["model=tinyy"],
        "model=tinyy: no option 'tinyy' in group model; did you mean model=tiny? "
        "(options: gpt2_small, ladder_10x640, ladder_2x32, ladder_2x48, ladder_3x64, ladder_3x96, "
        "ladder_4x128, ladder_4x256, ladder_6x384, ladder_8x512, small, tiny)",
    ),
    (
        ["norm.kind=rsm"],
        "norm.kind=rsm is not allowed (allowed: layer, rms, dyt, derf, gated); "
        "did you mean norm.kind=rms?",
    ),
    (  # --cfg prints the config: the same check first, the same one line
        ["--cfg", "job", "norm.epz=1"],
        "norm.epz=1: there is no key 'norm.epz' in the config; did you mean norm.eps?",
    ),
    (
        ["--cfg=job", "--resolve", "norm=rsm"],
        RSM,
    ),
    (
        ["max_steps=ten"],
        "max_steps=ten: Value 'ten' of type 'str' could not be converted to Integer: "
        "invalid literal for int() with base 10: 'ten'",
    ),
]


@pytest.mark.parametrize(("args", "line"), MISSPELLED, ids=[" ".join(a) for a, _ in MISSPELLED])
def test_a_misspelled_key_option_or_value_is_one_line_naming_the_fix_before_torch(
    tmp_path, args, line
):
    r = cli_with(TORCH_PROBE, args, tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"normlab: error: {line}", "torch imported: False"]
    assert not (tmp_path / "outputs").exists(), "nothing may be created for a refused command"


IN_TASK = [
    (
        "norm.eps=0",
        "norm.eps=0.0 is not allowed: must be a finite number > 0 (or null for the default 1e-5)",
    ),
    (
        "data.path=/nonexistent/corpus",
        "data.path='/nonexistent/corpus' does not exist: give an existing file or folder",
    ),
]


@pytest.mark.parametrize(("override", "reason"), IN_TASK, ids=[o for o, _ in IN_TASK])
def test_a_value_refused_inside_the_task_needs_no_torch_and_leaves_no_run_dir(
    tmp_path, override, reason
):
    r = cli_with(TORCH_PROBE, [*TINY, override, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"normlab: error: {reason}", "torch imported: False"]
    assert not (tmp_path / "run").exists(), "a run refused before training leaves no run dir"


def test_debug_true_shows_hydras_full_error(tmp_path):
    r = run_cli(["debug=true", "max_step=10"], tmp_path)
    assert r.returncode == 1  # Hydra's own exit status, with its own text
    assert "To append to your config use +max_step=10" in r.stderr
    assert "Key 'max_step' not in 'CliConfig'" in r.stderr


def test_help_lists_every_key_with_its_default_and_one_line_meaning(tmp_path):
    r = run_cli(["--help"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == help_text(CONF_DIR)
    lines = r.stdout.splitlines()
    # a name too long for its column stands alone; its default and meaning are on the next line
    listed = {
        line.split()[0]: line if len(line.split()) > 1 else f"{line}\n{lines[i + 1]}"
        for i, line in enumerate(lines)
        if line.startswith("  ")
    }
    keys = schema_keys(CONF_DIR)
    shared = {k.name for k in keys if sum(j.meaning == k.meaning for j in keys) > 2}
    assert {k.name for k in keys} - shared <= listed.keys()
    for k in keys:
        if k.meaning and k.name not in shared:
            assert listed[k.name].endswith(k.meaning), k.name
    # the columns line up: every meaning starts where the others do
    starts = {row.splitlines()[-1].rindex(k.meaning) for k in keys if (row := listed.get(k.name))}
    assert len(starts) == 1, starts
    # norm.positions.<position>.<key>: a line per key with its meaning, the positions listed once
    parts = [line.strip().split(": ", 1) for line in r.stdout.splitlines()]
    (positions,) = [w[1].split(", ") for w in parts if w[0] == "<position>"]
    fields = [n.split(".")[-1] for n in listed if n.startswith("norm.positions.<position>.")]
    assert {f"norm.positions.{p}.{k}" for p in positions for k in fields} == shared
    assert "this position's norm.kind" in listed["norm.positions.<position>.kind"]
    assert "evaluate every N optimizer steps" in listed["eval_interval"]  # conf/train.yaml
    assert "transformer blocks" in listed["model.n_layer"]  # conf/model/gpt2_small.yaml
    assert "null: $OMP_NUM_THREADS" in listed["threads"]  # config.py's comment
    norms = ["derf,", "dyt,", "gated,", "layer*,", "rms"]
    assert listed["norm"].split()[1:] == norms  # the default marked


#: Keys whose meaning is still missing in config.py and conf/ (a new key must come with one).
UNDOCUMENTED: set[str] = set()


def test_every_key_but_a_shrinking_known_list_has_a_meaning():
    assert {k.name for k in schema_keys(CONF_DIR) if not k.meaning} <= UNDOCUMENTED


def test_auto_threads_is_omp_num_threads_else_half_the_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cli.auto_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    for cores, want in [(1, 1), (2, 1), (3, 1), (8, 4), (16, 8)]:
        monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert cli.auto_threads() == want


def test_threads_is_validated_and_not_part_of_what_a_run_trains():
    assert compose_cli(["threads=2"]).threads == 2
    assert compose_cli(["threads=2"]).train_config() == compose_cli(["threads=1"]).train_config()
    with pytest.raises(
        ValueError, match=r"^threads=0 is not allowed: must be null \(auto\) or >= 1$"
    ):
        compose_cli(["threads=0"])


def test_quickstart_is_a_sweep_base_that_evaluates_several_times_in_200_steps():
    base = compose_cli(["experiment=quickstart", "max_steps=200"])
    assert base.model.name == "tiny" and base.optim.lr == 2e-3 and base.data.batch_size == 32
    assert base.max_steps // base.eval_interval >= 4


#: The real CLI; before training it writes torch's thread count to <run dir>/threads.txt.
THREADS_SPY = """
import torch
import normlab.training.loop as loop
train = loop.train
def spy(cfg, run_dir, opts=None, **kw):
    (run_dir / "threads.txt").write_text(str(torch.get_num_threads()))
    return train(cfg, run_dir, opts, **kw)
loop.train = spy
from normlab.commands.train import main
main()
"""


@pytest.mark.slow
def test_threads_sets_torchs_thread_count_and_leaves_the_config_hash_alone(tmp_path):
    hashes = []
    for n in (1, 2):
        run = tmp_path / f"threads{n}"
        r = cli_with(
            THREADS_SPY,
            [*TINY, "max_steps=2", f"threads={n}", f"hydra.run.dir={run}"],
            tmp_path,
        )
        assert r.returncode == 0, r.stderr
        assert (run / "threads.txt").read_text() == str(n)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["run_options"]["threads"] == n
        hashes.append(summary["config_hash"])
    assert hashes[0] == hashes[1]


def snapshot(run: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``run`` but ``train.log``: (mtime in ns, contents)."""
    return {
        str(p.relative_to(run)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != "train.log"
    }


@pytest.mark.slow
def test_resuming_a_completed_run_says_so_in_one_line_and_changes_nothing(tmp_path, train_main):
    run = tmp_path / "run"
    code, _, err = train_main([*TINY, "logger=wandb", f"hydra.run.dir={run}"], tmp_path)
    assert code == 0, err  # a wandb run dir
    before, log_before = snapshot(run), (run / "train.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and list(run.glob("wandb/offline-run-*"))
    for again in (
        [f"resume={run}"],
        [*TINY, "logger=wandb", f"hydra.run.dir={run}", "resume=auto"],
    ):
        code, _, err = train_main(again, tmp_path)
        assert code == 0, err
        assert err.splitlines() == [
            f"normlab: {run} already completed 6 of max_steps=6 steps "
            f"(final val loss {summary['final_val_loss']:.4f}): nothing to do, nothing changed"
        ]
        assert snapshot(run) == before, "no file may change: no new wandb run, the same summary"
        assert (run / "train.log").read_text().startswith(log_before)


def test_help_shows_declared_defaults_not_values_resolved_after_construction():
    keys = {k.name: k for k in schema_keys(CONF_DIR)}
    assert keys["norm.bias"].default is None  # null: the kind's default, not layer's True
