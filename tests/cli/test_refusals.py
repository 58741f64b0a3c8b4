"""Refusals that must come first and leave nothing behind (issue 23): every sweep value range-
checked before job 0, a GPU or Hub recipe refused on a machine that lacks it, resume that replays
only the schema's keys, a refused relaunch that changes nothing on disk, and the smaller ones:
the reason for an output dir that cannot be made, one line per refusal, a help without repeats,
the result line last, and ``normlab-sample``'s thread count."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml

from normlab.commands import overrides as cli_overrides
from normlab.commands import sample
from normlab.commands.keys import help_text, unknown_option
from normlab.commands.overrides import (
    check_output_dir,
    check_overrides,
    prepare_args,
)
from normlab.commands.train import auto_threads
from normlab.config import ConfigError

from ..conftest import CONF_DIR, ONE_THREAD, TINY, run_cli

FAST = [*TINY, "max_steps=2", "eval_interval=2", "eval_batches=1", "norm.impl=torch"]


def test_every_sweep_value_is_range_checked_before_job_0():
    with pytest.raises(ConfigError, match=r"^norm\.eps=0\.0 is not allowed: must be a finite"):
        check_overrides(["-m", *TINY, "norm.eps=1e-5,0"], CONF_DIR)
    with pytest.raises(ConfigError, match=r"^optim\.lr=-1\.0 is not allowed"):
        check_overrides(["-m", *TINY, "norm=layer,rms", "optim.lr=1e-3,2e-3,-1"], CONF_DIR)
    check_overrides(["-m", *TINY, "norm.eps=1e-5,1e-6"], CONF_DIR)  # every value in range


def test_a_gpu_recipe_on_a_machine_without_one_is_one_line_before_any_job(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^device=cuda needs a CUDA GPU and this machine has"):
        check_overrides(["experiment=loss_parity_1h"], CONF_DIR)
    with pytest.raises(ConfigError, match=r"^device=cuda needs a CUDA GPU"):
        check_overrides(["-m", *TINY, "device=cpu,cuda"], CONF_DIR)


#: Every experiment file that sets ``device: cuda``: a GPU recipe.
GPU_RECIPES = sorted(
    p.stem
    for p in (CONF_DIR / "experiment").glob("*.yaml")
    if str((yaml.safe_load(p.read_text()) or {}).get("device")).startswith("cuda")
)


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_a_gpu_recipe_refused_here_names_its_cpu_study(monkeypatch, name):
    assert {"loss_parity", "loss_parity_1h", "ladder_gpu", "eps_sweep_gpu"} <= set(GPU_RECIPES)
    twin = cli_overrides.cpu_twin(name, CONF_DIR)
    assert twin is not None and twin not in GPU_RECIPES
    assert (CONF_DIR / "experiment" / f"{twin}.yaml").is_file()

    def no_torch_needed():
        raise AssertionError("a CPU build of torch is known from its version: no import")

    # a CPU wheel of torch (2.13.0+cpu) cannot have CUDA: refused without asking torch
    monkeypatch.setattr(cli_overrides, "torch_without_cuda", lambda: "2.13.0+cpu")
    monkeypatch.setattr(torch.cuda, "is_available", no_torch_needed)
    with pytest.raises(ConfigError) as e:
        check_overrides([f"experiment={name}"], CONF_DIR)
    assert str(e.value) == (
        "device=cuda needs a CUDA GPU and this machine has none (torch 2.13.0+cpu, CUDA not "
        f"built in): run it on a GPU machine, or run its CPU study here: experiment={twin}"
    )


def test_gpu_recipes_pair_with_the_cpu_studies_of_their_question():
    twins = {name: cli_overrides.cpu_twin(name, CONF_DIR) for name in GPU_RECIPES}
    assert twins["loss_parity"] == twins["loss_parity_1h"] == "loss_parity_cpu"
    assert twins["ladder_gpu"] == "ladder_cpu" and twins["eps_sweep_gpu"] == "eps_sweep"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_recipe_is_refused_before_torch_is_imported_with_a_cpu_build(tmp_path):
    from .test_cli_errors import TORCH_PROBE, cli_with

    r = cli_with(TORCH_PROBE, ["experiment=loss_parity"], tmp_path)
    assert r.returncode == 2
    line, probe = r.stderr.splitlines()
    assert line.endswith("or run its CPU study here: experiment=loss_parity_cpu")
    if cli_overrides.torch_without_cuda():  # a CUDA build must ask torch whether a GPU is here
        assert probe == "torch imported: False"


def test_cfg_job_prints_a_gpu_recipe_on_a_machine_without_one(monkeypatch, tmp_path, train_main):
    monkeypatch.setattr(cli_overrides, "torch_without_cuda", lambda: "2.13.0+cpu")
    code, out, err = train_main(["--cfg", "job", "experiment=loss_parity"], tmp_path)
    assert code == 0 and err == "" and "device: cuda" in out


def test_a_hub_corpus_without_its_tokens_while_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = [*TINY, "data=fineweb_edu", f"data.cache_dir={tmp_path}"]
    with pytest.raises(ConfigError) as e:
        check_overrides(args, CONF_DIR)
    line = str(e.value)
    assert (
        line.startswith("data=fineweb_edu is read from the Hugging Face Hub") and "\n" not in line
    )
    assert "HF_HUB_OFFLINE=1 is set" in line and str(tmp_path) in line


def test_resume_replays_only_keys_of_the_schema(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    recorded = [
        "model=tiny",
        "optim.lr=0.001",
        "+hydra.callbacks.evil._target_=os.system",
        "hydra.job.chdir=true",
        "hydra/launcher=submitit_local",
        "+norm.sneaky._target_=builtins.exec",
        "resume=auto",
    ]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(recorded))
    args = prepare_args([f"resume={run}"], CONF_DIR)
    assert args[:2] == ["model=tiny", "optim.lr=0.001"]
    assert not [a for a in args if "_target_" in a or a.startswith(("hydra/", "hydra.job"))]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not replayed" in err and "evil._target_" in err


def test_resume_reads_the_run_dirs_overrides_within_limits(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    bomb = "- &a [x, x, x, x, x, x, x, x, x]\n- &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    (run / ".hydra" / "overrides.yaml").write_text(bomb)
    with pytest.raises(ConfigError) as e:
        prepare_args([f"resume={run}"], CONF_DIR)
    assert str(e.value) == (
        f"resume={run}: cannot read {run / '.hydra' / 'overrides.yaml'}: a YAML anchor or alias "
        "at line 1 (normlab writes none)"
    )


#: Every bool key of the schema, read from its dataclasses: a new one is covered with no edit.
BOOL_KEYS = [k for k, t in cli_overrides.leaf_types().items() if t in ((bool,), (bool, type(None)))]


@pytest.mark.parametrize("key", BOOL_KEYS)
def test_a_bool_key_takes_true_or_false_only_before_hydra(key):
    assert len(BOOL_KEYS) > 20 and "norm.depth_scale" in BOOL_KEYS and "compile" in BOOL_KEYS
    for value in ("2", "0", "yes", "'on'"):
        with pytest.raises(ConfigError, match=rf"^{key}={value.strip(chr(39))} is not allowed: "):
            check_overrides([*TINY, f"{key}={value}"], CONF_DIR)


def test_depth_scale_2_is_one_line_exit_2_before_anything_runs(tmp_path, train_main):
    code, out, err = train_main([*TINY, "norm.depth_scale=2"], tmp_path)
    assert code == 2 and out == ""
    assert err == "normlab: error: norm.depth_scale=2 is not allowed: true or false\n"
    assert not (tmp_path / "outputs").exists()


HUGE = [
    ("norm.gate_rank=1000000000000", ["norm=gated"], "norm.gate_rank=1000000000000, model.d_"),
    ("model.d_model=100000000", ["model.n_head=1"], "model.n_layer=2, model.d_model=100000000"),
    ("model.n_layer=1000000000000", [], "model.n_layer=1000000000000, model.d_model=128"),
    ("model.context_length=1000000000000", [], "data.batch_size=4, model.context_length=1000000"),
    ("model.vocab_size=1000000000000", [], "model.vocab_size=1000000000000, model.d_model="),
    ("data.batch_size=1000000000000", [], "data.batch_size=1000000000000, model.context_"),
    ("max_steps=1000000000000", [], "max_steps=1000000000000, eval_batches=2"),
    ("eval_batches=1000000000000", [], "max_steps=6, eval_batches=1000000000000"),
]


@pytest.mark.parametrize(("override", "with_", "named"), HUGE, ids=[h[0] for h in HUGE])
def test_a_size_beyond_this_machines_memory_is_one_line_naming_the_rule(override, with_, named):
    with pytest.raises(ConfigError) as e:
        check_overrides([*TINY, *with_, override], CONF_DIR)
    line = str(e.value)
    assert line.startswith(f"{named}") and "\n" not in line
    assert "more than this machine's physical memory" in line and cli_overrides.MEMORY_RULE in line


def test_an_int_beyond_64_bits_is_refused_before_hydra():
    with pytest.raises(ConfigError, match=r"^optim\.grad_accum=100000000000000000000 is not"):
        check_overrides([*TINY, "optim.grad_accum=100000000000000000000"], CONF_DIR)


def test_an_output_dir_that_cannot_be_made_says_why():
    if cli_overrides.filesystem_type(Path("/proc")) != "proc":
        pytest.skip("no proc filesystem at /proc here")
    with pytest.raises(ConfigError) as e:
        check_output_dir("hydra.run.dir", "/proc/x")
    assert str(e.value) == (
        "hydra.run.dir=/proc/x cannot be created: /proc accepts no new files (a proc filesystem)"
    )


def test_an_unknown_option_with_nothing_close_has_no_stray_separator():
    line = unknown_option("model", "huge", ["gpt2_small", "small", "tiny"])
    assert line == "model=huge: no option 'huge' in group model (options: gpt2_small, small, tiny)"


def test_help_says_each_meaning_once():
    lines = [line.strip() for line in help_text(CONF_DIR).splitlines() if line.strip()]
    at = [i for i, line in enumerate(lines) if line.startswith("norm.positions")]
    assert {lines[i].split(".")[2] for i in at} == {"<position>"}  # one per key, not per position
    meanings = [lines[i + 1].split(None, 1)[-1] for i in at]  # a long name stands alone
    assert len(meanings) == len(set(meanings)) and "this position's norm.kind" in meanings[0]
    assert sum(line.startswith("<position>:") for line in lines) == 1  # the positions, once
    sentences = [s for line in lines for s in line.split(". ") if len(s) > 40]
    assert max(sentences.count(s) for s in sentences) == 1


def test_normlab_sample_sets_the_thread_count_as_train_does(tmp_path, monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    try:
        with pytest.raises(SystemExit) as e:
            sample.main([str(tmp_path / "no_run")])
        assert e.value.code == 2
        assert torch.get_num_threads() == auto_threads() == 2
        with pytest.raises(SystemExit):
            sample.main([str(tmp_path / "no_run"), "--threads", "1"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_a_refused_relaunch_into_a_sweep_dir_changes_nothing_on_disk(tmp_path, train_main):
    sweep = tmp_path / "sweep"
    code, _, err = train_main(["-m", *FAST, "seed=0", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert code == 0, err
    before = _tree(sweep)
    for again in (["optim.lr=1e-3"], ["optim.lr=1e-3", "max_steps=3", "resume=auto"]):
        args = ["-m", *FAST, "seed=0", *again, f"hydra.sweep.dir={sweep}"]
        code, _, err = train_main(args, tmp_path)
        assert code == 1 and "1 of 1 runs did not complete" in err, err
        assert _tree(sweep) == before, f"{again}: a refused relaunch changed files"
    (job,) = [p for p in sweep.iterdir() if p.is_dir()]
    assert "optim.lr" not in (job / ".hydra" / "overrides.yaml").read_text()


@pytest.mark.slow
def test_the_result_line_is_the_last_thing_train_prints(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_SILENT", raising=False)  # the suite's conftest silences wandb
    r = run_cli([*FAST, "logger=wandb", "logger.mode=offline"], tmp_path, env=ONE_THREAD)
    assert r.returncode == 0, r.stderr
    assert "Run summary" not in r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("normlab: completed 2 steps: final val loss"), last
    run_dir = Path(last.rsplit("; ", 1)[1]).parent
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_a_sweep_jobs_dir_names_the_implementation_that_runs_and_every_swept_value(
    monkeypatch,
):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from normlab.commands import train

    monkeypatch.setenv(train.SWEPT_ENV, "optim.lr,norm.eps,seed,model")
    overrides = ["optim.lr=0.001", "norm.eps=1e-05", "seed=1", "model=tiny", "device=cpu"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.job.num = 3
        cfg.hydra.mode = RunMode.MULTIRUN
    previous = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        name = OmegaConf.select(cfg, "hydra.sweep.subdir")
    finally:
        HydraConfig.instance().cfg = previous
    assert name == "3_layer-cpp-pre-fp32-seed1-lr0.001-eps1e-05-tiny"
